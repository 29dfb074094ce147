"""N-gram drafting ("prompt lookup"): copy what followed the last time.

Text often repeats itself: code re-uses identifiers, answers quote the
question, a summary copies phrases from its source. The n-gram drafter needs
no model at all. It takes the last n tokens of the sequence, looks for an
earlier place where the same n tokens occur, and proposes the k tokens that
followed them there.

It tries the longest n first (``max_n`` down to ``min_n``), because a longer
match is better evidence, and among equal-length matches it takes the most
recent one. Its drafts carry no probabilities, so under sampling they are
verified as one-hot guesses. As a tree (`propose_tree`), it drafts what
followed every earlier match at once, merged into a tree whose branches are
ranked by how many matches they continue.

vLLM calls this method ``ngram`` with ``prompt_lookup_min`` / ``prompt_lookup_max``;
HF ``generate`` calls it ``prompt_lookup_num_tokens`` (Saxena 2023).
"""

from __future__ import annotations

from ..tree import best_first
from .base import Drafter, Proposal


def find_continuation(ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of ids' last n tokens."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[-n:]
        # scan right to left for the most recent earlier occurrence of `suffix`
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start : start + n] == suffix:
                return ids[start + n : start + n + k]
    return []


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"Need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}.")
        self.min_n, self.max_n = min_n, max_n

    can_branch = True

    @classmethod
    def build(cls, target, draft, options) -> NgramDrafter:
        """The recipe's n-gram drafter: match lengths options.ngram = (min_n, max_n)."""
        return cls(*options.ngram)

    def propose(self, state, k, sampling, generator) -> Proposal:
        return Proposal(find_continuation(state.ids, k, self.min_n, self.max_n))

    def propose_tree(self, state, tree, sampling, generator) -> Proposal:
        """Every earlier match's continuation, merged: a token that followed more matches ranks higher."""
        found = continuations(state.ids, tree.depth, self.min_n, self.max_n)
        tokens, parents, _ = best_first(lambda path: counted_children(found, path), tree)
        return Proposal(tokens, parents=parents)


def continuations(ids: list[int], depth: int, min_n: int, max_n: int) -> list[list[int]]:
    """What followed EVERY earlier occurrence of ids' longest matched suffix (up to `depth` tokens), latest first."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[-n:]
        found = [ids[s + n : s + n + depth] for s in range(len(ids) - n - 1, -1, -1) if ids[s : s + n] == suffix]
        if found:
            return found
    return []


def counted_children(sequences: list[list[int]], path: list[int]) -> list[tuple[int, float]]:
    """Among `sequences` that start with `path`, the tokens that come next, with their shares (most common first)."""
    through = [s for s in sequences if s[: len(path)] == path and len(s) > len(path)]
    counts: dict[int, int] = {}
    for s in through:  # dicts keep insertion order: ties go to the latest occurrence
        counts[s[len(path)]] = counts.get(s[len(path)], 0) + 1
    return sorted(((t, c / len(through)) for t, c in counts.items()), key=lambda tc: -tc[1])
