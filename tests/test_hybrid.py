"""Hybrid linear-attention targets (Qwen3.5, Qwen3-Next): speculation across rejections.

A linear-attention layer folds every token into one recurrent state (and a
short conv state), so a rejected draft cannot be cropped out: `Target.verify`
snapshots those states and `Target.commit` puts them back and replays the
accepted rows through the linear layers' token mixers (target.py). Without
that, `Target.can_roll_back` would be False for these targets and `generate`
would refuse every drafter on them, so each speculative test here fails.

Targets are transformers' own Qwen3_5ForCausalLM / Qwen3NextForCausalLM with
tiny configs (three linear-attention layers, one full-attention layer) and
random weights, given a long memory (`remember`): at HF's random init the
linear layers forget each token almost at once and barely move the output,
so a wrong rollback would hardly show in the tokens. Prompts repeat a
pattern so that n-gram and suffix drafts are partly accepted and partly
rejected.
"""

import math

import pytest
import torch
from conftest import greedy_equals_ar, learned_drafter, tiny_llama
from scipy.stats import chisquare

import specdec_learn as sd
from specdec_learn.drafters.mtp import MTPDrafter, random_mtp_head
from specdec_learn.sampling import GREEDY, Sampling
from specdec_learn.kv_cache import is_linear
from specdec_learn.target import Target

PROMPT = [5, 9, 14, 3, 27, 8, 5, 9, 14, 3, 27, 8, 40, 41, 5, 9, 14, 3, 27, 8, 12, 30, 5, 9]
MAX_NEW = 32
HYBRID = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]  # Qwen3.5's 3:1
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_conv_kernel_dim=4)


def remember(model):
    """Give the linear layers a long memory and a real say in the output.

    A gated delta rule decays its state by exp(-A * softplus(.)) per token; HF
    draws A from U(0.01, 16), so most heads forget at once. A = 0.05 keeps
    tokens for tens of steps; a larger out_proj makes the layer matter.
    """
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.A_log.fill_(math.log(0.05))
                layer.linear_attn.out_proj.weight.mul_(20)
    return model


def tiny_qwen3_5(vocab_size=64, seed=0, hidden=32, layer_types=HYBRID):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=list(layer_types), eos_token_id=None,
        bos_token_id=None, pad_token_id=None, **LINEAR,
    )
    return remember(Qwen3_5ForCausalLM(cfg).eval())


def tiny_qwen3_next(vocab_size=64, seed=0, hidden=32):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3NextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2, num_hidden_layers=len(HYBRID),
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=HYBRID, eos_token_id=None,
        bos_token_id=None, pad_token_id=None, **LINEAR,
    )
    return remember(Qwen3NextForCausalLM(cfg).eval())


TARGETS = {"qwen3_5": tiny_qwen3_5, "qwen3_next": tiny_qwen3_next}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def target(request):
    """Overrides conftest's real target: every test here runs on the tiny hybrid ones."""
    t = Target(TARGETS[request.param](), None, name=f"tiny-{request.param}")
    assert t.can_roll_back and sorted(t.mixers) == [0, 1, 2]
    return t


@pytest.fixture(scope="module")
def ar(target):
    return sd.generate(target, PROMPT, max_new_tokens=MAX_NEW)


def check_lossless(target, ar, drafter, ks=(2, 4)):
    """Greedy output equal to AR for each k on this file's prompt; the summed stats."""
    return greedy_equals_ar(target, PROMPT, MAX_NEW, ar, drafter, ks)


def linear_states(cache):
    """Every linear layer's (conv state, recurrent state), with the conv state's last `kernel` columns."""
    return {i: (layer.conv_states[0][..., -layer.conv_kernel_size[0]:], layer.recurrent_states[0])
            for i, layer in enumerate(cache.layers) if is_linear(layer)}


def largest_difference(a, b) -> float:
    """The largest absolute difference between two sets of linear states."""
    assert a.keys() == b.keys()
    return max(float((x - y).abs().max()) for i in a for x, y in zip(a[i], b[i]))


