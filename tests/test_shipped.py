"""Every drafter this package ships, built as `specdec --method` builds it, on the real model.

Real weights are the point here: a trained drafter is right often enough that
rounds keep some drafts and reject the rest, so the rollbacks run with the
checkpoint's own shapes, dtypes and vocabulary maps. Greedy output must equal
plain decoding, and some drafts must be accepted (a drafter that loaded the
wrong weights, or none, is never right).
"""

import pytest
from conftest import FULL_K, check_parity, same_path

from specdec_learn.checkpoints import SHIPPED
from specdec_learn.zoo import make_drafter

TARGET = "smollm2-135m"  # conftest's `target`
METHODS = [method for method, name in SHIPPED if name == TARGET]
# DFlash and DSpark draft a whole block in one forward: also k = 7, all of DSpark's block, 7 of DFlash's 15 slots.
BLOCK_K = 7
CASES = [(m, FULL_K) for m in METHODS] + [(m, BLOCK_K) for m in METHODS if m in ("dflash", "dspark")]


def prompts(k: int, items: list) -> list:
    """At k = FULL_K the same_path four (one per workload, partial acceptance, and the EOS stop); at k = 7 the
    first code prompt and the EOS one."""
    four = same_path(items)
    return four if k == FULL_K else [four[0], four[-1]]


@pytest.mark.slow
@pytest.mark.parametrize("method, k", CASES, ids=[f"{m}-k{k}" for m, k in CASES])
def test_shipped_drafter_is_lossless_and_accepted(target, real_prompts, ar_greedy, method, k):
    assert target.name == TARGET
    drafter = make_drafter(method, target)
    stats = check_parity(target, prompts(k, real_prompts), prompts(k, ar_greedy), drafter, k)
    assert stats.num_accepted_tokens > 0, f"the shipped {method} drafter was never right"
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # and rejections were rolled back
