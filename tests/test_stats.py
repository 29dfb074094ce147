"""Stats on hand-made rounds, checked against vLLM's definitions by hand."""

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


def test_throughput():
    s = Stats(num_output_tokens=50, total_time=2.0)
    assert s.tok_per_s == 25.0
