"""DFlash: k within the block, taps, its context cache equals a recompute, the z-lab format round-trips.

Losslessness with random weights: test_lossless_tiny.py; the shipped drafter: test_shipped.py.
"""

import json

import pytest
import torch
from transformers import Qwen3Config

import specdec_learn as sd
from conftest import tiny_target
from specdec_learn.drafters.dflash import (
    DFlashDrafter,
    DFlashModel,
    default_target_layer_ids,
    draft_config,
    load_dflash,
    save_dflash,
)
from specdec_learn.formats.zlab import read_dflash
from specdec_learn.target import DecodeState


def test_k_beyond_the_block_is_refused_naming_the_block_size(target):
    torch.manual_seed(0)
    drafter = DFlashDrafter(DFlashModel(draft_config(target, num_layers=1, block_size=8)))
    assert drafter.max_k == 7
    with pytest.raises(ValueError, match="block size 8"):
        sd.generate(target, "Hi", drafter, k=8, max_new_tokens=4)


def test_taps_are_the_outputs_of_the_listed_layers(target):
    cfg = draft_config(target, num_taps=3)
    assert cfg.target_layer_ids == default_target_layer_ids(30, 3) == [1, 14, 27]
    assert DFlashDrafter(DFlashModel(cfg)).taps == (2, 15, 28)  # output of layer i = tap i + 1


def test_cached_context_equals_a_full_recompute():
    """After a few rounds, the incrementally built context K/V give the same block as a fresh forward."""
    target = tiny_target(layers=4)
    torch.manual_seed(0)
    drafter = DFlashDrafter(DFlashModel(draft_config(target, num_layers=2, block_size=16, target_layer_ids=[0, 1, 2])))
    out = sd.generate(target, [5, 9, 14, 3, 27, 8, 5, 9, 14, 3], drafter, k=3, max_new_tokens=12)
    ids = out.prompt_ids + out.tokens
    assert len(out.tokens) == 12  # no EOS: the drafter's state covers exactly `ids`
    state = DecodeState(ids=ids, prompt_len=len(out.prompt_ids), cache=None)
    incremental = drafter.block_hidden(state)  # [B, H]

    model = drafter.model
    _, ref = target.prefill(ids, drafter.taps)  # taps for ids[:-1], one forward
    with torch.inference_mode():
        taps = torch.cat([ref.hidden[t] for t in drafter.taps], dim=-1)
        p = len(ids) - 1
        block = torch.full((model.block_size,), drafter.mask_token_id)
        block[0] = ids[-1]
        fresh = model(target.embed_tokens(block), torch.arange(p, p + model.block_size),
                      model.context_kv(taps, torch.arange(p)))
    torch.testing.assert_close(incremental, fresh, atol=2e-4, rtol=1e-4)


# -- the z-lab format ---------------------------------------------------------


