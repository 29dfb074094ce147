"""Suffix decoding: draft from a suffix structure over everything seen so far.

N-gram drafting (ngram.py) copies what followed the *most recent* earlier
match of the last few tokens. Suffix decoding (Oliaro et al. 2024,
"SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications")
keeps two structures instead, and asks them what *usually* follows:

* a per-request tree over this request's prompt and output so far, and
* a global tree over the outputs of earlier requests.

Agent loops and code-editing sessions send the same model near-identical
requests again and again: the answer to the tenth "rename this variable" looks
much like the ninth. The global tree remembers those answers; the n-gram
drafter forgets everything when a prompt ends.

The structure here is a depth-bounded suffix trie: every substring of the
inserted text of at most ``max_depth`` tokens is a path from the root, and
each node counts how often its substring occurred. To draft:

1. match: find the longest suffix of the current sequence (the "pattern",
   ``min_match`` to ``max_depth / 2`` tokens) that is a path in the trie and
   was followed by something;
2. speculate: from the node where the pattern ends, keep stepping to the child
   seen most often. The child's share of its siblings' counts estimates the
   probability that the target continues that way; multiply the shares along
   the path and stop once the product drops below ``min_token_prob``, or
   after ``max_spec_factor × pattern length`` tokens (a short match is weak
   evidence: it may only speculate a little), or k tokens.

Both trees propose; the proposal with the larger expected number of accepted
tokens (the sum of the path probabilities) wins.

The paper builds a speculation *tree* and verifies it with tree attention;
so does `propose_tree` (tree.py): the most frequent continuations, expanded
best first by their cumulative probability. As a chain (`propose`) it takes
the single most likely path, the tree's greedy branch. Like every drafter
here its drafts only propose: the target verifies, and greedy output is the
target's own.

vLLM offers this method as ``suffix`` (through the Arctic Inference package)
with the same knobs and defaults: ``suffix_decoding_max_tree_depth`` (24: the
pattern and the speculation together), ``suffix_decoding_max_spec_factor``
(1.0), ``suffix_decoding_min_token_prob`` (0.1) and
``suffix_decoding_max_cached_requests`` (10000, evicted first in, first out).

Glossary: *pattern* = the matched suffix of the sequence; *spec factor* =
draft tokens allowed per matched token; *global tree* = earlier requests'
outputs, *local tree* = this request's prompt and output.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..tree import best_first
from .base import Drafter, Proposal


@dataclass
class Node:
    count: int = 0  # occurrences of the substring that ends here
    children: dict[int, "Node"] = field(default_factory=dict)


class SuffixTrie:
    """Every substring of the inserted sequences up to `max_depth` tokens, with occurrence counts.

    A growing sequence (this request) is appended one token at a time: `open`
    holds the nodes of the suffixes that end at the last token (one per start
    position, at most max_depth of them), so a token costs max_depth steps.
    A finished sequence (an earlier output) is counted whole with `add`.
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node()
        self.open: list[Node] = []  # nodes of the suffixes ending at the last token, shortest first

    def append(self, token: int) -> None:
        """Extend the current sequence by one token: every suffix ending there gains one count."""
        extended = []
        for node in [self.root] + self.open[: self.max_depth - 1]:
            child = node.children.setdefault(token, Node())
            child.count += 1
            extended.append(child)
        self.open = extended

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.append(t)

    def add(self, sequence: list[int], delta: int = 1) -> None:
        """Count every substring of a whole, separate sequence (delta=-1 takes it out again)."""
        for start in range(len(sequence)):
            node = self.root
            for t in sequence[start : start + self.max_depth]:
                child = node.children.setdefault(t, Node())
                child.count += delta
                if child.count == 0:  # nothing left that passes through here
                    del node.children[t]
                    break
                node = child

    def find(self, pattern: list[int]) -> Node | None:
        """The node of `pattern`, or None if it never occurred."""
        node = self.root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node


@dataclass
class Speculation:
    tokens: list[int]
    score: float  # expected accepted tokens: the sum of the path's cumulative probabilities
    match_len: int


