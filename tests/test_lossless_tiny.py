"""Lossless on a tiny random target: greedy output equals plain decoding, token for token, whether the
drafter is never right, always right, or right some of the time.

The pattern of HF's `test_assisted_decoding_matches_greedy_search`. The verifier alone decides the
output, so the real model's weights are not needed to check each drafter's part of the loop (its
caches, its rollback after a rejection, k up to its block): a tiny random Llama runs it in a fraction
of the time. test_parity.py keeps the real-model checks where the text decides what is kept.
Prompts are token ids: PROMPT repeats a pattern, so that n-gram and suffix drafts are partly kept;
EOS_PROMPT's output stops at EOS, inside an accepted block when the target drafts for itself.
"""

import pytest
import torch
from conftest import greedy_equals_ar, learned_drafter, tiny_llama, tiny_target

import specdec_learn as sd
from specdec_learn.drafters.dspark import DSparkDrafter, DSparkModel, dspark_config
from specdec_learn.drafters.gemma4_mtp import Gemma4AssistantDrafter, random_assistant
from specdec_learn.drafters.mtp import MTPDrafter, random_mtp_head

PROMPT = [5, 9, 14, 3, 27, 8, 5, 9, 14, 3, 27, 8, 40, 41, 5, 9, 14, 3, 27, 8, 12, 30, 5, 9]
EOS_PROMPT = [34, 42, 70, 76, 104, 120]
PROMPTS = (PROMPT, EOS_PROMPT)
MAX_NEW = 32


@pytest.fixture(scope="module")
def tiny():
    """Four layers: room for the learned drafters' taps below the last one (DSpark refuses that one)."""
    return tiny_target(layers=4)


@pytest.fixture(scope="module")
def ar(tiny):
    """Plain greedy decoding of PROMPTS: the reference."""
    return [sd.generate(tiny, prompt, max_new_tokens=MAX_NEW) for prompt in PROMPTS]


def lossless(tiny, ar, drafter, ks):
    """Greedy output equal to AR on every prompt at every k; the summed stats."""
    total = sd.Stats()
    for prompt, reference in zip(PROMPTS, ar):
        total = total + greedy_equals_ar(tiny, prompt, MAX_NEW, reference, drafter, ks)
    return total


def test_one_prompt_runs_the_whole_budget_and_one_stops_at_eos(tiny, ar):
    assert len(ar[0].tokens) == MAX_NEW and not set(ar[0].tokens) & tiny.eos_ids
    assert ar[1].tokens[-1] in tiny.eos_ids and len(ar[1].tokens) < MAX_NEW


# -- never right: random weights, so nearly every round keeps only the target's token -----------------

NEVER_RIGHT = {  # name: (drafter for a target, the k to run)
    "draft_model": (lambda t: sd.DraftModelDrafter(tiny_llama(t.vocab_size, seed=3), t), (1, 3, 5)),
    # one layer, k up to 7: steps past the first reuse it
    "mtp": (lambda t: MTPDrafter(random_mtp_head(t, num_layers=1), t), (1, 2, 4, 7)),
    "mtp_deepseek": (lambda t: MTPDrafter(random_mtp_head(t, num_layers=2, layout="deepseek_v3", seed=1), t),
                     (1, 3, 7)),
    "gemma4_assistant": (lambda t: Gemma4AssistantDrafter(random_assistant(t, hidden_size=64, num_layers=2), t),
                         (1, 3, 5, 7)),
    "eagle3": (lambda t: learned_drafter("eagle3", t), (1, 3, 5)),
    "dflash": (lambda t: learned_drafter("dflash", t, block_size=16), (3, 15)),
}


@pytest.mark.parametrize("name", NEVER_RIGHT)
def test_a_random_drafter_is_lossless(tiny, ar, name):
    make, ks = NEVER_RIGHT[name]
    stats = lossless(tiny, ar, make(tiny), ks)
    assert stats.num_draft_tokens > 0 and stats.draft_acceptance_rate < 0.05  # the drafts were wrong


@pytest.fixture(scope="module")
def dspark(tiny):
    """A random DSpark whose confidence head says 0.6 at every slot: survival 0.6, 0.36, 0.216, ..."""
    torch.manual_seed(0)
    model = DSparkModel(dspark_config(tiny, block_size=7, markov_rank=16))
    with torch.no_grad():
        model.confidence_head.proj.weight.zero_()
        model.confidence_head.proj.bias.fill_(torch.logit(torch.tensor(0.6)).item())
    return model


@pytest.mark.parametrize("markov,gate,k", [(True, None, 3), (False, None, 7), (True, 0.5, 7), (False, 0.3, 7)])
def test_dspark_is_lossless_with_heads_on_and_off(tiny, ar, dspark, markov, gate, k):
    drafter = DSparkDrafter(dspark, markov=markov, gate=gate)
    sizes = []
    for prompt, reference in zip(PROMPTS, ar):
        out = sd.generate(tiny, prompt, drafter, k=k, max_new_tokens=MAX_NEW, keep_trace=True)
        assert out.tokens == reference.tokens, f"markov={markov} gate={gate} k={k} differs from AR"
        sizes += [len(r.drafts) for r in out.trace]
    # Gate 0.5 keeps 1 draft a round, gate 0.3 keeps 2 (fewer only where the budget clips the round);
    # no gate submits all k.
    assert max(sizes) == {None: k, 0.5: 1, 0.3: 2}[gate]


# -- always right: the target drafting for itself -------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 5])
def test_target_drafting_for_itself_is_always_accepted(tiny, ar, k):
    stats = lossless(tiny, ar, sd.DraftModelDrafter(tiny.model, tiny), (k,))
    assert stats.draft_acceptance_rate == 1.0
    assert stats.mean_acceptance_length > k  # k + 1 but for the budget-clipped last rounds


# -- right some of the time: n-gram and suffix on a repeating prompt --------------------------------------


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("make", [sd.NgramDrafter, sd.SuffixDrafter], ids=["ngram", "suffix"])
def test_ngram_and_suffix_keep_part_of_their_drafts_and_are_lossless(tiny, ar, make, k):
    stats = lossless(tiny, ar, make(), (k,))
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # kept AND rolled back
