"""Retrain every learned drafter on the committed corpus, one after another: a job of hours.

    python -m specdec_learn.train.retrain start     # in the background (job.py: niced, pausable, resumable)
    python -m specdec_learn.train.retrain status    # where each run stands
    python -m specdec_learn.train.retrain run       # the same runs, in the foreground
    python -m specdec_learn.train.retrain run --device cuda   # on a GPU: minutes, not hours

Each run is `specdec train <method>` with the flags in PLAN: the committed
corpus (data.default_dir), a step budget, a held-out evaluation every few
hundred steps (the learning curve recipe.json keeps). It runs in a process
of its own (`python -m specdec_learn.cli`, what the `specdec` command runs):
training sits a floor below the CLI, so it runs the command rather than
importing it, and each run starts with a fresh process's memory. A step budget, never
minutes: a job paused with SIGSTOP keeps the wall clock running, so a time
budget would be spent asleep. A run's state lives in
$SPECDEC_CACHE/retrain/work/<checkpoint>-<hash of data and flags>/ and its
export in $SPECDEC_CACHE/retrain/<checkpoint>/; a run whose export has
reached its steps on the same data with the same flags is skipped, so a
killed job started again goes on with the run it was in, and a corpus that
has grown, or a PLAN that has changed, is trained on afresh.

Shipping is not part of the job: an export replaces the shipped drafter in
specdec_learn/checkpoints/ only after `specdec bench` has measured it beside
the one it replaces.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from . import job

# method -> its `specdec train` flags. The order is the order of the runs: EAGLE-3 first (the method with the most to
# gain), the draft model last.
#
# A step costs about 0.6-2 s on 2 CPU cores with bf16 instructions (the target's forward for the tapped methods,
# the drafter's own step), so the whole plan is hours of CPU, over several sessions: `start --methods` picks which
# runs go first. On a GPU (`--device cuda`, passed to every run) each run takes minutes. Each run's recipe.json
# records its machine and wall time (benchmarks/results/retrain/).
#
# Why every run draws half its answers from the templated prompts (`--templated-share 0.5`; the workloads' kinds of
# request, 8 % of the corpus): drawn uniformly, a drafter learns more of the corpus's held-out answers and no more of
# the benchmark's kinds. Why the assistant and DSpark have 6,000 steps: their held-out curves were still rising at
# 2,000 and 3,000. The runs that measured each choice are under benchmarks/results/retrain/; each shipped drafter's
# README names its own.
PLAN: dict[str, list[str]] = {
    "eagle3": ["--dtype", "bf16", "--draft-vocab", "4096", "--ttt-steps", "4", "--templated-share", "0.5",
               "--steps", "3000", "--eval-every", "250"],
    "dflash": ["--dtype", "bf16", "--layers", "1", "--block-size", "16", "--anchors", "64", "--loss-slots", "7",
               "--templated-share", "0.5", "--steps", "3000", "--eval-every", "600"],
    "dspark": ["--dtype", "bf16", "--layers", "1", "--block-size", "7", "--markov-rank", "32", "--anchors", "64",
               "--templated-share", "0.5", "--steps", "6000", "--eval-every", "1000"],
    "mtp": ["--depth", "3", "--templated-share", "0.5", "--steps", "4000", "--eval-every", "500"],
    "gemma4_mtp": ["--templated-share", "0.5", "--steps", "6000", "--eval-every", "500"],
    "draft_model": ["--templated-share", "0.5", "--steps", "3000", "--eval-every", "250"],
}


def root() -> Path:
    from ..models import cache_dir

    return cache_dir() / "retrain"


def data_hash(target: str, data_dir) -> str:
    """The hash recipe.json records of exactly which examples a run reads (examples.fingerprint)."""
    from .data import training_split
    from .examples import fingerprint

    return fingerprint(*training_split(target, data_dir), data_dir)["sha256"]


def folders(method: str, target: str, data: str) -> tuple[Path, Path]:
    """(work dir, export dir) of one run, named after the checkpoint it makes.

    The work dir also carries a hash of the data and of the run's flags: once
    the corpus grows or the PLAN changes, the run starts afresh in a new folder
    instead of resuming one made another way.
    """
    from ..checkpoints import shipped_folder

    name = shipped_folder(method, target).name
    key = hashlib.sha256(f"{data} {' '.join(PLAN[method])}".encode()).hexdigest()
    return root() / "work" / f"{name}-{key[:12]}", root() / name


def planned_steps(method: str) -> int:
    flags = PLAN[method]
    return int(flags[flags.index("--steps") + 1])


def finished(method: str, target: str, data: str) -> bool:
    """Whether this run's export holds its planned steps on the data as it is now (hash `data`), with its flags."""
    work, out = folders(method, target, data)
    if not (out / "recipe.json").exists():
        return False
    made = json.loads((out / "recipe.json").read_text())
    # the recipe's command names its work dir, whose name carries the hash of the data and the flags
    words = shlex.split(made.get("command") or "")
    made_in = words[words.index("--work-dir") + 1] if "--work-dir" in words[:-1] else None
    return made.get("steps", 0) >= planned_steps(method) and made.get("data", {}).get("sha256") == data \
        and made_in == str(work)


