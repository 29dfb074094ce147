"""End to end: speculative sampling through the whole loop reproduces the
target's distribution, on a tiny model small enough to enumerate exactly."""

import pytest
import torch
from scipy.stats import chisquare

import specdec_learn as sd
from conftest import tiny_llama

VOCAB = 6


def exact_two_token_distribution(model, prompt, sampling):
    """P(t1, t2 | prompt) under `sampling`, by enumeration: [V, V]."""
    with torch.no_grad():
        p1 = sd.sampling.probabilities(model(torch.tensor([prompt])).logits[0, -1], sampling)
        seqs = torch.tensor([prompt + [t] for t in range(VOCAB)])
        p2 = sd.sampling.probabilities(model(seqs).logits[:, -1], sampling)  # [V, V]
    return p1[:, None] * p2


@pytest.mark.parametrize("sampling", [sd.Sampling(temperature=1.0), sd.Sampling(temperature=0.8, top_k=4, top_p=0.9)])
def test_speculative_sampling_matches_target_distribution(sampling):
    target_model = tiny_llama(VOCAB, seed=1, hidden=16)
    target_model.generation_config.eos_token_id = None  # no EOS: every run gives 3 tokens
    target = sd.Target(target_model, tokenizer=None)
    drafter = sd.DraftModelDrafter(tiny_llama(VOCAB, seed=2, hidden=16), target)  # a different model
    prompt = [1, 4, 3]
    n = 2000
    counts = torch.zeros(VOCAB, VOCAB)
    accepted = 0
    for seed in range(n):
        out = sd.generate(target, prompt, drafter, k=2, max_new_tokens=3, sampling=sampling, seed=seed)
        counts[out.tokens[0], out.tokens[1]] += 1
        accepted += out.stats.num_accepted_tokens
    expected = exact_two_token_distribution(target_model, prompt, sampling).flatten() * n
    observed = counts.flatten()
    assert observed[expected == 0].sum() == 0, "sampled a pair the target gives probability 0"
    keep = expected >= 5  # chi-square needs non-tiny expected counts; pool the rest
    obs = torch.cat([observed[keep], observed[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
    assert accepted > 0  # the drafts were actually used, not all rejected
