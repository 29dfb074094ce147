"""Lossless on the real model: plain decoding equals HF generate, and n-gram drafting equals plain decoding.

The pattern of HF's `test_assisted_decoding_matches_greedy_search`, on real prompts in the CPU's fast
dtype (HF generate in fp32). Here the text decides how much of each block n-gram lookup keeps, so it
runs on all ten prompts (conftest); drafters that are never or always right, and n-gram at other k,
run on a tiny target in test_lossless_tiny.py, the shipped drafters in test_shipped.py.
"""

import torch

import specdec_learn as sd
from conftest import FULL_K, MAX_NEW, check_parity, same_path


def test_ar_loop_equals_hf_generate(target_fp32, ar_greedy_fp32):
    """Four prompts, one per workload and the one that stops at EOS (conftest.same_path); fp32, where HF's own
    kernels and ours differ by less than a tie."""
    outputs = same_path(ar_greedy_fp32)
    assert outputs[-1].tokens[-1] in target_fp32.eos_ids  # HF's stop at EOS is compared too
    for ar in outputs:
        ids = torch.tensor([ar.prompt_ids])
        ref = target_fp32.model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1] :].tolist()
        assert ar.tokens == ref


def test_some_prompt_stops_at_eos(target, ar_greedy):
    stopped = [o for o in ar_greedy if o.tokens[-1] in target.eos_ids]
    assert stopped and all(len(o.tokens) < MAX_NEW for o in stopped)


def test_ngram_is_lossless(target, real_prompts, ar_greedy):
    stats = check_parity(target, real_prompts, ar_greedy, sd.NgramDrafter(), FULL_K)
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
