"""Token trees: draft several continuations at once, verify all of them in one target pass.

A chain of drafts bets everything on the drafter's first guess at every
position. A learned drafter that is wrong at position 1 is often right with
its second or third guess; a tree keeps those guesses too. SpecInfer (Miao et
al. 2024), Medusa (Cai et al. 2024) and EAGLE-2 (Li et al. 2024) verify a
*tree* of candidates in a single forward pass. On a memory-bound target (a
large model on a GPU) a pass over 16 rows costs little more than a pass over
4 (chapter 1); on a small target on a CPU it costs noticeably more, which
decides whether a tree pays (chapter 14 measures both sides).

**The tree.** Draft tokens ``tokens[i]`` with ``parents[i]``, the index of
the node they continue; -1 is the root, the committed token ``last``. Nodes
come parent first. A chain is the tree where node i's parent is i - 1.

**One pass.** The target scores ``[last, node 0, node 1, ...]`` with a mask in
which every row sees the cache, the root, its own ancestors and itself, and
nothing else; each row sits at position (cache length + its depth). Row 0 is
the target's distribution after ``last``, row 1 + i after node i: exactly
what running node i's root-to-node path as a chain would give
(tests/test_tree.py checks this on the embedded model).

**Acceptance** walks from the root (verify.py): greedy follows the target's
argmax while a child holds it; sampling tries a node's children in order
with recursive rejection sampling, so the output is still distributed as the
target's. The accepted nodes form one root-to-node path; the target keeps
only their keys and values (``Target.commit`` gathers them, then the path is
the cache's new end), and drafters that read the target's hidden states see
the path's rows.

**Building trees** (`best_first`): EAGLE-2's rule. Every candidate node has a
score, the product of the drafter's probabilities along its path (its
estimated chance of being accepted). Keep expanding the highest-scoring
candidate until the node budget is spent. Drafters supply the candidates:
the block drafters from each slot's distribution, suffix decoding from its
trie's counts, n-gram lookup from every earlier match. Drafters that need a
forward pass per step (EAGLE-3, a draft model) grow the tree depth by depth
instead, one batched step per depth (`dynamic_tree`, as EAGLE-2 does), each
node seeing only its ancestors (`ancestor_mask`).

vLLM once took a static tree, ``speculative_token_tree`` (the root-to-node
paths as tuples of child ranks, EAGLE only), and removed it with its tree
attention in May 2026 (vllm-project/vllm#42121): its serving path verifies
chains. Here a tree is grown per round from ``TreeSpec(nodes, depth, branch)``.

Glossary: *node budget* = draft tokens verified per round; *branch* = the
most children one node may get; *path* = the accepted nodes, root first.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeSpec:
    """How big a tree a drafter may grow each round."""

    nodes: int = 16  # draft tokens per round (the tree's size, root not counted)
    depth: int = 4  # the longest root-to-node path: the most tokens a round can accept, minus one
    branch: int = 4  # the most children per node

    def __post_init__(self):
        for name in ("nodes", "depth", "branch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"tree {name} must be a whole number >= 1, got {value!r}: e.g. "
                                 f"TreeSpec(nodes=16, depth=4, branch=4), on the command line --tree 16,4,4.")

    @classmethod
    def parse(cls, text: str) -> "TreeSpec":
        """'16,4' or '16,4,4' (nodes, depth[, branch]) -> TreeSpec."""
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            values = []
        if not 1 <= len(values) <= 3:
            raise ValueError(f"--tree takes nodes,depth[,branch] as whole numbers, e.g. --tree 16,4,4; got {text!r}.")
        return cls(*values)


def chain_parents(k: int) -> list[int]:
    """The parents of a chain of k drafts: node i continues node i - 1."""
    return list(range(-1, k - 1))


def is_chain(parents: list[int]) -> bool:
    return parents == chain_parents(len(parents))


def children(parents: list[int], node: int) -> list[int]:
    """The children of `node` (-1: the root), in the order the drafter ranked them."""
    return [i for i, p in enumerate(parents) if p == node]


def depths(parents: list[int]) -> list[int]:
    """Each node's depth: the root's children are at depth 1."""
    out: list[int] = []
    for p in parents:
        if p >= len(out):
            raise ValueError(f"tree nodes must come after their parents; parents = {parents}.")
        out.append(1 if p < 0 else out[p] + 1)
    return out


def causal_mask(past: int, n: int, dtype, device) -> torch.Tensor:
    """Additive mask [1, 1, n, past+n] of a chain: new row i sees the cache and new rows 0..i."""
    allowed = torch.ones(n, past + n, dtype=torch.bool, device=device).tril(diagonal=past)
    return additive(allowed, dtype)[None, None]


def tree_mask(parents: list[int], past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive attention mask [1, 1, n+1, past+n+1] for [root, node 0..n-1] after `past` cached tokens.

    Row 0 (the root) and row 1+i (node i) see the cache, the root, their
    ancestors and themselves; everything else gets the dtype's lowest value.
    """
    n = len(parents)
    allowed = torch.zeros(n + 1, past + n + 1, dtype=torch.bool, device=device)
    allowed[:, : past + 1] = True  # the cache and the root
    for i, p in enumerate(parents):
        allowed[1 + i] = allowed[1 + p] if p >= 0 else allowed[0]  # what the parent sees ...
        allowed[1 + i, past + 1 + i] = True  # ... and itself
    return additive(allowed, dtype)[None, None]


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = may attend) as the additive mask attention adds to its scores: 0, or dtype's lowest value.

    The dtype's lowest finite value rather than -inf: a row that sees nothing
    then softmaxes to a uniform row instead of NaN (what transformers does).
    """
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def tree_positions(parents: list[int], past: int, device) -> torch.Tensor:
    """Position ids [1, n+1]: the root at `past`, a node at past + its depth."""
    return torch.tensor([[past] + [past + d for d in depths(parents)]], dtype=torch.long, device=device)


def best_first(expand, spec: TreeSpec, max_depth: int | None = None,
               min_score: float = 0.0) -> tuple[list[int], list[int], list[float]]:
    """Grow a tree of at most spec.nodes nodes, always adding the most probable candidate next.

    expand(path_tokens) -> [(token, probability), ...]: the drafter's ranked
    guesses for what follows the root-to-node path `path_tokens` (the root
    itself: []). A candidate's score is the product of the probabilities on
    its path, its estimated chance of being accepted; expanding by that score
    is EAGLE-2's dynamic tree. Candidates scoring below `min_score` are never
    added. Returns (tokens, parents, scores), nodes in the order they were
    added (so parents come first, and siblings in order of score).
    """
    depth_limit = spec.depth if max_depth is None else min(spec.depth, max_depth)
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    paths: list[list[int]] = []  # each node's tokens from the root
    frontier: list[tuple[float, int, int, int]] = []  # (-score, tie-break, parent node, token): a max-heap
    order = itertools.count()  # equal scores: the earlier offer first

    def offer(parent: int, path: list[int], score: float) -> None:
        if len(path) >= depth_limit:
            return
        for token, prob in expand(path)[: spec.branch]:
            if score * prob > min_score:
                heapq.heappush(frontier, (-score * prob, next(order), parent, token))

    offer(-1, [], 1.0)
    while frontier and len(tokens) < spec.nodes:
        neg, _, parent, token = heapq.heappop(frontier)
        path = (paths[parent] if parent >= 0 else []) + [token]
        tokens.append(token)
        parents.append(parent)
        scores.append(-neg)
        paths.append(path)
        offer(len(tokens) - 1, path, -neg)
    return tokens, parents, scores


def dynamic_tree(root: torch.Tensor, step, spec: TreeSpec,
                 vocab: torch.Tensor | None = None) -> tuple[list[int], list[int]]:
    """EAGLE-2's dynamic tree for a drafter that runs step by step: one batched step per depth.

    `best_first` asks for one node's children at a time; a drafter that must
    run a forward pass to get them would pay one pass per node. Here the
    drafter runs once per depth instead. root [V']: its distribution after
    `last`. At each depth every node run so far has offered its `spec.branch`
    most likely children (score = the product of probabilities along the
    path); the `spec.branch` best of the new ones run together,
    step(run, tokens, parents, depth) -> their children's distributions
    [len(run), V']. The tree is the `spec.nodes` best-scoring candidates of
    all: a score only falls along a path, so a chosen node's parent is chosen
    too. vocab [V']: the target id of each column (a reduced draft
    vocabulary); None when the columns are the target's ids.
    Returns (tokens, parents), parents first.
    """
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    frontier = [(-1, root, 1.0)]  # (node, the distribution of its children [V'], its score)
    for depth in range(1, spec.depth + 1):
        offered = []
        for node, probs, score in frontier:
            for column, p in top_candidates(probs, spec.branch):
                tokens.append(column if vocab is None else int(vocab[column]))
                parents.append(node)
                scores.append(score * p)
                offered.append(len(tokens) - 1)
        if depth == spec.depth or not offered:
            break
        run = sorted(offered, key=lambda c: -scores[c])[: spec.branch]
        probs = step(run, tokens, parents, depth)  # [len(run), V']
        frontier = [(c, probs[i], scores[c]) for i, c in enumerate(run)]
    keep = sorted(sorted(range(len(tokens)), key=lambda c: -scores[c])[: spec.nodes])  # back in creation order
    index = {c: i for i, c in enumerate(keep)}
    return [tokens[c] for c in keep], [index[parents[c]] if parents[c] >= 0 else -1 for c in keep]


def ancestor_mask(run: list[int], parents: list[int], rows: dict[int, int], total: int, device) -> torch.Tensor:
    """Which of a drafter's `total` cache rows each node in `run` sees among the tree's rows: [len(run), total] bool.

    rows[node]: the cache row where a node that already ran sits (the nodes in
    `run` must have theirs). A node sees itself and its ancestors; the
    committed rows before the tree are the caller's to allow.
    """
    mask = torch.zeros(len(run), total, dtype=torch.bool, device=device)
    for i, node in enumerate(run):
        while node >= 0:
            mask[i, rows[node]] = True
            node = parents[node]
    return mask


def top_candidates(probs: torch.Tensor, branch: int) -> list[tuple[int, float]]:
    """A distribution [V] -> its `branch` most likely (token, probability) pairs."""
    values, ids = torch.topk(probs.float(), min(branch, probs.shape[-1]))
    return list(zip(ids.tolist(), values.tolist()))
