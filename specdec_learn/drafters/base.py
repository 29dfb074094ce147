"""What every drafter is: three verbs the loop calls.

    start(target, state, hidden)   once, after the target prefilled the prompt
    propose(state, k, ...)         up to k draft tokens (+ their probabilities q)
    observe(state, n, hidden)      after each round: n drafts were accepted
    forget()                       drop anything kept across requests (a benchmark run starts clean)

The drafters in this library read the target in different ways, and the
interface leaves room for all of them:

* n-gram looks only at ``state.ids``;
* a draft model keeps its own KV cache and crops it in `observe`;
* EAGLE-3, MTP, DFlash and DSpark read the target's hidden states. A drafter
  lists the taps it wants in ``taps``; the loop asks the target for them and
  hands `start` the prompt's rows and `observe` the rows of the tokens the
  round committed to the target cache (``[last, d1..dn]``, n + 1 rows);
* the Gemma 4 assistant reads the target's KV cache itself: ``state.cache``;
* block drafters (DFlash, DSpark) draft all k tokens in one pass and set
  ``max_k`` to what their block allows.

A drafter may return fewer than k tokens (n-gram without a match, DSpark's
confidence gate); the loop verifies whatever it gets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import Sampling


@dataclass
class Proposal:
    """Draft tokens and, when the drafter sampled them, their distributions."""

    tokens: list[int]  # [k'] with k' <= k
    q: torch.Tensor | None = None  # [k', V] draft probabilities, None = one-hot (greedy drafts)

    def __post_init__(self):
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError(f"q has {self.q.shape[0]} rows for {len(self.tokens)} draft tokens.")


class Drafter:
    """Base class: a drafter that proposes nothing (subclasses override)."""

    name = "none"
    taps: tuple[int, ...] = ()  # target hidden states this drafter reads (see target.py)
    max_k: int | None = None  # the most tokens one proposal can hold; None = no limit

    def check_k(self, k: int) -> None:
        """Refuse a k this drafter cannot draft, saying why."""
        if self.max_k is not None and k > self.max_k:
            raise ValueError(f"{self.name} drafts at most {self.max_k} tokens per round; got k={k}.")

    def start(self, target, state, hidden: dict[int, torch.Tensor]) -> None:
        """A new prompt: `hidden` holds the taps for state.ids[:-1] ([prompt_len-1, H] each)."""

    def propose(self, state, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        raise NotImplementedError

    def observe(self, state, accepted: int, hidden: dict[int, torch.Tensor]) -> None:
        """The round is committed: `accepted` drafts kept, `hidden` rows for [last, d1..dn]."""

    def forget(self) -> None:
        """Drop what was learned from earlier requests (only suffix decoding keeps anything across them)."""
