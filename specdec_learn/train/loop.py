"""One training loop for every learned drafter: a budget, a schedule, a state that survives a kill, a record.

Six drafters train here (EAGLE-3, DFlash, DSpark, the MTP graft, the
Gemma-4-style assistant, the distilled draft model). What differs between
them is the data they read and the loss they compute; everything around the
loss is the same, so it is written once:

    run = train_loop(module, loss, Budget(steps=2000, minutes=30), work_dir, lr=1e-3, evaluate=held_out)
    export(out_dir, lambda tmp: save_x(module, tmp), recipe(run, "x", target))

* **A budget.** A CPU run stops at its step budget or after `minutes` of
  training, whichever comes first. The reader's laptop, a CI job and a
  session that ends all stop runs, so stopping is normal, not an error.
* **Warm-up, then a cosine** (`warmup_cosine`). The rate is a function of the
  step alone, so a resumed run continues on the same curve.
* **A resumable state** in the work dir (``state.pt``: weights, optimiser,
  step, history; the work dir is $SPECDEC_CACHE/train/<checkpoint name>/
  unless given, `work_dir_for`, never the shipped folder). It is written to a temporary name and renamed, so a kill at
  any moment leaves the previous state or the new one, never half of one; it
  is read with ``weights_only=True``, so a crafted file cannot run code. Every
  step's randomness comes from a generator seeded by (seed, step), so a run
  stopped and resumed takes exactly the steps an uninterrupted run takes.
* **A warm start** (`warm_start`), when asked: a run may begin from a
  trained checkpoint's weights instead of a fresh drafter, with a new
  optimiser and a new schedule, to train a shipped drafter for longer when
  the state of the run that made it is gone (it lives in one machine's
  cache). recipe.json names the checkpoint it started from, by hash.
* **An evaluation hook**, called every `eval_every` steps and at the end, on
  held-out examples: per-step (or per-slot) accuracy, the number that
  predicts acceptance.
* **One provenance file**, ``recipe.json``, written beside the weights by
  `export`: steps, tokens seen, the held-out accuracy, the configuration, the
  command, a fingerprint of the data and the machine. The folder is built
  under a private name and renamed into place with recipe.json last, so a
  checkpoint and its record never disagree.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..formats.io import load_strict, partial_dir, replace_dir, safetensors_files

STATE = "state.pt"  # in the work dir: everything a resumed run needs
RECIPE = "recipe.json"  # beside the weights: how they were made


def work_dir_for(target_name: str, method: str, work_dir=None) -> Path:
    """Where a trainer keeps its resumable state, unless given: $SPECDEC_CACHE/train/<its checkpoint's name>/.

    The folder is named after the checkpoint the run makes
    (`checkpoints.shipped_folder`: train/eagle3-smollm2-135m/,
    train/draft-smollm2-135m/, ...), outside the shipped folder, so an
    export never carries training state and a package install never sees it.
    """
    from ..checkpoints import shipped_folder
    from ..models import cache_dir

    work_dir = Path(work_dir or cache_dir() / "train" / shipped_folder(method, target_name).name)
    work_dir.mkdir(parents=True, exist_ok=True)
    return work_dir


@dataclass
class Budget:
    """When a run stops: after `steps` optimiser steps (the schedule's horizon) or `minutes` of this call's training."""

    steps: int
    minutes: float | None = None


def warmup_cosine(step: int, steps: int, lr: float, floor: float = 0.1) -> float:
    """The learning rate at `step` of `steps`: linear warm-up, then a cosine from `lr` down to `floor`·lr.

    Warm-up lasts min(50, steps/10) steps: AdamW's first updates, made with
    poor second-moment estimates, are kept small. The floor keeps a tenth of
    the rate at the end, so a run resumed with a larger `steps` still learns.
    """
    warmup = max(1, min(50, steps // 10))
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def step_generator(seed: int, step: int) -> torch.Generator:
    """The random stream of one step: a function of (seed, step) only, so a resumed run draws what it would have."""
    return torch.Generator().manual_seed((seed << 32) + step)


# --- the state file ------------------------------------------------------------------------


def save_state(file: Path, state) -> None:
    """torch.save `state` (the run's dict, or tensors) to a temporary name, flush it to disk, rename it over `file`."""
    file = Path(file)
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, file)


def read_saved(file: Path):
    """What `save_state` wrote to `file`, or one clear error naming it.

    ``weights_only=True``: tensors, numbers, strings, lists and dicts only,
    so a file someone else wrote cannot run code here.
    """
    try:
        return torch.load(file, map_location=torch.get_default_device(), weights_only=True)
    except pickle.UnpicklingError:  # what weights_only refuses: anything but tensors and plain values
        reason = "it is not tensors and numbers alone: damaged, or written by something else, and unsafe to unpickle"
    except Exception as err:  # a truncated or damaged zip or pickle
        reason = f"it is truncated or damaged: {type(err).__name__}"
    raise ValueError(f"{file} cannot be read as a training state ({reason}); delete it to start this run over.")


def load_state(file: Path) -> dict | None:
    """The saved run in `file`, None when there is none, or one clear error when it cannot be used."""
    file = Path(file)
    for stale in file.parent.glob(f".{file.name}.tmp-*"):  # left by a run killed mid-write
        stale.unlink(missing_ok=True)
    if not file.exists():
        return None
    state = read_saved(file)
    missing = {"module", "optimizer", "step", "history"} - set(state) if isinstance(state, dict) else {"everything"}
    if missing:
        raise ValueError(f"{file} is not a training state of this loop (it lacks {sorted(missing)}); "
                         "delete it to start this run over.")
    return state


# --- a warm start ------------------------------------------------------------------------------


def warm_start(module: torch.nn.Module, checkpoint: torch.nn.Module, folder, what: str, config_keys: dict) -> dict:
    """Copy `checkpoint`'s weights (loaded from `folder`) into the fresh `module`: the run starts from them.

    config_keys: {name: this run's value} that must equal the checkpoint's config (`checkpoint.config`):
    settings that no tensor's shape shows (a block size, the taps) but that the weights were trained for.
    -> the record of where the run started, for recipe.json: the folder, the sha256 of its weight files,
    and the steps, tokens and command of the run that made it (its recipe.json, when it has one).
    """
    folder = Path(folder)
    theirs = {key: getattr(checkpoint.config, key, None) for key in config_keys}
    differ = {key: (theirs[key], ours) for key, ours in config_keys.items() if theirs[key] != ours}
    if differ:
        said = ", ".join(f"{key} {was!r} (this run: {now!r})" for key, (was, now) in differ.items())
        raise ValueError(f"{what} {folder} was trained with {said}: pass those settings to start from it.")
    load_strict(module, checkpoint.state_dict(), f"{what} {folder} as this run's start")
    record = {"folder": str(folder), "sha256": {}}
    for file in safetensors_files(folder):
        with open(file, "rb") as f:
            record["sha256"][file.name] = hashlib.file_digest(f, "sha256").hexdigest()
    if (folder / RECIPE).is_file():
        made = json.loads((folder / RECIPE).read_text(encoding="utf-8"))
        record.update({key: made.get(key) for key in ("steps", "tokens_seen", "command")})
    return record


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Run:
    """What a call of `train_loop` did, and what the run had done before it (all of it lands in recipe.json)."""

    steps: int = 0  # optimiser steps since the run began
    tokens: int = 0  # text tokens the loss read, since the run began
    minutes: float = 0.0  # training time, summed over every call that resumed it
    history: list[dict] = field(default_factory=list)  # one record per step: {"step", "loss", "acc", ...}
    held_out: dict | None = None  # the last evaluation
    resumed_from: int = 0  # the step this call started at (0: a fresh run)
    config: dict = field(default_factory=dict)  # the method's and the loop's settings
    data: dict = field(default_factory=dict)  # what it trained on (features.training_data's record)


def train_loop(module: torch.nn.Module, loss_fn: Callable, budget: Budget, work_dir, *, lr: float,
               weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
               evaluate: Callable[[], dict] | None = None, eval_every: int | None = None, save_every: int = 50,
               log_every: int = 25, seed: int = 0, config: dict | None = None, data: dict | None = None,
               progress: bool = True, log=print) -> Run:
    """AdamW on `loss_fn` until the budget is spent; resumes from work_dir/state.pt. -> Run.

    loss_fn(step, generator) -> (loss or None, metrics): the method's whole
    step, reading its batch with `generator`. None skips the update (nothing
    to learn from in that batch) but counts the step. metrics may hold
    "tokens" (text tokens read, summed into Run.tokens) and "acc" (a list).
    evaluate() -> dict, e.g. {"acc": [per-step accuracy]}, on held-out data (called in eval
    mode, without gradients, every `eval_every` steps and at the end).
    progress=False drops the per-step log lines (resume, budget and held-out lines stay).
    Ctrl-C saves the state of the last finished step before it stops.
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    state_file = work_dir / STATE
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
    config = {**(config or {}), "lr": lr, "weight_decay": weight_decay, "betas": list(betas), "seed": seed,
              "steps": budget.steps, "budget_minutes": budget.minutes}
    run = Run(config=config, data=data or {})
    if (saved := load_state(state_file)) is not None:
        try:
            module.load_state_dict(saved["module"])
            opt.load_state_dict(saved["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise ValueError(f"{state_file} holds a run of another shape ({str(err).strip().splitlines()[0][:160]}); "
                             "pass the sizes it was made with, or delete it to start over.") from None
        run.steps, run.history, run.resumed_from = saved["step"], saved["history"], saved["step"]
        run.tokens, run.minutes, run.held_out = saved.get("tokens", 0), saved.get("minutes", 0.0), saved.get("held_out")
        log(f"resumed at step {run.steps}")
        if data and saved.get("data", {}).get("sha256") not in (None, data.get("sha256")):
            log(f"note: {state_file} was trained on other data than {data.get('dir')} holds now")
    start, minutes_before = time.perf_counter(), run.minutes

    def save():
        run.minutes = minutes_before + (time.perf_counter() - start) / 60
        save_state(state_file, {"module": module.state_dict(), "optimizer": opt.state_dict(), "step": run.steps,
                                "history": run.history, "tokens": run.tokens, "minutes": run.minutes,
                                "held_out": run.held_out, "config": run.config, "data": run.data})

    def held_out():
        module.eval()
        with torch.no_grad():
            result = plain(evaluate())
        module.train()
        log(f"step {run.steps}: held-out {format_metrics(result)}")
        return result

    module.train()
    evaluated_at = None
    try:
        while run.steps < budget.steps:
            if budget.minutes is not None and time.perf_counter() - start > budget.minutes * 60:
                log(f"time budget of {budget.minutes:g} min reached at step {run.steps}")
                break
            for group in opt.param_groups:
                group["lr"] = warmup_cosine(run.steps, budget.steps, lr)
            loss, metrics = loss_fn(run.steps, step_generator(seed, run.steps))
            if loss is not None:
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
            metrics = plain(metrics)
            run.tokens += int(metrics.pop("tokens", 0))
            run.steps += 1
            run.history.append({"step": run.steps, "loss": None if loss is None else float(loss.detach()), **metrics})
            if progress and log_every and run.steps % log_every == 0:
                log(f"step {run.steps} {format_metrics(mean_records(run.history[-log_every:]))} "
                    f"({time.perf_counter() - start:.0f}s)")
            if evaluate is not None and eval_every and run.steps % eval_every == 0:
                run.held_out = run.history[-1]["eval"] = held_out()
                run.history[-1]["tokens_seen"] = run.tokens  # the learning curve: held-out accuracy vs tokens read
                evaluated_at = run.steps
            if run.steps % save_every == 0:
                save()
    except KeyboardInterrupt:
        save()
        log(f"interrupted: the state of step {run.steps} is in {state_file}; run again to continue")
        raise
    if evaluate is not None and evaluated_at != run.steps:  # the end, unless this very step was just evaluated
        run.held_out = held_out()
        if run.history:
            run.history[-1].update(eval=run.held_out, tokens_seen=run.tokens)
    save()
    module.eval()
    return run


# --- records -----------------------------------------------------------------------------------


def plain(metrics: dict) -> dict:
    """Tensors -> floats and lists of floats (what a state file and recipe.json hold), nested dicts too."""
    out = {}
    for key, value in (metrics or {}).items():
        if torch.is_tensor(value):
            value = value.detach().float().tolist()
        elif isinstance(value, (list, tuple)):
            value = [float(v) for v in value]
        elif isinstance(value, dict):
            value = plain(value)
        out[key] = value
    return out


def mean_records(records: list[dict]) -> dict:
    """The mean loss and the mean of each "acc" entry over `records` (nan and missing entries skipped)."""
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    accs = [r["acc"] for r in records if r.get("acc")]
    width = max((len(a) for a in accs), default=0)
    mean = {"loss": sum(losses) / len(losses) if losses else float("nan")}
    if width:
        cols = [[a[i] for a in accs if len(a) > i and not math.isnan(a[i])] for i in range(width)]
        mean["acc"] = [sum(c) / len(c) if c else float("nan") for c in cols]
    return mean


def format_metrics(metrics: dict) -> str:
    parts = []
    for key, value in metrics.items():
        if isinstance(value, list):
            parts.append(f"{key} " + " ".join(f"{v:.2f}" for v in value[:8]))
        elif isinstance(value, float):
            parts.append(f"{key} {value:.3f}")
    return " ".join(parts)


def recipe(run: Run, method: str, target, command: str | None = None) -> dict:
    """recipe.json: how a checkpoint was made, from the Run that made it."""
    from ..limits import machine_info

    recent = mean_records(run.history[-50:])
    return {
        "method": method,
        "target": Path(str(target.name)).name,
        "steps": run.steps,
        "tokens_seen": run.tokens,
        "train_minutes": round(run.minutes, 2),
        "final_train_loss": recent["loss"],
        "held_out": run.held_out,
        "held_out_curve": curve(run),
        "config": run.config,
        "data": run.data,
        "command": command,
        "machine": machine_info(target),
    }


def curve(run: Run) -> list[dict]:
    """Every held-out evaluation of the run: {"step", "tokens_seen", **metrics} (tokens_seen: text tokens read so far)."""
    return [{"step": r["step"], "tokens_seen": r.get("tokens_seen"), **r["eval"]} for r in run.history if "eval" in r]


def export(out_dir, write: Callable[[Path], object], record: dict) -> Path:
    """Write a checkpoint folder with `write(folder)`, then recipe.json; the whole folder appears at once.

    Files of an older folder at `out_dir` that this export does not write (a
    README, a benchmark record) are carried over unchanged.
    """
    out = Path(out_dir)
    remove_leftovers(out)
    tmp = partial_dir(out)
    write(tmp)
    if out.is_dir():
        for old in out.iterdir():
            if old.is_file() and old.name != RECIPE and not (tmp / old.name).exists():
                shutil.copy2(old, tmp / old.name)
    (tmp / RECIPE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")  # the record, last
    replace_dir(tmp, out)
    return out


def remove_leftovers(out: Path) -> None:
    """Delete the private folders an export killed half-way left beside `out` (their writer is gone)."""
    for left in [*out.parent.glob(f".{out.name}.partial-*"), *out.parent.glob(f".{out.name}.old-*")]:
        pid = left.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to someone else
        return True
    return True
