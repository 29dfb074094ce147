"""End to end: speculative sampling through the whole loop reproduces the target's distribution, on a
tiny model small enough to enumerate exactly, for each way a drafter hands the verifier its drafts:
sampled with their q (a draft model; DSpark, its Markov bias in q and its gate cutting the block), or
without q (suffix decoding; token trees, a draft model's and DFlash's, whose nodes are top picks). Each
case also checks that it drafted as it is meant to, and that a seed gives the same output again."""

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from scipy.stats import chisquare

import specdec_learn as sd
from conftest import tiny_llama
from specdec_learn.drafters.dflash import DFlashDrafter, DFlashModel, draft_config
from specdec_learn.drafters.dspark import DSparkDrafter, DSparkModel, dspark_config

VOCAB = 6
PROMPT = [1, 4, 3]
PATTERN = [1, 4, 3, 5, 1, 4, 3, 5, 1, 4]  # suffix decoding drafts what followed "1 4" before: 3, 5


def exact_two_token_distribution(model, prompt, sampling):
    """P(t1, t2 | prompt) under `sampling`, by enumeration: [V, V]."""
    with torch.no_grad():
        p1 = sd.sampling.probabilities(model(torch.tensor([prompt])).logits[0, -1], sampling)
        seqs = torch.tensor([prompt + [t] for t in range(VOCAB)])
        p2 = sd.sampling.probabilities(model(seqs).logits[:, -1], sampling)  # [V, V]
    return p1[:, None] * p2


def draft_model(target):
    return sd.DraftModelDrafter(tiny_llama(VOCAB, seed=2, hidden=16), target)  # a different model


def dspark(target):
    """A random DSpark whose gate cuts each block where its own drafts make the survival fall below 0.3."""
    torch.manual_seed(0)
    cfg = dspark_config(target, block_size=3, markov_rank=4, mask_token_id=5, target_layer_ids=[-1, 0])
    model = DSparkModel(cfg)
    with torch.no_grad():  # a slot's confidence from the token before it alone, 0.2 to 0.74
        proj = model.confidence_head.proj
        proj.weight[:, : target.hidden_size].zero_()
        proj.weight.mul_(10)
        proj.bias.fill_(1.0)
    drafter = DSparkDrafter(model, markov=True, gate=0.3)
    assert drafter.mask_token_id < VOCAB
    return drafter


def dflash(target):
    torch.manual_seed(0)
    drafter = DFlashDrafter(DFlashModel(draft_config(target, block_size=4, mask_token_id=5, target_layer_ids=[0, 1])))
    assert drafter.mask_token_id < VOCAB
    return drafter


def branched(firsts) -> bool:
    """Every first round's tree gave some node two children."""
    return all(len(set(r.parents)) < len(r.parents) for r in firsts)


@dataclass
class Case:
    drafter: Callable  # target -> drafter
    prompt: list[int]
    sampling: sd.Sampling
    k: int = 0
    tree: sd.TreeSpec | None = None
    shape: Callable = lambda firsts: True  # the first rounds' traces -> whether the case did what it is for


CASES = {
    "draft_model": Case(draft_model, PROMPT, sd.Sampling(temperature=1.0), k=2),
    "draft_model-top_k-top_p": Case(draft_model, PROMPT, sd.Sampling(temperature=0.8, top_k=4, top_p=0.9), k=2),
    # no q: each draft verified as one-hot (max_cached_requests=0: every run drafts from its own prompt only)
    "suffix": Case(lambda t: sd.SuffixDrafter(max_cached_requests=0), PATTERN, sd.Sampling(temperature=1.0), k=2,
                   shape=lambda firsts: all(r.drafts == [3, 5] for r in firsts)),
    # k = 3 drafts, of which the gate kept a number that depends on the drafts themselves
    "dspark-markov-gate": Case(dspark, PROMPT, sd.Sampling(temperature=0.8, top_p=0.95), k=3,
                               shape=lambda firsts: len({len(r.drafts) for r in firsts}) > 1),
    # the target drafting for itself: a node's children are its likeliest tokens, so each rejected sibling
    # changes most what the next one is tested against (the residual)
    "tree": Case(lambda t: sd.DraftModelDrafter(t.model, t), PROMPT, sd.Sampling(temperature=1.0),
                 tree=sd.TreeSpec(nodes=5, depth=2, branch=3),
                 shape=branched),
    # a block drafter's tree: each slot's candidates, ranked by its sampled distribution
    "dflash-tree": Case(dflash, PROMPT, sd.Sampling(temperature=0.8), tree=sd.TreeSpec(nodes=8, depth=3, branch=2),
                        shape=branched),
}


def run(target, drafter, case: Case, seed: int) -> sd.Generation:
    """One sampled run of `case`: depth + 1 tokens, room for the first round to draft its whole depth."""
    depth = case.tree.depth if case.tree else case.k
    return sd.generate(target, case.prompt, drafter, k=case.k, tree=case.tree, max_new_tokens=depth + 1,
                       sampling=case.sampling, seed=seed, keep_trace=True)


def p_value(observed, expected) -> float:
    """Chi-square goodness of fit of counts [N] to expected counts [N] (cells expected < 5 pooled into one)."""
    keep = expected >= 5
    obs = torch.cat([observed[keep], observed[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


@pytest.mark.parametrize("name", CASES)
def test_speculative_sampling_matches_target_distribution(name):
    case = CASES[name]
    target_model = tiny_llama(VOCAB, seed=1, hidden=16)
    target_model.generation_config.eos_token_id = None  # no EOS: every run gives max_new_tokens tokens
    target = sd.Target(target_model, tokenizer=None)
    drafter = case.drafter(target)
    n = 1000  # 36 cells of two tokens, about 28 draws each: a wrong rule shows as p far below 1e-3
    outs = [run(target, drafter, case, seed) for seed in range(n)]
    counts = torch.zeros(VOCAB, VOCAB)
    for out in outs:
        counts[out.tokens[0], out.tokens[1]] += 1
    expected = exact_two_token_distribution(target_model, case.prompt, case.sampling).flatten() * n
    assert counts.flatten()[expected == 0].sum() == 0, "sampled a pair the target gives probability 0"
    assert p_value(counts.flatten(), expected) > 1e-3
    assert sum(out.stats.num_accepted_tokens for out in outs) > 0  # the drafts were actually used
    assert case.shape([out.trace[0] for out in outs]), f"{name} did not draft as this case needs"
    assert run(target, drafter, case, 0).tokens == outs[0].tokens  # the same seed, the same output
