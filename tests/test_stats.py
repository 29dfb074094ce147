"""Stats on hand-made rounds, checked against vLLM's definitions by hand."""

import math

import pytest

from specdec_learn.stats import Round, Stats


def make(rounds):
    s = Stats()
    for drafted, accepted in rounds:
        s.record(Round(drafted, accepted, draft_time=0.1, verify_time=0.2))
    return s


def test_vllm_definitions_on_hand_made_rounds():
    # three rounds of k = 3: all accepted, first two accepted, none accepted
    s = make([(3, 3), (3, 2), (3, 0)])
    assert s.num_drafts == 3 and s.num_draft_tokens == 9 and s.num_accepted_tokens == 5
    assert s.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert s.per_position_acceptance == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    assert s.draft_acceptance_rate == pytest.approx(5 / 9)
    assert s.draft_time == pytest.approx(0.3) and s.verify_time == pytest.approx(0.6)


def test_rounds_without_drafts_are_not_drafts():
    s = make([(0, 0), (2, 1), (0, 0)])  # e.g. n-gram found no match twice
    assert s.num_rounds == 3 and s.num_drafts == 1
    assert s.mean_acceptance_length == 2.0  # 1 + 1 accepted / 1 draft
    assert s.per_position_acceptance == [1.0, 0.0]


def test_plain_decoding_scores_one():
    s = make([(0, 0)] * 5)
    assert s.mean_acceptance_length == 1.0 and s.per_position_acceptance == [] and s.draft_acceptance_rate == 0.0


def test_per_position_never_increases_and_sums_merge():
    a, b = make([(2, 2), (4, 1)]), make([(1, 0), (3, 3)])
    s = a + b
    assert s.num_drafts == 4 and s.num_accepted_tokens == 6
    assert s.accepted_per_pos == [3, 2, 1, 0]
    rates = s.per_position_acceptance
    assert all(x >= y for x, y in zip(rates, rates[1:]))
    assert s.mean_acceptance_length == pytest.approx(1 + 6 / 4)


def test_throughput_is_total_tokens_over_total_time():
    assert Stats().tok_per_s == 0.0  # nothing timed yet: no division by zero
    s = Stats(num_output_tokens=50, total_time=2.0) + Stats(num_output_tokens=10, total_time=3.0)
    assert s.tok_per_s == 12.0  # 60 tokens in 5 s, not the mean of 25 and 3.3 tok/s


def test_speedup_and_greedy_match_are_against_the_first_record():
    """compare_to_ar: speedup = tok/s over AR's tok/s; greedy match = the share of prompts whose output is AR's."""
    from specdec_learn.stats import Record, compare_to_ar

    ar = Record("ar", 0, Stats(num_output_tokens=40, total_time=4.0), [[1, 2], [3, 4], [5]])  # 10 tok/s
    spec = Record("x", 3, Stats(num_output_tokens=40, total_time=1.6), [[1, 2], [3, 9], [5]])  # 25 tok/s
    records = compare_to_ar([ar, spec])
    assert [r.speedup for r in records] == pytest.approx([1.0, 2.5])
    assert records[0].greedy_match == 1.0 and records[1].greedy_match == pytest.approx(2 / 3)
    untimed = compare_to_ar([Record("ar", 0, Stats(), [[1]]), Record("x", 3, Stats(), [[1]])])
    assert math.isnan(untimed[1].speedup)  # no AR throughput to compare with


def test_costs_are_in_units_of_one_ar_step():
    """c = drafter seconds per drafted token / AR seconds per step; verify cost = seconds per verify round / the same.
    vLLM's records have no times and keep both None."""
    from specdec_learn.stats import Record, compare_to_ar

    ar, spec, vllm = Stats(), Stats(), Stats()
    for _ in range(10):
        ar.record(Round(0, 0, draft_time=0.0, verify_time=0.020))  # 20 ms a step
    for drafted, accepted in [(3, 3), (3, 1), (0, 0)]:  # the last round drafted nothing
        spec.record(Round(drafted, accepted, draft_time=0.006, verify_time=0.025))
    vllm.record(Round(3, 2, draft_time=0.0, verify_time=0.0))
    records = compare_to_ar([Record("ar", 0, ar, [[1]]), Record("x", 3, spec, [[1]]), Record("v", 3, vllm, [[1]])])
    assert records[0].verify_cost == pytest.approx(1.0) and records[0].draft_cost is None
    assert records[1].draft_cost == pytest.approx(3 * 0.006 / 6 / 0.020)  # 18 ms over 6 drafted tokens
    assert records[1].verify_cost == pytest.approx(0.025 / 0.020)
    assert records[2].draft_cost is None and records[2].verify_cost is None
    assert {"draft_cost", "verify_cost"} <= set(records[1].to_json())
