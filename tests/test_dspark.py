"""DSpark: the Markov head and the survival gate on hand-made tensors, lossless decoding with
every head on and off, anchor-as-first-prediction (k <= B), and both published formats."""

import json

import pytest
import torch
from conftest import MAX_NEW
from transformers import Qwen3Config

import specdec_learn as sd
from specdec_learn.drafters.dspark import (
    DSparkDrafter,
    DSparkModel,
    MarkovHead,
    dspark_config,
    gated_length,
    load_dspark,
    markov_draft,
    save_dspark,
)


# -- the Markov head and the gate, by hand --------------------------------------------


def hand_markov() -> MarkovHead:
    """V = 4, r = 1: W1[t] = t, W2 = [0, 0, 0, 10]: after token 2 or 3, token 3 gets +20 or +30."""
    head = MarkovHead(vocab_size=4, rank=1)
    with torch.no_grad():
        head.markov_w1.weight.copy_(torch.tensor([[0.0], [1.0], [2.0], [3.0]]))
        head.markov_w2.weight.copy_(torch.tensor([[0.0], [0.0], [0.0], [10.0]]))
    return head


def test_markov_bias_is_w2_times_w1_of_the_previous_token():
    head = hand_markov()
    torch.testing.assert_close(head(torch.tensor(2)), torch.tensor([0.0, 0.0, 0.0, 20.0]))
    torch.testing.assert_close(head(torch.tensor([0, 1])), torch.tensor([[0.0] * 4, [0.0, 0.0, 0.0, 10.0]]))


def test_markov_bias_follows_the_tokens_chosen_left_to_right():
    """Slot j's bias comes from the token PICKED at slot j-1, not from the base argmax."""
    base = torch.tensor([
        [0.0, 0.0, 5.0, 0.0],  # slot 0: prev = anchor 0 (no bias) -> 2
        [0.0, 15.0, 0.0, 0.0],  # slot 1: prev = 2 -> token 3 gets +20 -> 3 (base alone says 1)
        [0.0, 25.0, 0.0, 0.0],  # slot 2: prev = 3 -> +30 -> 3 (base alone says 1)
    ])
    tokens, rows, prevs = markov_draft(base, anchor=0, markov=hand_markov(), pick=lambda r: int(r.argmax()))
    assert tokens == [2, 3, 3] and prevs == [0, 2, 3]
    torch.testing.assert_close(rows[1], torch.tensor([0.0, 15.0, 0.0, 20.0]))
    plain, _, _ = markov_draft(base, anchor=0, markov=None, pick=lambda r: int(r.argmax()))
    assert plain == [2, 1, 1]


def test_gate_keeps_the_prefix_whose_survival_stays_above_the_threshold():
    c = torch.tensor([0.75, 0.5, 0.5, 1.0])  # survival: 0.75, 0.375, 0.1875, 0.1875 (exact in binary)
    assert gated_length(c, 0.5) == 1
    assert gated_length(c, 0.375) == 2  # at the threshold still counts
    assert gated_length(c, 0.3) == 2
    assert gated_length(c, 0.1) == 4
    assert gated_length(c, 0.8) == 0
    assert gated_length(torch.tensor([0.2, 1.0]), 0.5) == 0  # a later sure slot cannot revive the prefix


# -- in the loop, on the real target ------------------------------------------------------


@pytest.fixture(scope="module")
def parity_prompts(real_prompts):
    return real_prompts  # 10 prompts, the last one stops early at EOS (conftest)


@pytest.fixture(scope="module")
def ar_outputs(ar_greedy):
    return ar_greedy  # AR's MAX_NEW tokens for parity_prompts (conftest)


@pytest.fixture(scope="module")
def random_dspark(target):
    torch.manual_seed(0)
    model = DSparkModel(dspark_config(target, num_layers=1, block_size=7, markov_rank=16))
    with torch.no_grad():  # confidence 0.6 everywhere: with gate 0.5 exactly one draft survives per round
        model.confidence_head.proj.weight.zero_()
        model.confidence_head.proj.bias.fill_(torch.logit(torch.tensor(0.6)).item())
    return model


@pytest.mark.parametrize("markov,gate,k", [(True, None, 3), (False, None, 7), (True, 0.5, 7), (False, 0.3, 7)])
def test_dspark_is_lossless_with_heads_on_and_off(target, parity_prompts, ar_outputs, random_dspark, markov, gate, k):
    drafter = DSparkDrafter(random_dspark, markov=markov, gate=gate)
    sizes = []
    n = len(parity_prompts) if gate is None else 4  # the gated variants: 4 prompts suffice (and save minutes)
    for prompt, ar in list(zip(parity_prompts, ar_outputs))[:n]:
        out = sd.generate(target, prompt, drafter, k=k, max_new_tokens=MAX_NEW, keep_trace=True)
        assert out.tokens == ar.tokens, f"markov={markov} gate={gate} k={k} differs on {prompt[:40]!r}"
        sizes += [len(r.drafts) for r in out.trace]
    # Survival 0.6, 0.36, 0.216, ...: gate 0.5 keeps 1 draft a round, gate 0.3 keeps 2 (fewer only
    # where the token budget clips the round); no gate submits all k.
    assert max(sizes) == {None: k, 0.5: 1, 0.3: 2}[gate]


