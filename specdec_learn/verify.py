"""Verification: which drafted tokens the target keeps, and the next token.

The target has scored ``[last, d1..dk]`` in one forward pass, giving k+1
rows of logits: row i is the target's distribution for the token that follows
d_i (row 0 follows `last`). Verification walks the drafts left to right and
stops at the first one it rejects. It then emits one more token from the
target itself: a *recovered* token at the rejected position, or, if every
draft survived, a *bonus* token from row k. So every round yields between 1
and k+1 tokens, and a round with no drafter (k = 0) is plain decoding.

Drafts usually form a chain (d_i follows d_{i-1}); they may also form a
tree, several continuations verified at once (tree.py), and both rules walk
it from the root the same way. Two rules, both exact:

* **Greedy** (temperature 0): keep d_i while it equals argmax of row i-1.
  The output is then, token for token, what greedy decoding would write.
* **Rejection sampling** (Leviathan et al. 2023; Chen et al. 2023): keep d_i
  with probability min(1, p(d_i) / q(d_i)); on rejection, draw from the
  normalised residual max(p - q, 0). Each output token is then distributed
  exactly as p, whatever q was. A drafter that gives no q (n-gram, or a
  greedy drafter) is treated as one-hot on its token: accept with
  probability p(d_i), and on rejection draw from p with d_i removed.

(vLLM draws the recovered token with the exponential trick,
argmax (p-q)+ / E with E ~ Exp(1); that samples the same distribution as the
``multinomial`` below.)
"""

from __future__ import annotations

import torch

from .sampling import Sampling, probabilities, sample
from .tree import chain_parents, children


def greedy_accept(drafts: list[int], logits: torch.Tensor, parents: list[int] | None = None) -> tuple[list[int], int]:
    """drafts (k ids), logits [k+1, V] -> (the accepted drafts' indices, next token).

    Walk from `last` (row 0): take the target's argmax there; if a draft
    continuing the walk holds it, keep that draft and go on from its row,
    else stop. The next token is the argmax where the walk stopped: the
    correction at the first mismatch, or the bonus token after the last draft.
    `parents` makes the drafts a tree (tree.py; None: a chain, d_i after
    d_{i-1}); the kept drafts are then one root-to-node path.
    """
    parents = chain_parents(len(drafts)) if parents is None else parents
    choice = logits.argmax(-1).tolist()  # [k+1] the target's own greedy picks
    path, node = [], -1  # node -1 is `last`, row 0; draft i is row i + 1
    while True:
        token = choice[node + 1]
        kept = next((i for i in children(parents, node) if drafts[i] == token), None)
        if kept is None:
            return path, token
        path.append(kept)
        node = kept


def rejection_accept(
    drafts: list[int],
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
    parents: list[int] | None = None,
) -> tuple[list[int], int]:
    """Lossless speculative sampling -> (the accepted drafts' indices, next token).

    drafts: k ids; q: [k, V] the draft distributions they were sampled from,
    or None for a drafter without probabilities (one-hot q);
    p: [k+1, V] the target distributions after temperature / top-k / top-p.
    On a tree (`parents`), a node's children are tried in turn: each rejection
    leaves the residual max(p - q, 0) as the distribution the next child is
    tested against (SpecInfer's multi-round rejection), and when every child
    is rejected the next token is drawn from what is left.
    """
    k = len(drafts)
    parents = chain_parents(k) if parents is None else parents
    if q is None:  # no draft probabilities: q is one-hot on each draft token
        q = torch.zeros_like(p[:k])
        q[torch.arange(k), torch.tensor(drafts, dtype=torch.long)] = 1.0
    path, node = [], -1  # node -1 is `last`, row 0; draft i is row i + 1
    while True:
        target = p[node + 1]  # what the target wants after the path so far
        kept = None
        for i in children(parents, node):
            x = drafts[i]
            u = torch.rand((), generator=generator, dtype=torch.float64)
            if q[i, x] > 0 and target[x] / q[i, x] >= u:
                kept = i  # accepted: target(x) >= u * q(x)
                break
            residual = (target - q[i]).clamp_min(0)  # where the target wants more mass than the draft gave
            if residual.sum() <= 0:  # only reachable through rounding: target == q
                residual = target
            target = residual / residual.sum()
        if kept is None:  # no child (the bonus token), or every child rejected (the recovered token)
            return path, sample(target, generator)
        path.append(kept)
        node = kept


def accept(
    drafts: list[int],
    q: torch.Tensor | None,
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    parents: list[int] | None = None,
) -> tuple[list[int], int]:
    """Pick the rule for this request: greedy, or rejection sampling on p. -> (accepted path, next token)."""
    if sampling.greedy:
        return greedy_accept(drafts, logits, parents)
    # The random draws use a CPU generator (reproducible on any device); k+1 rows are cheap to move.
    q = q.float().cpu() if q is not None else None
    return rejection_accept(drafts, q, probabilities(logits.cpu(), sampling), generator, parents)
