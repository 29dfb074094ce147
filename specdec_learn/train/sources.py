"""Drawing examples by prompt source: how much of what a drafter reads answers the benchmark's kinds of request.

Why: a drafter is fast on the text it is served. The corpus is 92 % Magpie
requests (magpie.py: requests the target wrote itself), while the
benchmark's workloads are the templated kinds (prompts.py); drawn
uniformly, a run of 3,000 steps saw ~240 answers of the kinds it is
benchmarked on. So every trainer can draw its examples by source
(`--templated-share`, `add_share_argument`):

    weights = source_weights(examples, templated_share)   # [N], templated vs Magpie
    pick    = example_picker(order, weights)              # step, generator -> one example's index
    i       = draw_one(weights, generator)                # EAGLE-3 packs its batches with this

A draw uses the step's own generator (loop.step_generator) and nothing
else, so a resumed run draws what an uninterrupted one would have.
"""

from __future__ import annotations

import torch

from .examples import Example
from .magpie import PREFIX as MAGPIE_PREFIX


def prompt_source(prompt_id: str) -> str:
    """Where an example's prompt came from: "magpie" (the target's own requests) or "templated" (the
    workloads' kinds: train-split items and templated variants of them, prompts.training_prompts)."""
    return "magpie" if prompt_id.startswith(MAGPIE_PREFIX) else "templated"


def source_weights(examples: list[Example], templated_share: float) -> torch.Tensor:
    """Sampling weights [N] that give the templated examples `templated_share` of the draws, Magpie the rest.

    A share that one side cannot give (templated examples wanted, none there)
    is refused, saying what the corpus holds.
    """
    if not 0.0 <= templated_share <= 1.0:
        raise ValueError(f"--templated-share {templated_share:g}: give a fraction between 0 and 1.")
    templated = torch.tensor([prompt_source(ex.id) == "templated" for ex in examples])  # [N]
    counts = {True: int(templated.sum()), False: len(examples) - int(templated.sum())}
    share = {True: templated_share, False: 1.0 - templated_share}
    if any(counts[side] == 0 and share[side] > 0 for side in (True, False)):
        raise ValueError(f"--templated-share {templated_share:g}: the corpus has {counts[True]} templated and "
                         f"{counts[False]} Magpie examples; give a share the corpus can draw.")
    return torch.tensor([share[bool(t)] / counts[bool(t)] for t in templated])


def draw_one(weights: torch.Tensor, generator: torch.Generator) -> int:
    """The index of one example drawn by `weights` [N] (`source_weights`) with `generator`.

    The one-example steps (`example_picker`, DFlash's and DSpark's block step)
    and EAGLE-3's batch packing draw through here, with the step's own
    generator (loop.step_generator): it alone decides what a step reads, so a
    resumed run draws what it would have. (The draft model's trainer draws a
    whole batch at once, with replacement.)
    """
    return int(torch.multinomial(weights.cpu(), 1, generator=generator))


def example_picker(order: list[int], weights: torch.Tensor | None):
    """step, generator -> the index of the example a one-example step reads.

    weights None: `order` (a seeded shuffle) in turn, every example once per
    epoch; else one draw by `weights` (`source_weights`) with the step's own
    generator, so a resumed run draws what it would have.
    """
    def pick(step: int, generator: torch.Generator) -> int:
        if weights is None:
            return order[step % len(order)]
        return draw_one(weights, generator)

    return pick


def add_share_argument(p) -> None:
    """--templated-share, for the trainers that draw their examples by prompt source (`source_weights`)."""
    p.add_argument("--templated-share", type=float, default=None,
                   help="fraction of the examples read that answer a templated prompt (the workloads' kinds), "
                        "the rest Magpie (default: every example equally likely)")