def command(method: str, target: str, threads: int, data_dir: str, data: str, device: str = "cpu") -> list[str]:
    """The `specdec train` argv of one run."""
    work, out = folders(method, target, data)
    return ["train", method, "--target", target, *PLAN[method], "--data-dir", data_dir, "--work-dir", str(work),
            "--out", str(out), "--threads", str(threads), "--device", device]


def specdec(argv: list[str]) -> int:
    """Run `specdec <argv>` (one training run) in a child process with this package's code; -> its exit code.

    The child imports the package from where this one was imported (in a job,
    its snapshot of the code) and shares the job's process group, so pausing
    the job pauses it too. Ctrl-C reaches it as well: the run saves its state
    and stops, and we wait for that rather than kill it mid-write.
    """
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""))
    process = subprocess.Popen([sys.executable, "-m", "specdec_learn.cli", *argv], env=env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        return process.wait()


def log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} retrain: {line}", flush=True)  # the job's stdout is its log


def run(args) -> int:
    """Every run of PLAN (or of --methods) in turn; a finished one is skipped, a started one resumes."""
    lock = job.hold_lock("retrain")  # held until this process ends
    if lock is None:
        log("another retrain holds the lock (see `status`); not starting a second one")
        return 1
    data = data_hash(args.target, args.data_dir)
    for method in args.methods:
        out = folders(method, args.target, data)[1]
        if finished(method, args.target, data):
            log(f"{method}: done already ({out})")
            continue
        argv = command(method, args.target, args.threads, args.data_dir, data, args.device)
        log(f"{method}: specdec {' '.join(argv)}")
        code = specdec(argv)
        if code != 0:
            log(f"{method}: stopped with exit code {code}; `start` again resumes it")
            return code
        log(f"{method}: exported to {out}")
    log("every run is done")
    return 0


def status(args) -> int:
    """Each run's step against its plan, tokens read and last held-out accuracy; and whether the job runs."""
    from .loop import STATE, load_state

    data = data_hash(args.target, args.data_dir)
    for method in args.methods:
        work, out = folders(method, args.target, data)
        state = load_state(work / STATE) if (work / STATE).exists() else None
        if finished(method, args.target, data):
            where = f"done, exported to {out}"
        elif state is None:
            where = "not started"
        else:
            where = f"step {state['step']} / {planned_steps(method)}"
        acc = (state or {}).get("held_out") or {}
        accuracy = " ".join(f"{a:.2f}" for a in acc.get("acc", [])[:6]) if isinstance(acc.get("acc"), list) else ""
        tokens = f", {state.get('tokens', 0):,} tokens read" if state else ""
        print(f"{method:12} {where}{tokens}{', held-out acc ' + accuracy if accuracy else ''}")
    pid = job.running_pid("retrain")
    print(f"job: {'running, process group ' + str(pid) if pid else 'not running'}")
    print("last:", job.last_line("retrain", ("retrain:", "step ")))
    return 0


def start(args, argv: list[str]) -> int:
    """`run` in the background. The data folder is resolved here: the job runs from a copy of the code, not the tree."""
    return job.start("retrain", "retrain", ["run", *argv, "--data-dir", str(Path(args.data_dir).resolve())],
                     keep=("specdec_learn/train/retrain.py",))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m specdec_learn.train.retrain", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["start", "run", "status"],
                        help="start = run in the background; run = in the foreground; status")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--methods", type=lambda s: s.split(","), default=list(PLAN),
                        help=f"comma-separated, in order (default: {','.join(PLAN)})")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: each run's --device (specdec train)")
    parser.add_argument("--data-dir", default=None, help="the corpus (default: the committed one, data.default_dir)")
    args = parser.parse_args(argv)
    if args.data_dir is None:
        from .data import default_dir

        args.data_dir = str(default_dir(args.target))
    unknown = [m for m in args.methods if m not in PLAN]
    if unknown:
        parser.error(f"no plan for {', '.join(unknown)}: choose from {', '.join(PLAN)}")
    if args.command == "start":
        return start(args, [a for a in argv if a != "start"])
    return {"run": run, "status": status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
