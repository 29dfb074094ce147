"""Suffix decoding: the trie counts what it should, drafts the most frequent continuation, and is lossless."""

import pytest

import specdec_learn as sd
from specdec_learn.drafters.suffix import SuffixTrie, speculate

from conftest import FULL_K, MAX_NEW, check_parity, tiny_target


def test_trie_counts_every_bounded_substring():
    trie = SuffixTrie(max_depth=3)
    trie.extend([1, 2, 3, 1, 2, 4])
    assert trie.find([1, 2]).count == 2
    assert {t: n.count for t, n in trie.find([1, 2]).children.items()} == {3: 1, 4: 1}
    assert trie.find([2, 3, 1]).count == 1
    assert trie.find([1, 2, 3, 1]) is None  # longer than max_depth: never stored
    grown = SuffixTrie(max_depth=3)
    grown.add([1, 2, 3, 1, 2, 4])  # a whole sequence counts the same as one grown token by token
    assert _as_dict(grown.root) == _as_dict(trie.root)
    grown.add([1, 2, 3, 1, 2, 4], delta=-1)
    assert grown.root.children == {}


def _as_dict(node):
    return {t: (child.count, _as_dict(child)) for t, child in node.children.items()}


def test_speculation_follows_the_most_frequent_branch_and_stops_when_unlikely():
    trie = SuffixTrie(max_depth=16)
    for seq in ([7, 8, 1, 2, 3], [7, 8, 1, 2, 3], [7, 8, 1, 5, 6], [9, 9]):
        trie.add(seq)
    spec = speculate(trie, [4, 7, 8], k=5, min_match=1, max_spec_factor=4, min_token_prob=0.1)
    assert spec.match_len == 2 and spec.tokens == [1, 2, 3]  # 1 always follows; then 2 (2 of 3) over 5
    assert spec.score == pytest.approx(1 + 2 / 3 + 2 / 3)
    assert speculate(trie, [4, 7, 8], k=5, min_match=1, max_spec_factor=4, min_token_prob=0.7).tokens == [1]
    assert speculate(trie, [4, 7, 8], k=5, min_match=1, max_spec_factor=1, min_token_prob=0.1).tokens == [1, 2]
    assert speculate(trie, [4, 7, 8], k=1, min_match=1, max_spec_factor=4, min_token_prob=0.1).tokens == [1]
    assert speculate(trie, [4, 4], k=5, min_match=1, max_spec_factor=4, min_token_prob=0.1).tokens == []


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_match"):
        sd.SuffixDrafter(max_depth=8, min_match=5)
    with pytest.raises(ValueError, match="max_depth"):
        sd.SuffixDrafter(max_depth=1)


def test_suffix_is_lossless(target, real_prompts, ar_greedy):
    """All ten real prompts at FULL_K; other k on a tiny target (test_lossless_tiny.py)."""
    stats = check_parity(target, real_prompts, ar_greedy, sd.SuffixDrafter(), FULL_K)
    assert stats.num_draft_tokens > 0


def test_global_tree_learns_from_earlier_outputs_and_forgets(target, real_prompts, ar_greedy):
    """The second time a request comes, its whole answer is in the global tree."""
    drafter = sd.SuffixDrafter()
    first = sd.generate(target, real_prompts[0], drafter, k=5, max_new_tokens=MAX_NEW)
    again = sd.generate(target, real_prompts[0], drafter, k=5, max_new_tokens=MAX_NEW)
    assert first.tokens == again.tokens == ar_greedy[0].tokens
    assert len(drafter.cached_outputs) == 1
    assert again.stats.mean_acceptance_length > first.stats.mean_acceptance_length
    assert again.stats.mean_acceptance_length >= 3
    drafter.forget()
    assert not drafter.cached_outputs and drafter.global_trie.root.children == {}


def test_oldest_output_is_evicted():
    tiny, drafter = tiny_target(), sd.SuffixDrafter(max_cached_requests=1)
    outputs = [sd.generate(tiny, [3, 4 + i, 5, 6 + i], drafter, k=2, max_new_tokens=6).tokens for i in range(3)]
    sd.generate(tiny, [3, 9, 5], drafter, k=2, max_new_tokens=6)  # files the third output
    assert len({tuple(o) for o in outputs}) == 3  # three different outputs: which one stayed shows
    assert list(drafter.cached_outputs) == [outputs[2]]
    only = SuffixTrie(drafter.max_depth)
    only.add(outputs[2])
    assert _as_dict(drafter.global_trie.root) == _as_dict(only.root)


def test_every_bench_run_starts_with_an_empty_global_tree(target):
    """Two runs at the same k must see the same drafts: the second may not learn the first one's outputs."""
    from specdec_learn.bench import bench
    from specdec_learn.workloads import load_workload

    prompts = load_workload("edits", n=1)  # run twice: without a fresh tree, the second run would know its answer
    first, second = bench(target, ["suffix"], {"suffix": [2, 2]}, prompts, max_new_tokens=12, progress=False)[1:]
    assert first.stats.num_accepted_tokens == second.stats.num_accepted_tokens
    assert first.outputs == second.outputs
    with pytest.raises(ValueError, match="No draft lengths given for ngram"):
        bench(target, ["suffix", "ngram"], {"suffix": [2]}, prompts, max_new_tokens=4, progress=False)
