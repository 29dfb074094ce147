"""Native MTP: incremental == from scratch, loaders for both layouts (lossless decoding with a random
head of either layout: test_lossless_tiny.py; the shipped head: test_shipped.py)."""

import json

import pytest
import torch
from conftest import tiny_target
from transformers import AutoModelForCausalLM

import specdec_learn as sd
from specdec_learn.drafters.mtp import MTPDrafter, load_mtp, random_mtp_head, save_mtp
from specdec_learn.sampling import GREEDY, Sampling
from specdec_learn.compat import cached_length
from specdec_learn.target import Target


def drive(target, drafter, ids, accepts, k):
    """Run decode rounds by hand, committing `n` of the drafts each round (right or wrong:
    only the drafter's bookkeeping is under test). k: one for every round, or a list, one per round."""
    state, out = target.prefill(ids, drafter.taps)
    drafter.start(target, state, out.hidden)
    ks = k if isinstance(k, list) else [k] * len(accepts)
    for n, k in zip(accepts, ks, strict=True):
        drafts = drafter.propose(state, k, GREEDY, None).tokens
        out = target.verify(state, drafts, drafter.taps)
        nxt = int(out.logits[n].argmax())
        target.commit(state, drafts[:n] + [nxt])
        drafter.observe(state, n, {t: h[: n + 1] for t, h in out.hidden.items()})
    return state


def fresh_q(target, drafter, ids, k):
    state, out = target.prefill(ids, drafter.taps)
    drafter.start(target, state, out.hidden)
    return drafter.propose(state, k, Sampling(temperature=1.0), torch.Generator().manual_seed(0)).q


@pytest.mark.parametrize("layout,n,depth", [("qwen3_next", 1, None), ("qwen3_next", 3, None),
                                            ("deepseek_v3", 2, None), ("qwen3_next", 1, 3)])
def test_incremental_drafts_equal_from_scratch(layout, n, depth):
    """After rounds with 0, some and all drafts accepted, the drafter's caches give the same
    draft distributions as a drafter that saw the whole sequence at once."""
    target = tiny_target()
    head = random_mtp_head(target, num_layers=n, layout=layout)
    drafter = MTPDrafter(head, target, depth=depth)
    state = drive(target, drafter, list(range(5, 17)), accepts=[0, 3, 1, 4, 0, 2], k=4)
    q_inc = drafter.propose(state, 5, Sampling(temperature=1.0), torch.Generator().manual_seed(0)).q
    q_new = fresh_q(target, MTPDrafter(head, target, depth=depth), state.ids, 5)
    torch.testing.assert_close(q_inc, q_new, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layout,n,depth", [("qwen3_next", 3, None), ("deepseek_v3", 2, None), ("qwen3_next", 1, 3)])
def test_layers_a_round_does_not_draft_with_wait_and_catch_up_to_the_same_drafts(layout, n, depth):
    """Rounds of k = 1 and 2 run only the layers they draft with; a round of k = 5 then runs the others over
    everything they missed, in one pass, and drafts what a drafter that saw the whole sequence at once drafts."""
    target = tiny_target()
    head = random_mtp_head(target, num_layers=n, layout=layout)
    drafter = MTPDrafter(head, target, depth=depth)
    state = drive(target, drafter, list(range(5, 17)), accepts=[0, 1, 2, 0, 1, 1], k=[1, 1, 2, 2, 1, 2])
    if drafter.depth > 2:
        assert cached_length(drafter.caches[-1]) == 0  # the last layer has waited all along
    q_inc = drafter.propose(state, 5, Sampling(temperature=1.0), torch.Generator().manual_seed(0)).q
    q_new = fresh_q(target, MTPDrafter(head, target, depth=depth), state.ids, 5)
    torch.testing.assert_close(q_inc, q_new, atol=1e-5, rtol=1e-4)


def test_proposing_does_not_touch_the_target_cache():
    target = tiny_target()
    drafter = MTPDrafter(random_mtp_head(target, 2), target)
    state, out = target.prefill(list(range(5, 15)), drafter.taps)
    drafter.start(target, state, out.hidden)
    before = state.cache.get_seq_length()
    drafter.propose(state, 6, GREEDY, None)
    assert state.cache.get_seq_length() == before


# -- loaders: tiny checkpoints in the published layouts ------------------------------
def tiny_qwen3_5():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    # All full attention: the published layout is what is under test here (hybrid targets: test_hybrid.py).
    cfg = Qwen3_5TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, layer_types=["full_attention"] * 2, eos_token_id=1,
        bos_token_id=None, pad_token_id=None,
    )
    return Qwen3_5ForCausalLM(cfg).eval()