def tiny_dflash(block_size=4, layer_types=None) -> DFlashModel:
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256, layer_types=layer_types,
                      sliding_window=3 if layer_types else None, use_sliding_window=bool(layer_types))
    cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.num_target_layers = block_size, 5, [0, 2], 4
    torch.manual_seed(1)
    model = DFlashModel(cfg, target_hidden_size=24)
    for p in model.parameters():  # norms start at 1: perturb them so a mix-up would show
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def run_block(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    T, B = 6, model.block_size
    taps = torch.randn(T, 48, generator=g)
    x = torch.randn(B, 32, generator=g)
    with torch.no_grad():
        return model(x, torch.arange(T, T + B), model.context_kv(taps, torch.arange(T)), torch.arange(T))


@pytest.mark.parametrize("layer_types", [None, ["full_attention", "sliding_attention"]])
def test_zlab_format_round_trip(tmp_path, layer_types):
    model = tiny_dflash(layer_types=layer_types)
    save_dflash(model, tmp_path, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["mask_token_id"] == 5
    loaded = load_dflash(tmp_path)
    assert loaded.block_size == 4 and loaded.config.target_layer_ids == [0, 2]
    assert set(loaded.state_dict()) == set(model.state_dict())
    torch.testing.assert_close(run_block(loaded), run_block(model))


def test_sliding_window_layers_are_causal_and_windowed_as_vllm_serves_them():
    """vLLM (model_executor/models/qwen3_dflash.py, _resolve_layer_attention) and SGLang run a DFlash
    sliding_attention layer causal with a window counted from each query's position; z-lab's model.py
    hands the window to the kernel, which SDPA ignores. Here: slot j never sees slots > j, nor context
    positions j + p - 3 or older (window 3), in the sliding layer; the full layer sees everything."""
    swa = tiny_dflash(layer_types=["sliding_attention", "sliding_attention"])
    assert [(a.self_attn.window, a.self_attn.causal) for a in swa.layers] == [(3, True), (3, True)]
    g = torch.Generator().manual_seed(0)
    T, B = 6, swa.block_size
    taps, x = torch.randn(T, 48, generator=g), torch.randn(B, 32, generator=g)

    def run(taps, x):
        with torch.no_grad():
            return swa(x, torch.arange(T, T + B), swa.context_kv(taps, torch.arange(T)), torch.arange(T))

    base = run(taps, x)
    later = x.clone()
    later[2:] += 1.0  # change slots 2.. : slots 0, 1 must not notice (causal)
    torch.testing.assert_close(run(taps, later)[:2], base[:2])
    assert not torch.allclose(run(taps, later)[2:], base[2:])
    old = taps.clone()
    old[:T - 2] += 1.0  # context older than the window of every slot (each sees positions > q - 3 only; two
    # layers deep, slot 0 at position 6 reaches back to 6 - 2 * 2 = 2 at most: positions 0, 1 unseen)
    old[2:] = taps[2:]
    torch.testing.assert_close(run(old, x), base)
    full = tiny_dflash()
    assert not full.layers[1].self_attn.causal and full.layers[1].self_attn.window is None
    assert not torch.allclose(run_block(full), run_block(tiny_dflash(layer_types=["full_attention", "sliding_attention"])))


def test_layer_attention_config_keys_are_honoured_or_refused(tmp_path):
    """The keys vLLM's DFlash reads (qwen3_dflash.py) are honoured (is_causal, dflash_config.causal / use_swa /
    swa_window_size) or refused (sink bias, value scale, interleaved RoPE, reduced vocabulary); a sliding
    layer without a window and an unknown layer type are refused, as vLLM refuses them."""
    model = tiny_dflash()
    save_dflash(model, tmp_path, dtype=torch.float32)
    base = json.loads((tmp_path / "config.json").read_text())

    def load_with(**changes):
        cfg = json.loads(json.dumps(base))
        for key, value in changes.items():
            if key.startswith("sub_"):
                cfg["dflash_config"][key[4:]] = value
            else:
                cfg[key] = value
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        return load_dflash(tmp_path)

    def modes(m):
        return [(layer.self_attn.window, layer.self_attn.causal) for layer in m.layers]

    assert modes(load_with()) == [(None, False), (None, False)]
    assert modes(load_with(sub_use_swa=True, sub_swa_window_size=5)) == [(5, False), (5, False)]
    assert modes(load_with(is_causal=True)) == [(None, True), (None, True)]
    swa = dict(layer_types=["full_attention", "sliding_attention"], use_sliding_window=True, sliding_window=4)
    assert modes(load_with(**swa)) == [(None, False), (4, True)]
    assert modes(load_with(**swa, sub_causal=False)) == [(None, False), (4, False)]
    reloaded = load_with(**swa, sub_causal=False)
    save_dflash(reloaded, tmp_path / "again", dtype=torch.float32)
    assert modes(load_dflash(tmp_path / "again")) == [(None, False), (4, False)]  # the override is written back
    for changes, message in [
        (dict(layer_types=["full_attention", "sliding_attention"], sliding_window=4), "no window"),
        (dict(layer_types=["full_attention", "chunked_attention"]), "not implemented"),
        (dict(sub_attention_sink_bias=True), "sink bias"),
        (dict(sub_attention_value_scale=0.5), "attention_value_scale"),
        (dict(is_neox_style=False), "interleaved"),
        (dict(draft_vocab_size=32), "reduced draft_vocab_size"),
        (dict(sub_sample_from_anchor=True), "DSpark"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_with(**changes)


def test_missing_target_layer_ids_fall_back_to_zlab_default(tmp_path):
    """z-lab/dflash dflash/model.py: DFlashDraftModel takes dflash_config.get("target_layer_ids",
    build_target_layer_ids(num_target_layers, num_hidden_layers)); run on (36, 5), (28, 1) and (30, 3) it
    gives the lists below. Without num_target_layers there is nothing to fall back on: refused."""
    model = tiny_dflash()
    save_dflash(model, tmp_path, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    for target_layers, draft_layers, zlab in [(36, 5, [1, 9, 17, 25, 33]), (28, 1, [14]), (30, 3, [1, 14, 27])]:
        (tmp_path / "config.json").write_text(json.dumps({
            **cfg, "num_target_layers": target_layers, "num_hidden_layers": draft_layers,
            "layer_types": ["full_attention"] * draft_layers}))
        assert read_dflash(tmp_path)[0].target_layer_ids == zlab
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_target_layers": None}))
    with pytest.raises(ValueError, match="num_target_layers"):
        load_dflash(tmp_path)


def test_a_tap_on_the_last_layer_reads_the_final_normed_state():
    """z-lab/dflash dflash/model.py (extract_context_feature) reads hidden_states[layer_id + 1] of HF's
    output_hidden_states, whose LAST entry transformers stores after the final norm: a DFlash tap on
    layer L-1 must be that normed state (the raw layer output differs by the norm)."""
    from specdec_learn.drafters.dspark import DSparkDrafter, DSparkModel, dspark_config

    target = tiny_target(hidden=32, layers=4)
    cfg = draft_config(target, num_layers=1, block_size=4, mask_token_id=5, target_layer_ids=[0, 3])
    drafter = DFlashDrafter(DFlashModel(cfg))
    ids = list(range(7, 20))
    state, out = target.prefill(ids, drafter.taps)
    drafter.start(target, state, out.hidden)
    with torch.no_grad():
        hf = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    zlab = torch.cat([hf[i + 1][0, :-1] for i in (0, 3)], dim=-1)  # extract_context_feature, offset 1
    torch.testing.assert_close(drafter.pending, zlab, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out.hidden[4], hf[4][0, :-1], atol=1e-3)  # the raw tap L is not what z-lab reads
    # DSpark (DeepSpec's eval, assert_no_final_target_layer) refuses such a tap.
    dspark = DSparkDrafter(DSparkModel(dspark_config(target, block_size=4, mask_token_id=5, target_layer_ids=[0, 3])),
                           markov=False)
    with pytest.raises(ValueError, match="final layer 3"):
        dspark.start(target, state, out.hidden)


def test_older_zlab_config_with_top_level_fields_loads(tmp_path):
    model = tiny_dflash(block_size=16)
    save_dflash(model, tmp_path, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    sub = cfg.pop("dflash_config")
    cfg.update(sub)  # block_size, mask_token_id, target_layer_ids all at the top level
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]  # and old-style RoPE
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load_dflash(tmp_path)
    assert loaded.block_size == 16 and loaded.config.mask_token_id == 5
    torch.testing.assert_close(run_block(loaded), run_block(model))


def test_a_wrong_checkpoint_is_refused_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_dflash(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="not a z-lab DFlash"):
        load_dflash(tmp_path)