def test_rollback_equals_a_fresh_prefill(target):
    """After rounds with 0, some and all drafts accepted, the linear states equal those of a fresh prefill of the
    committed tokens, and the next logits those of a full forward; right after verify they do not (the rejected
    drafts are in them), so the comparison can tell."""
    state, _ = target.prefill(PROMPT)
    for drafts, n in [([1, 2, 3], 0), ([4, 5, 6, 7], 2), ([8], 1), ([9, 10, 11, 12], 4), ([13, 14], 1)]:
        out = target.verify(state, drafts)
        nxt = int(out.logits[n].argmax())
        if n < len(drafts):
            fresh, _ = target.prefill(state.ids + drafts[:n] + [nxt])
            assert largest_difference(linear_states(state.cache), linear_states(fresh.cache)) > 1e-3
        target.commit(state, drafts[:n] + [nxt])
        fresh, _ = target.prefill(state.ids)
        assert largest_difference(linear_states(state.cache), linear_states(fresh.cache)) < 1e-5
        assert state.cache.get_seq_length() == len(state.ids) - 1
    with torch.no_grad():
        ref = target.model(torch.tensor([state.ids])).logits[0, -1]
    torch.testing.assert_close(target.verify(state, []).logits[0], ref, atol=1e-5, rtol=1e-4)


class Oracle(sd.Drafter):
    """A test drafter that knows AR's output and proposes it with one token in each block made wrong (at a random
    place, sometimes none): every round keeps some drafts and rejects the rest, which n-gram and suffix drafts on
    a random model seldom do."""

    name = "oracle"

    def __init__(self, ar_tokens, seed=0):
        self.ar_tokens, self.rng = ar_tokens, torch.Generator().manual_seed(seed)

    def start(self, target, state, hidden):
        self.prompt_len = state.prompt_len

    def propose(self, state, k, sampling, generator):
        done = len(state.ids) - self.prompt_len
        tokens = list(self.ar_tokens[done : done + k])
        wrong = int(torch.randint(len(tokens) + 1, (1,), generator=self.rng))
        if wrong < len(tokens):
            tokens[wrong] = (tokens[wrong] + 1) % 64
        return sd.Proposal(tokens)


def test_partly_accepted_rounds_are_lossless(target, ar):
    stats = check_lossless(target, ar, Oracle(ar.tokens))
    assert stats.num_accepted_tokens > stats.num_draft_tokens // 3 and stats.num_drafts > 8  # many partial rounds


def test_ngram_and_suffix_are_lossless(target, ar):
    for drafter in (sd.NgramDrafter(), sd.SuffixDrafter()):
        stats = check_lossless(target, ar, drafter)
        assert stats.num_draft_tokens > stats.num_accepted_tokens  # drafts tried, and rejected


@pytest.mark.parametrize("draft", ["llama", "qwen3_5"])
def test_draft_model_is_lossless(target, ar, draft):
    """A plain draft model, and a hybrid one (its own linear state rolled back after every round)."""
    model = tiny_llama(64, seed=5, hidden=16) if draft == "llama" else tiny_qwen3_5(seed=5, hidden=16)
    stats = check_lossless(target, ar, sd.DraftModelDrafter(model, target))
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_hybrid_draft_model_drafts_equal_a_fresh_one(target):
    """The draft model's own rollback: after rounds with rejections its next draft distribution equals that of
    a draft model that reads the committed tokens from scratch."""
    draft = tiny_qwen3_5(seed=5, hidden=16)
    drafter = sd.DraftModelDrafter(draft, target)
    state = drive(target, drafter, PROMPT, accepts=[0, 2, 1, 3, 0], k=3)
    q_inc = drafter.propose(state, 3, Sampling(temperature=1.0), torch.Generator().manual_seed(0)).q
    fresh = sd.DraftModelDrafter(draft, target)
    fresh.start(target, state, {})
    q_new = fresh.propose(state, 3, Sampling(temperature=1.0), torch.Generator().manual_seed(0)).q
    torch.testing.assert_close(q_inc, q_new, atol=1e-5, rtol=1e-4)


