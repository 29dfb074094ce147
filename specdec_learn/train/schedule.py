"""What every small training run here shares: the learning-rate schedule and a resumable state file.

A CPU training run is stopped by its time budget, by the session ending, or
by the reader closing the laptop, so each trainer saves its weights, its
optimiser and its step in one file and picks up from there. The schedule is
a function of the step alone, so a resumed run continues on the same curve.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch


def warmup_cosine(step: int, steps: int, lr: float) -> float:
    """Linear warm-up over min(50, steps/10) steps, then a cosine from `lr` down to 0 at `steps`."""
    warm_up = min(1.0, (step + 1) / min(50, steps / 10))
    return lr * warm_up * 0.5 * (1 + math.cos(math.pi * step / steps))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def load_state(state_file: Path, log=print) -> dict | None:
    """The saved run in `state_file` (weights, optimiser, "step", ...), or None for a fresh start."""
    if not Path(state_file).exists():
        return None
    saved = torch.load(state_file, weights_only=False)
    log(f"resumed at step {saved['step']}")
    return saved


def save_state(state_file: Path, **state) -> None:
    """Write the run's state atomically: a run killed mid-write keeps its previous state file."""
    tmp = Path(state_file).with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, state_file)
