"""verify.py and sampling.py on hand-made tensors: the rules, and that they are lossless."""

import pytest
import torch
from scipy.stats import chisquare

from specdec_learn.sampling import Sampling, probabilities
from specdec_learn.verify import accept, greedy_accept, rejection_accept


def onehot_logits(choices, vocab=6):
    logits = torch.full((len(choices), vocab), -5.0)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 5.0
    return logits


def test_greedy_accepts_matching_prefix_then_corrects():
    logits = onehot_logits([3, 1, 4, 0])  # the target wants 3, 1, 4, then 0
    assert greedy_accept([3, 1, 5], logits) == ([0, 1], 4)  # d3 = 5 rejected, corrected to 4
    assert greedy_accept([2, 1, 4], logits) == ([], 3)  # first draft wrong
    assert greedy_accept([3, 1, 4], logits) == ([0, 1, 2], 0)  # all accepted + bonus from the last row
    assert greedy_accept([], logits[:1]) == ([], 3)  # k = 0 is plain greedy decoding


def test_sampling_top_k_and_top_p_match_definitions():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    p = probabilities(logits, Sampling(temperature=1.0, top_k=2))
    ref = torch.zeros(5)
    ref[:2] = torch.tensor([2.0, 1.0]).softmax(-1)
    assert torch.allclose(p, ref)
    full = logits.softmax(-1)
    # top-p keeps the smallest prefix (by probability) whose mass reaches top_p
    p = probabilities(logits, Sampling(temperature=1.0, top_p=0.7))
    keep = 2 if full[:2].sum() >= 0.7 else 3
    ref = torch.zeros(5)
    ref[:keep] = full[:keep] / full[:keep].sum()
    assert torch.allclose(p, ref, atol=1e-6)
    # temperature sharpens
    assert probabilities(logits, Sampling(temperature=0.5))[0] > full[0]
    # greedy is one-hot
    assert probabilities(logits, Sampling()).tolist() == [1, 0, 0, 0, 0]


def test_sampling_rejects_bad_settings():
    for bad in (dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            Sampling(**bad)


def _first_token_histogram(p, q, drafts_fn, n, vocab, seed=1234):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(vocab)
    for _ in range(n):
        drafts, qq = drafts_fn(gen)
        path, nxt = rejection_accept(drafts, qq, p, gen)
        first = drafts[0] if path else nxt
        counts[first] += 1
    return counts


@pytest.mark.parametrize("with_q", [True, False])
def test_rejection_sampler_output_is_distributed_as_target(with_q):
    """The first output token is distributed exactly as p[0], whatever the drafter did."""
    vocab, n = 8, 20000
    torch.manual_seed(0)
    p = torch.rand(3, vocab) ** 2
    p = p / p.sum(-1, keepdim=True)  # [k+1, V] target
    q = torch.rand(2, vocab)
    q = q / q.sum(-1, keepdim=True)  # [k, V] draft, deliberately unlike p

    def drafts_fn(gen):
        if with_q:
            d = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
            return d, q
        return [int(torch.argmax(q[0])), 3], None  # a fixed guess, verified as one-hot

    counts = _first_token_histogram(p, q, drafts_fn, n, vocab)
    stat, pvalue = chisquare(counts.numpy(), (p[0] * n).numpy())
    assert pvalue > 1e-3, f"first-token distribution differs from the target's (chi2={stat:.1f})"


def test_rejection_sampler_second_token_is_distributed_as_target():
    """When the first draft is fixed and accepted, the next token still follows p[1]."""
    vocab, n = 6, 20000
    torch.manual_seed(1)
    p = torch.rand(3, vocab).softmax(-1)
    p[0] = torch.nn.functional.one_hot(torch.tensor(2), vocab).float()  # the target always takes token 2 first
    q = torch.rand(2, vocab).softmax(-1)
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(vocab)
    for _ in range(n):
        d = [2, int(torch.multinomial(q[1], 1, generator=gen))]
        path, nxt = rejection_accept(d, torch.stack([torch.nn.functional.one_hot(torch.tensor(2), vocab).float(), q[1]]), p, gen)
        assert len(path) >= 1
        counts[d[1] if len(path) >= 2 else nxt] += 1
    assert chisquare(counts.numpy(), (p[1] * n).numpy()).pvalue > 1e-3


def test_identical_draft_is_always_accepted():
    p = torch.rand(4, 10).softmax(-1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        d = [int(torch.multinomial(p[i], 1, generator=gen)) for i in range(3)]
        assert rejection_accept(d, p[:3], p, gen)[0] == [0, 1, 2]  # p/q = 1 >= u always


def test_accept_dispatches_on_sampling():
    logits = onehot_logits([3, 1])
    assert accept([3], None, logits, Sampling()) == ([0], 1)
    gen = torch.Generator().manual_seed(0)
    path, nxt = accept([3], None, logits * 10, Sampling(temperature=1.0), gen)  # p(3) ~ 1: accepted
    assert path == [0] and nxt == 1