def match(trie: SuffixTrie, ids: list[int], min_match: int) -> tuple[Node | None, int]:
    """The node of the longest suffix of `ids` the trie saw continued, and its length (None, 0: no such suffix).

    Patterns use at most half the depth, so that as many tokens remain below
    them to speculate; a suffix seen only at the very end (nothing followed it
    yet) does not count.
    """
    for n in range(min(trie.max_depth // 2, len(ids)), min_match - 1, -1):
        node = trie.find(ids[-n:])
        if node is not None and node.children:
            return node, n
    return None, 0


def speculate(trie: SuffixTrie, ids: list[int], k: int, min_match: int, max_spec_factor: float,
              min_token_prob: float) -> Speculation:
    """The most frequent continuation of the longest suffix of `ids` that the trie has seen continued."""
    node, n = match(trie, ids, min_match)
    if node is None:
        return Speculation([], 0.0, 0)
    limit = min(k, int(max_spec_factor * n), trie.max_depth - n)
    tokens, prob, score = [], 1.0, 0.0
    while len(tokens) < limit and node.children:
        total = sum(child.count for child in node.children.values())
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        prob *= child.count / total
        if prob < min_token_prob:
            break
        tokens.append(token)
        score += prob
        node = child
    return Speculation(tokens, score, n)


def grow_tree(trie: SuffixTrie, ids: list[int], spec, min_match: int, max_spec_factor: float,
              min_token_prob: float) -> tuple[list[int], list[int], float]:
    """The trie's most frequent continuations as a tree: (tokens, parents, expected accepted tokens)."""
    node, n = match(trie, ids, min_match)
    if node is None:
        return [], [], 0.0

    def expand(path):
        at = node
        for t in path:
            at = at.children[t]
        total = sum(child.count for child in at.children.values())
        ranked = sorted(at.children.items(), key=lambda item: -item[1].count)
        return [(t, child.count / total) for t, child in ranked]

    depth = min(int(max_spec_factor * n), trie.max_depth - n)
    tokens, parents, scores = best_first(expand, spec, max_depth=depth, min_score=min_token_prob)
    return tokens, parents, sum(scores)


class SuffixDrafter(Drafter):
    """Suffix decoding with a local (this request) and a global (earlier outputs) suffix trie.

    The drafter object is the cache: keep one across requests and it learns
    from their outputs (a new `start` files the previous output in the global
    trie). `forget()` empties the global trie.
    """

    name = "suffix"

    def __init__(self, max_depth: int = 24, min_match: int = 1, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, max_cached_requests: int = 10_000):
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2 (a pattern and one token after it), got {max_depth}.")
        if not 1 <= min_match <= max_depth // 2:
            raise ValueError(f"Need 1 <= min_match <= max_depth // 2 (patterns use at most half the depth), "
                             f"got min_match={min_match}, max_depth={max_depth}.")
        if max_spec_factor <= 0 or not 0 <= min_token_prob <= 1:
            raise ValueError(f"Need max_spec_factor > 0 and 0 <= min_token_prob <= 1, "
                             f"got {max_spec_factor} and {min_token_prob}.")
        self.max_depth, self.min_match = max_depth, min_match
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob
        self.max_cached_requests = max_cached_requests
        self.forget()

    @classmethod
    def build(cls, target, draft, options) -> SuffixDrafter:
        """A fresh drafter per recipe: its global tree learns across one run's requests, never across runs."""
        return cls()

    def forget(self) -> None:
        """Drop every earlier request's output (an empty global trie)."""
        self.global_trie = SuffixTrie(self.max_depth)
        self.cached_outputs: deque[list[int]] = deque()  # oldest first
        self.local: SuffixTrie | None = None
        self._request: tuple[object, int] | None = None  # (state, prompt length) of the request in flight

    def start(self, target, state, hidden) -> None:
        self._file_previous_output()
        self.local = SuffixTrie(self.max_depth)
        self.local.extend(state.ids)
        self._seen = len(state.ids)
        self._request = (state, state.prompt_len)

    def propose(self, state, k, sampling, generator) -> Proposal:
        self.local.extend(state.ids[self._seen :])  # tokens committed since the last proposal
        self._seen = len(state.ids)
        args = (state.ids, k, self.min_match, self.max_spec_factor, self.min_token_prob)
        best = max(speculate(self.local, *args), speculate(self.global_trie, *args), key=lambda s: s.score)
        return Proposal(best.tokens)

    can_branch = True

    def propose_tree(self, state, tree, sampling, generator) -> Proposal:
        """The paper's speculation tree: both tries grow one, the one expected to keep more tokens wins."""
        self.local.extend(state.ids[self._seen :])
        self._seen = len(state.ids)
        args = (state.ids, tree, self.min_match, self.max_spec_factor, self.min_token_prob)
        tokens, parents, _ = max(grow_tree(self.local, *args), grow_tree(self.global_trie, *args), key=lambda t: t[2])
        return Proposal(tokens, parents=parents)

    def _file_previous_output(self) -> None:
        """The request that just ended joins the global trie (its output only: prompts differ).

        Past `max_cached_requests` the oldest output leaves (first in, first out).
        """
        if self._request is None or self.max_cached_requests == 0:
            return
        state, prompt_len = self._request
        output = list(state.ids[prompt_len:])
        self.global_trie.add(output)
        self.cached_outputs.append(output)
        if len(self.cached_outputs) > self.max_cached_requests:
            self.global_trie.add(self.cached_outputs.popleft(), delta=-1)
        self._request = None
