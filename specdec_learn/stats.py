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

A `Record` is one (method, k) over a set of prompts, with its `Stats` and
outputs; `compare_to_ar` sets it beside the AR record of the same run (both
backends, the library's loop and vLLM, return Records).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .tree import TreeSpec


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


@dataclass
class Record:
    """The result of one (method, k) over all prompts."""

    method: str
    k: int
    stats: Stats
    outputs: list[list[int]] = field(repr=False)
    speedup: float = 1.0
    greedy_match: float = 1.0
    draft_cost: float | None = None  # c: drafter seconds per drafted token / AR seconds per step (None: no drafts)
    verify_cost: float | None = None  # seconds per verify round / AR seconds per step
    tree: TreeSpec | None = None  # a token tree instead of a chain of k (then k = the tree's depth)
    draft_vocab: int | None = None  # the drafter scored only this many tokens (vocab.py); None = all
    drafter: str | None = None  # the folder of a drafter run beside the default one (bench's `others`); None = default

    @property
    def name(self) -> str:
        """The method, with its draft vocabulary when reduced and its folder when not the default one.

        'dflash v8192'; 'eagle3 @retrain/eagle3-smollm2-135m' (the folder's last two parts).
        """
        name = self.method if self.draft_vocab is None else f"{self.method} v{self.draft_vocab}"
        return name if self.drafter is None else f"{name} @{'/'.join(Path(self.drafter).parts[-2:])}"

    @property
    def label(self) -> str:
        """k for a chain, 'nodes/depth/branch' for a tree."""
        return str(self.k) if self.tree is None else f"{self.tree.nodes}/{self.tree.depth}/{self.tree.branch}"

    def to_json(self) -> dict:
        s = self.stats
        return {
            "method": self.method,
            "k": self.k,
            "tree": None if self.tree is None else asdict(self.tree),
            "draft_vocab": self.draft_vocab,
            "drafter": self.drafter,
            "nodes_per_round": s.num_draft_tokens / s.num_drafts if s.num_drafts else 0.0,
            "speedup": self.speedup,
            "greedy_match": self.greedy_match,
            "draft_cost": self.draft_cost,
            "verify_cost": self.verify_cost,
            **self.stats.summary(),
        }


def compare_to_ar(records: list[Record]) -> list[Record]:
    """Fill in every record's speedup, greedy match and costs against the first one, the AR run (both backends).

    vLLM's counters hold no draft or verify times: its records keep costs None.
    """
    ar = records[0]
    ar_step = ar.stats.verify_time / ar.stats.num_rounds if ar.stats.num_rounds else 0.0
    for r in records:
        r.speedup = r.stats.tok_per_s / ar.stats.tok_per_s if ar.stats.tok_per_s else float("nan")
        r.greedy_match = sum(a == b for a, b in zip(r.outputs, ar.outputs)) / len(ar.outputs)
        if ar_step > 0 and r.stats.num_rounds and r.stats.verify_time > 0:
            r.verify_cost = r.stats.verify_time / r.stats.num_rounds / ar_step
            if r.stats.num_draft_tokens:
                r.draft_cost = r.stats.draft_time / r.stats.num_draft_tokens / ar_step
    return records