def test_dspark_sampling_with_the_markov_head_is_reproducible(target, random_dspark):
    """Sampled drafting (q = base + Markov bias per slot) runs through rejection sampling and
    repeats exactly under the same seed. (That the sampler is lossless is checked on
    distributions in test_verify.py and test_sampling_e2e.py.)"""
    sampling = sd.Sampling(temperature=0.8, top_p=0.95)
    drafter = DSparkDrafter(random_dspark, markov=True, gate=0.3)
    prompt = "Name three fruits."
    a = sd.generate(target, prompt, drafter, k=5, max_new_tokens=16, sampling=sampling, seed=3)
    b = sd.generate(target, prompt, drafter, k=5, max_new_tokens=16, sampling=sampling, seed=3)
    assert a.tokens == b.tokens and len(a.tokens) > 0


def test_the_anchor_slot_is_a_draft_so_k_can_reach_the_block_size(target, random_dspark):
    drafter = DSparkDrafter(random_dspark, markov=False)
    assert drafter.max_k == 7
    sd.generate(target, "Hi", drafter, k=7, max_new_tokens=4)
    with pytest.raises(ValueError, match="block size 7"):
        sd.generate(target, "Hi", drafter, k=8, max_new_tokens=4)


def test_heads_that_are_missing_are_refused(target):
    model = DSparkModel(dspark_config(target, num_layers=1, block_size=4, markov_rank=0, confidence=False))
    with pytest.raises(ValueError, match="no Markov head"):
        DSparkDrafter(model, markov=True)
    with pytest.raises(ValueError, match="confidence head"):
        DSparkDrafter(model, markov=False, gate=0.5)


def test_shipped_dspark_is_lossless(target, parity_prompts, ar_outputs):
    from specdec_learn.checkpoints import shipped

    try:
        path = shipped("dspark", target.name)
    except ValueError:
        pytest.skip("no shipped DSpark drafter yet")
    drafter = DSparkDrafter(load_dspark(path, dtype=torch.float32), markov=True, gate=None)
    total = sd.Stats()
    for prompt, ar in list(zip(parity_prompts, ar_outputs))[:5]:
        out = sd.generate(target, prompt, drafter, k=7, max_new_tokens=MAX_NEW)
        assert out.tokens == ar.tokens
        total = total + out.stats
    assert total.num_accepted_tokens > 0


# -- the DeepSpec and speculators formats ---------------------------------------------------


def tiny_dspark(own_embeddings: bool) -> DSparkModel:
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.num_target_layers = 5, 7, [-1, 1, 2], 4
    cfg.markov_rank, cfg.markov_head_type, cfg.num_anchors = 4, "vanilla", 16
    cfg.enable_confidence_head, cfg.confidence_head_with_markov = True, True
    torch.manual_seed(2)
    model = DSparkModel(cfg, target_hidden_size=32, own_embeddings=own_embeddings)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


@pytest.mark.parametrize("fmt,own", [("deepspec", True), ("speculators", False)])
def test_published_formats_round_trip(tmp_path, fmt, own):
    model = tiny_dspark(own)
    save_dspark(model, tmp_path, format=fmt, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if fmt == "deepspec":
        assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["target_layer_ids"] == [-1, 1, 2]
    else:
        assert cfg["speculators_model_type"] == "dspark" and cfg["aux_hidden_state_layer_ids"] == [0, 2, 3]
        assert cfg["sample_from_anchor"] is True
    loaded = load_dspark(tmp_path)
    assert loaded.config.target_layer_ids == [-1, 1, 2] and loaded.block_size == 5 and loaded.config.markov_rank == 4
    assert (loaded.embed_tokens is not None) == own
    state, again = model.state_dict(), loaded.state_dict()
    assert set(state) == set(again)
    for name in state:
        torch.testing.assert_close(again[name], state[name])


def test_taps_map_minus_one_to_the_embedding_output(target):
    cfg = dspark_config(target, target_layer_ids=[-1, 14, 28])
    assert DSparkDrafter(DSparkModel(cfg), markov=False).taps == (0, 15, 29)


def test_deepspec_format_needs_embeddings_from_somewhere(tmp_path):
    with pytest.raises(ValueError, match="pass target="):
        save_dspark(tiny_dspark(False), tmp_path, format="deepspec")


def test_gated_or_rnn_markov_heads_are_refused(tmp_path):
    save_dspark(tiny_dspark(True), tmp_path, format="deepspec", dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["markov_head_type"] = "gated"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="only 'vanilla'"):
        load_dspark(tmp_path)