def tiny_qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, layer_types=["full_attention"] * 2,
        num_nextn_predict_layers=1, eos_token_id=1, bos_token_id=None, pad_token_id=None,
    )
    return Qwen3NextForCausalLM(cfg).eval()


def tiny_deepseek_v3():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, num_nextn_predict_layers=1, eos_token_id=1, bos_token_id=None,
        pad_token_id=None,
    )
    return DeepseekV3ForCausalLM(cfg).eval()


PUBLISHED_KEYS = {
    # Qwen3.5 / Qwen3-Next: mtp.* beside the main model
    "qwen3_5": {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.fc.weight",
                "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight"},
    "qwen3_next": {"mtp.fc.weight", "mtp.layers.0.mlp.experts.3.gate_proj.weight",
                   "mtp.layers.0.mlp.shared_expert.up_proj.weight", "mtp.layers.0.mlp.gate.weight"},
    # DeepSeek-V3: layer L (= num_hidden_layers = 2) after the main stack
    "deepseek_v3": {"model.layers.2.enorm.weight", "model.layers.2.hnorm.weight", "model.layers.2.eh_proj.weight",
                    "model.layers.2.shared_head.norm.weight", "model.layers.2.shared_head.head.weight",
                    "model.layers.2.embed_tokens.weight", "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
                    "model.layers.2.mlp.experts.0.down_proj.weight", "model.layers.2.input_layernorm.weight"},
}


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "deepseek_v3"])
def test_loader_round_trip_published_layout(family, tmp_path):
    from safetensors import safe_open

    model = {"qwen3_5": tiny_qwen3_5, "qwen3_next": tiny_qwen3_next, "deepseek_v3": tiny_deepseek_v3}[family]()
    target = Target(model, None, name=family)
    layout = "deepseek_v3" if family == "deepseek_v3" else "qwen3_next"
    head = random_mtp_head(target, num_layers=1, layout=layout, seed=3)
    model.save_pretrained(tmp_path)
    save_mtp(head, tmp_path, target)

    with safe_open(str(tmp_path / "mtp.safetensors"), framework="pt") as f:
        assert PUBLISHED_KEYS[family] <= set(f.keys())
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg.get("mtp_num_hidden_layers" if family == "qwen3_5" else "num_nextn_predict_layers") == 1

    # Reload the target the ordinary way (HF skips the MTP tensors), then the MTP head from the same directory.
    reloaded = Target(AutoModelForCausalLM.from_pretrained(tmp_path).eval(), None, name=str(tmp_path))
    loaded = load_mtp(tmp_path, reloaded)
    for (name, a), b in zip(head.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name

    prompt = list(range(5, 25))
    ar = sd.generate(reloaded, prompt, max_new_tokens=16)
    for k in (1, 3):
        out = sd.generate(reloaded, prompt, MTPDrafter(loaded, reloaded), k=k, max_new_tokens=16)
        assert out.tokens == ar.tokens


def test_target_without_mtp_weights_says_so(tmp_path):
    target = tiny_target()
    target.model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no MTP weights"):
        load_mtp(tmp_path, target)


def test_mtp_head_for_another_target_is_refused(tmp_path):
    big, small = tiny_target(hidden=64), tiny_target(hidden=32)
    big.model.save_pretrained(tmp_path)
    save_mtp(random_mtp_head(big), tmp_path, big)
    with pytest.raises(ValueError, match="do not match"):
        load_mtp(tmp_path, small)


def test_zoo_without_a_shipped_head_says_what_to_do():
    from specdec_learn.zoo import make_drafter

    with pytest.raises(ValueError, match="draft="):
        make_drafter("mtp", tiny_target())


def test_recurrent_layers_without_a_rollback_are_refused_for_speculation_but_decode_plainly():
    """A layer kind Target cannot roll back (LFM2's short convolutions) gets a clear error, not a wrong answer.
    Qwen3.5 / Qwen3-Next linear attention is rolled back (tests/test_hybrid.py)."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    cfg = Lfm2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["conv", "full_attention"], eos_token_id=1, bos_token_id=None,
        pad_token_id=None,
    )
    target = Target(Lfm2ForCausalLM(cfg).eval(), None, name="tiny-lfm2")
    assert not target.can_roll_back
    assert len(sd.generate(target, list(range(3, 20)), max_new_tokens=4).tokens) == 4
    with pytest.raises(ValueError, match="recurrent layers.*vllm"):
        sd.generate(target, list(range(3, 20)), sd.NgramDrafter(), k=2, max_new_tokens=4)