def drive(target, drafter, ids, accepts, k):
    """Decode rounds by hand, committing `n` drafts each round (right or wrong: the bookkeeping is under test)."""
    state, out = target.prefill(ids, drafter.taps)
    drafter.start(target, state, out.hidden)
    for n in accepts:
        drafts = drafter.propose(state, k, GREEDY, None).tokens
        out = target.verify(state, drafts, drafter.taps)
        target.commit(state, drafts[:n] + [int(out.logits[n].argmax())])
        drafter.observe(state, n, {t: h[: n + 1] for t, h in out.hidden.items()})
    return state


def test_native_mtp_is_lossless(target, ar):
    """Native MTP, the method these models were trained with: a random head (qwen3_next layout)."""
    stats = check_lossless(target, ar, MTPDrafter(random_mtp_head(target, num_layers=1), target))
    assert stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.parametrize("name", ["eagle3", "dflash", "dspark"])
def test_learned_drafters_that_read_taps_are_lossless(target, ar, name):
    """EAGLE-3, DFlash and DSpark read hidden states of linear-attention layers too (z-lab ships a DFlash for
    Qwen3.5-4B): after a rollback they observe only the kept rows' taps."""
    stats = check_lossless(target, ar, learned_drafter(name, target), ks=(3,))
    assert stats.num_accepted_tokens < stats.num_draft_tokens


# -- sampling: the whole loop reproduces the hybrid target's distribution ----------------------------
VOCAB = 6


def exact_two_token_distribution(model, prompt, sampling):
    """P(t1, t2 | prompt) under `sampling`, by enumeration: [V, V] (each sequence run on its own)."""
    with torch.no_grad():
        p1 = sd.sampling.probabilities(model(torch.tensor([prompt])).logits[0, -1], sampling)
        p2 = torch.stack([sd.sampling.probabilities(model(torch.tensor([prompt + [t]])).logits[0, -1], sampling)
                          for t in range(VOCAB)])  # [V, V]
    return p1[:, None] * p2


def test_speculative_sampling_matches_the_hybrid_target_distribution():
    """As tests/test_sampling_e2e.py, on a hybrid Qwen3.5. k = 1 and two tokens: when the draft is rejected the
    second token is sampled after a rollback. With the replay left out of `Target.commit` this gives p ~ 1e-12."""
    sampling = Sampling(temperature=1.0)
    target_model = tiny_qwen3_5(VOCAB, seed=1, hidden=16, layer_types=HYBRID[1:])  # two linear layers, one full
    draft_model = tiny_llama(VOCAB, seed=2, hidden=16)  # a different model
    with torch.no_grad():
        target_model.lm_head.weight.mul_(10)  # a target distribution far from uniform,
        draft_model.lm_head.weight.mul_(100)  # and a peaked draft that is often rejected
    target = Target(target_model, None, name="tiny-qwen3_5")
    drafter = sd.DraftModelDrafter(draft_model, target)
    prompt = [1, 4, 3, 5, 2]
    n = 300
    counts = torch.zeros(VOCAB, VOCAB)
    rejected = 0
    for seed in range(n):
        out = sd.generate(target, prompt, drafter, k=1, max_new_tokens=2, sampling=sampling, seed=seed)
        counts[out.tokens[0], out.tokens[1]] += 1
        rejected += out.stats.num_draft_tokens - out.stats.num_accepted_tokens
    expected = exact_two_token_distribution(target_model, prompt, sampling).flatten() * n
    observed = counts.flatten()
    keep = expected >= 5  # chi-square needs non-tiny expected counts; pool the rest
    obs = torch.cat([observed[keep], observed[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
    assert rejected > n // 2  # the rollback was exercised, in most runs
