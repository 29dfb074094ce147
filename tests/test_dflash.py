"""DFlash: lossless in the loop, its context cache equals a recompute, the z-lab format round-trips.

Random-weight drafters suffice for parity (the verifier alone decides the
output); the shipped drafter, when present, must also get drafts accepted.
"""

import json

import pytest
import torch
from transformers import Qwen3Config

import specdec_learn as sd
from conftest import check_parity
from specdec_learn.drafters.dflash import (
    DFlashDrafter,
    DFlashModel,
    default_target_layer_ids,
    draft_config,
    load_dflash,
    save_dflash,
)
from specdec_learn.checkpoints import shipped
from specdec_learn.target import DecodeState


@pytest.fixture(scope="module")
def parity_prompts(real_prompts):
    return real_prompts  # 10 prompts, the last one stops early at EOS (conftest)


@pytest.fixture(scope="module")
def ar_outputs(ar_greedy):
    return ar_greedy  # AR's MAX_NEW tokens for parity_prompts (conftest)


@pytest.fixture(scope="module")
def random_dflash(target):
    torch.manual_seed(0)
    return DFlashDrafter(DFlashModel(draft_config(target, num_layers=2, block_size=16)))


@pytest.mark.parametrize("k", [3, 15])
def test_random_dflash_is_lossless(target, parity_prompts, ar_outputs, random_dflash, k):
    stats = check_parity(target, parity_prompts, ar_outputs, random_dflash, k)
    assert stats.num_draft_tokens > 0


def test_shipped_dflash_is_lossless_and_accepted(target, parity_prompts, ar_outputs):
    try:
        path = shipped("dflash", target.name)
    except ValueError:
        pytest.skip("no shipped DFlash drafter yet")
    drafter = DFlashDrafter(load_dflash(path, dtype=torch.float32))
    stats = check_parity(target, parity_prompts, ar_outputs, drafter, 7)
    assert stats.num_accepted_tokens > 0


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


def test_cached_context_equals_a_full_recompute(target, random_dflash):
    """After a few rounds, the incrementally built context K/V give the same block as a fresh forward."""
    prompt = "Write a Python function that returns the sum of a list."
    out = sd.generate(target, prompt, random_dflash, k=3, max_new_tokens=12)
    ids = out.prompt_ids + out.tokens
    assert len(out.tokens) == 12  # no EOS: the drafter's state covers exactly `ids`
    state = DecodeState(ids=ids, prompt_len=len(out.prompt_ids), cache=None)
    incremental = random_dflash.block_hidden(state)  # [B, H]

    model = random_dflash.model
    ref_state, ref = target.prefill(ids, random_dflash.taps)  # taps for ids[:-1], one forward
    with torch.inference_mode():
        taps = torch.cat([ref.hidden[t] for t in random_dflash.taps], dim=-1)
        p = len(ids) - 1
        block = torch.full((model.block_size,), random_dflash.mask_token_id)
        block[0] = ids[-1]
        fresh = model(target.embed_tokens(block), torch.arange(p, p + model.block_size),
                      model.context_kv(taps, torch.arange(p)))
    torch.testing.assert_close(incremental, fresh, atol=2e-4, rtol=1e-4)


# -- the z-lab format ---------------------------------------------------------


def tiny_dflash(block_size=4, layer_types=None) -> DFlashModel:
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256, layer_types=layer_types,
                      sliding_window=3 if layer_types else None)
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


def test_sliding_window_layers_are_causal(tmp_path):
    full, swa = tiny_dflash(), tiny_dflash(layer_types=["full_attention", "sliding_attention"])
    assert not full.layers[1].self_attn.causal and swa.layers[1].self_attn.causal
    assert not torch.allclose(run_block(full), run_block(swa))


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
