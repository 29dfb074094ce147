"""Sliding-window targets (Gemma 3/4, Mistral): speculation past the window.

A sliding layer's cache keeps only the last window-1 positions, so a crop
after a rejection needs the layer to have kept its past (kv_cache.py,
`record_past`): without it transformers raises RuntimeError from
`DynamicSlidingWindowLayer.crop` the first time a draft is rejected past the
window. Every test here runs well past a window of 8 and has rejected drafts;
on the library before `record_past` each one raised that RuntimeError.

Targets are transformers' own classes with tiny configs and random weights;
a random model is a poor guesser, so prompts repeat a pattern the n-gram and
suffix drafters can pick up (accepted AND rejected drafts in every run).
"""

import pytest
import torch
from conftest import greedy_equals_ar, learned_drafter

import specdec_learn as sd
from specdec_learn.target import Target

WINDOW = 8
PROMPT = [5, 9, 14, 3, 27, 8, 5, 9, 14, 3, 27, 8, 40, 41, 5, 9, 14, 3, 27, 8, 12, 30, 5, 9]  # 24 tokens: 3 windows
MAX_NEW = 40


def tiny_gemma3(vocab_size=64, seed=0, hidden=32, layers=4, window=WINDOW):
    """Gemma 3: sliding layers with one full layer, two rope bases, scaled embeddings."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=window,
        layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"], max_position_embeddings=512,
        eos_token_id=None, bos_token_id=2, pad_token_id=0,
    )
    return Gemma3ForCausalLM(cfg).eval()


def tiny_mistral(vocab_size=64, seed=0, hidden=32, layers=4, window=WINDOW):
    """Mistral-style: every layer sliding, no `layer_types` (the cache infers them from `sliding_window`)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=window, max_position_embeddings=512,
        eos_token_id=None, bos_token_id=1, pad_token_id=0,
    )
    return MistralForCausalLM(cfg).eval()


TARGETS = {"gemma3": tiny_gemma3, "mistral": tiny_mistral}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def target(request):
    """Overrides conftest's real target: every test here runs on the tiny sliding-window ones."""
    from transformers import DynamicCache

    model = TARGETS[request.param]()
    assert any(layer.is_sliding for layer in DynamicCache(config=model.config).layers)
    return Target(model, None, name=f"tiny-{request.param}")


@pytest.fixture(scope="module")
def ar(target):
    return sd.generate(target, PROMPT, max_new_tokens=MAX_NEW)


def full_forward_logits(target, ids):
    with torch.no_grad():
        return target.model(torch.tensor([ids])).logits[0]


def check_lossless(target, ar, drafter, ks=(2, 4)):
    """Greedy output equal to AR for each k on this file's prompt; the summed stats."""
    return greedy_equals_ar(target, PROMPT, MAX_NEW, ar, drafter, ks)


def test_crop_past_the_window_equals_a_full_forward(target):
    """Rounds with rejections past the window: the cache after each commit gives a full forward's logits,
    and every sliding layer is back to window-1 positions."""
    state, _ = target.prefill(PROMPT)
    for drafts, n in [([1, 2, 3], 0), ([4, 5, 6, 7], 2), ([8], 1), ([9, 10, 11, 12, 13], 4), ([14, 15], 0)]:
        out = target.verify(state, drafts)
        target.commit(state, drafts[:n] + [int(out.logits[n].argmax())])
        assert state.cache.get_seq_length() == len(state.ids) - 1
        for layer in state.cache.layers:
            if layer.is_sliding:
                assert layer.keys.shape[-2] == WINDOW - 1  # trimmed back, even when nothing was rejected
        nxt = target.verify(state, [])  # k = 0: nothing to roll back
        torch.testing.assert_close(nxt.logits[0], full_forward_logits(target, state.ids)[-1], atol=1e-5, rtol=1e-5)
        target.commit(state, [int(nxt.logits[0].argmax())])


def test_ngram_and_suffix_are_lossless_past_the_window(target, ar):
    for drafter in (sd.NgramDrafter(), sd.SuffixDrafter()):
        stats = check_lossless(target, ar, drafter)
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # accepted AND rejected drafts


def test_sliding_window_draft_model_is_lossless(target, ar):
    """The draft model is itself a sliding-window Gemma 3 (window 4): its own cache is cropped past its window."""
    draft = tiny_gemma3(seed=7, hidden=16, layers=2, window=4)
    stats = check_lossless(target, ar, sd.DraftModelDrafter(draft, target))
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_fresh_drafters_rotate_as_the_targets_full_attention_layers():
    """Gemma 3 keys RoPE by layer type (sliding: theta 1e4; full: theta 1e6, here with linear scaling x8): a
    fresh EAGLE-3 or DFlash drafter, and MTP through `Target.rotary`, gets the full-attention cos/sin, scaling
    included."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from specdec_learn.drafters.dflash import DFlashModel, draft_config
    from specdec_learn.drafters.eagle3 import new_eagle3

    cfg = Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0}},
        eos_token_id=None, bos_token_id=2, pad_token_id=0)
    target = Target(Gemma3ForCausalLM(cfg).eval(), None, name="tiny-gemma3-scaled")
    positions = torch.arange(0, 600, 37)
    x = torch.zeros(1, len(positions), 8)
    want_cos, want_sin = target.decoder.rotary_emb(x, positions[None], "full_attention")
    sliding_cos, _ = target.decoder.rotary_emb(x, positions[None], "sliding_attention")
    assert not torch.allclose(want_cos, sliding_cos, atol=1e-3)  # the two layer types really differ
    got = {
        "eagle3": new_eagle3(target, taps=(0, 1, 1)).rope(positions),
        "dflash": DFlashModel(draft_config(target, block_size=4, target_layer_ids=[0, 1])).rope(positions, x[0]),
        "mtp": tuple(t[0] for t in target.rotary(x, positions[None])),
    }
    for name, (cos, sin) in got.items():
        torch.testing.assert_close(cos, want_cos[0], atol=1e-6, rtol=1e-5, msg=f"{name}: cos")
        torch.testing.assert_close(sin, want_sin[0], atol=1e-6, rtol=1e-5, msg=f"{name}: sin")


@pytest.mark.parametrize("name", ["mtp", "eagle3", "dflash", "dspark"])
def test_learned_drafters_are_lossless_past_the_window(target, ar, name):
    stats = check_lossless(target, ar, learned_drafter(name, target), ks=(3,))
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_gemma4_assistant_is_lossless_past_the_window():
    """Gemma 4: a target with sliding (window 8) and full layers, and an assistant that reads the target's own
    cache, whose sliding layers now hold window-1 positions after every commit."""
    from transformers import (
        Gemma4AssistantConfig,
        Gemma4AssistantForCausalLM,
        Gemma4ForCausalLM,
        Gemma4TextConfig,
    )

    from specdec_learn.drafters.gemma4_mtp import Gemma4AssistantDrafter

    common = dict(vocab_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
                  sliding_window=WINDOW, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                  final_logit_softcapping=30.0, eos_token_id=None, bos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    target = Target(Gemma4ForCausalLM(Gemma4TextConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_kv_shared_layers=1,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"], **common,
    )).eval(), None, name="tiny-gemma4")
    text = Gemma4TextConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_kv_shared_layers=2,
                            layer_types=["sliding_attention", "full_attention"], **common)
    assistant = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=text, backbone_hidden_size=32)).eval()
    ar = sd.generate(target, PROMPT, max_new_tokens=MAX_NEW)
    stats = check_lossless(target, ar, Gemma4AssistantDrafter(assistant, target), ks=(1, 3))
    assert stats.num_accepted_tokens < stats.num_draft_tokens
