"""Lossless: every drafter's greedy output equals plain decoding, token for token.

The pattern of HF's `test_assisted_decoding_matches_greedy_search`: a drafter
that is always right (the target drafting for itself) and one that is almost
always wrong (a tiny random model) must both reproduce plain greedy decoding,
on real prompts, in fp32.
"""

import pytest
import torch

import specdec_learn as sd
from conftest import MAX_NEW, check_parity, prompts_for, same_path, tiny_llama


@pytest.fixture(scope="module")
def ar_outputs(ar_greedy):
    return ar_greedy  # plain greedy decoding of real_prompts, MAX_NEW tokens each (conftest)


def test_ar_loop_equals_hf_generate(target, real_prompts, ar_outputs):
    for prompt, ar in list(zip(real_prompts, ar_outputs))[:4]:
        ids = torch.tensor([ar.prompt_ids])
        ref = target.model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1] :].tolist()
        assert ar.tokens == ref


def test_some_prompt_stops_at_eos(target, ar_outputs):
    stopped = [o for o in ar_outputs if o.tokens[-1] in target.eos_ids]
    assert stopped and all(len(o.tokens) < MAX_NEW for o in stopped)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ngram_is_lossless(target, real_prompts, ar_outputs, k):
    stats = check_parity(target, prompts_for(k, real_prompts), prompts_for(k, ar_outputs), sd.NgramDrafter(), k)
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0


@pytest.mark.parametrize("k", [1, 3, 5])
def test_target_drafting_for_itself_is_always_accepted(target, real_prompts, ar_outputs, k):
    drafter = sd.DraftModelDrafter(target.model, target)
    stats = check_parity(target, same_path(real_prompts), same_path(ar_outputs), drafter, k)
    assert stats.draft_acceptance_rate == 1.0
    assert stats.mean_acceptance_length > k  # k + 1 but for the budget-clipped last rounds


@pytest.mark.parametrize("k", [1, 3, 5])
def test_random_tiny_draft_model_is_almost_never_accepted(target, real_prompts, ar_outputs, k):
    drafter = sd.DraftModelDrafter(tiny_llama(target.vocab_size, seed=3), target)
    stats = check_parity(target, same_path(real_prompts), same_path(ar_outputs), drafter, k)
    assert stats.draft_acceptance_rate < 0.05
