"""Verification: which drafted tokens the target keeps, and the next token.

The target has scored ``[last, d1..dk]`` in one forward pass, giving k+1
rows of logits: row i is the target's distribution for the token that follows
d_i (row 0 follows `last`). Verification walks the drafts left to right and
stops at the first one it rejects. It then emits one more token from the
target itself: a *recovered* token at the rejected position, or, if every
draft survived, a *bonus* token from row k. So every round yields between 1
and k+1 tokens, and a round with no drafter (k = 0) is plain decoding.

Two rules, both exact:

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


def greedy_accept(drafts: list[int], logits: torch.Tensor) -> tuple[int, int]:
    """drafts (k ids), logits [k+1, V] -> (number accepted n, next token).

    The next token is the target's argmax at row n: the correction at the
    first mismatch, or the bonus token when all k drafts matched.
    """
    choice = logits.argmax(-1).tolist()  # [k+1] the target's own greedy picks
    n = 0
    while n < len(drafts) and drafts[n] == choice[n]:
        n += 1
    return n, choice[n]


def rejection_accept(
    drafts: list[int],
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Lossless speculative sampling.

    drafts: k ids; q: [k, V] the draft distributions they were sampled from,
    or None for a drafter without probabilities (one-hot q);
    p: [k+1, V] the target distributions after temperature / top-k / top-p.
    Returns (number accepted n, next token).
    """
    k = len(drafts)
    if q is None:  # no draft probabilities: q is one-hot on each draft token
        q = torch.zeros_like(p[:k])
        q[torch.arange(k), torch.tensor(drafts, dtype=torch.long)] = 1.0
    for i, x in enumerate(drafts):
        u = torch.rand((), generator=generator, dtype=torch.float64)
        if q[i, x] > 0 and p[i, x] / q[i, x] >= u:
            continue  # accepted: p(x) >= u * q(x)
        residual = (p[i] - q[i]).clamp_min(0)  # where the target wants more mass than the draft gave
        if residual.sum() <= 0:  # only reachable through rounding: p == q
            residual = p[i]
        return i, sample(residual / residual.sum(), generator)
    return k, sample(p[k], generator)  # every draft accepted: the bonus token


def accept(
    drafts: list[int],
    q: torch.Tensor | None,
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Pick the rule for this request: greedy, or rejection sampling on p."""
    if sampling.greedy:
        return greedy_accept(drafts, logits)
    # The random draws use a CPU generator (reproducible on any device); k+1 rows are cheap to move.
    q = q.float().cpu() if q is not None else None
    return rejection_accept(drafts, q, probabilities(logits.cpu(), sampling), generator)
