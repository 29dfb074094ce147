"""Counting what speculation bought, with vLLM's definitions.

Each round records how many tokens were drafted (k) and how many of them the
target accepted (n). From those counts (vLLM ``vllm/v1/spec_decode/metrics.py``):

* mean acceptance length = 1 + accepted / drafts. The 1 is the token the
  target adds every round (recovered or bonus), so plain decoding scores 1.0
  and k perfect drafts score k + 1.
* per-position acceptance rate [i] = (rounds whose first i+1 drafts were all
  accepted) / drafts. Position i counts only when its whole prefix survived,
  so the list never increases.
* draft acceptance rate = accepted / drafted.

A round that drafted nothing (n-gram found no match, or the last token of the
budget) is not a draft, as in vLLM. A tree (tree.py) counts its nodes as
drafted tokens and its accepted path as accepted ones; its positions are
depths. Times are wall-clock seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Round:
    """One draft-verify round."""

    drafted: int  # k tokens proposed (a tree: its nodes)
    accepted: int  # n of them kept (a tree: the accepted path's length)
    draft_time: float  # seconds in the drafter (propose + observe)
    verify_time: float  # seconds in the target forward + acceptance
    depth: int | None = None  # a tree's depth, the positions it drafted (a chain: `drafted`)


@dataclass
class Stats:
    """Counts summed over rounds (and over prompts: `a + b`)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    num_rounds: int = 0
    num_output_tokens: int = 0
    draft_time: float = 0.0
    verify_time: float = 0.0
    prefill_time: float = 0.0
    total_time: float = 0.0

    def record(self, r: Round) -> None:
        self.num_rounds += 1
        self.draft_time += r.draft_time
        self.verify_time += r.verify_time
        if r.drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += r.drafted
        self.num_accepted_tokens += r.accepted
        positions = r.drafted if r.depth is None else r.depth
        if len(self.accepted_per_pos) < positions:
            self.accepted_per_pos += [0] * (positions - len(self.accepted_per_pos))
        for i in range(r.accepted):  # position i counts when drafts 0..i all survived
            self.accepted_per_pos[i] += 1

    def _combine(self, other: "Stats", op) -> "Stats":
        """Field by field `op` (per-position counts padded to the longer list)."""
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda xs: xs + [0] * (width - len(xs))  # noqa: E731
        counts = {f: op(getattr(self, f), getattr(other, f)) for f in self.__dataclass_fields__ if f != "accepted_per_pos"}
        return Stats(accepted_per_pos=[op(a, b) for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos))],
                     **counts)

    def __add__(self, other: "Stats") -> "Stats":
        """Two runs' counts together (prompts of one benchmark)."""
        return self._combine(other, lambda a, b: a + b)

    def __sub__(self, other: "Stats") -> "Stats":
        """What happened between two readings of growing counters (vLLM's, around one call)."""
        return self._combine(other, lambda a, b: a - b)

    # -- the derived numbers -------------------------------------------------
    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.num_drafts for a in self.accepted_per_pos] if self.num_drafts else []

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tok_per_s(self) -> float:
        """Output tokens per second of wall time, prefill included."""
        return self.num_output_tokens / self.total_time if self.total_time else 0.0

    def summary(self) -> dict:
        return {
            "tok_per_s": self.tok_per_s,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_rounds": self.num_rounds,
            "num_output_tokens": self.num_output_tokens,
            "draft_time_s": self.draft_time,
            "verify_time_s": self.verify_time,
            "prefill_time_s": self.prefill_time,
            "total_time_s": self.total_time,
        }
