"""A job of hours in the background: the corpus (corpus.py) and the retraining (retrain.py).

Writing the corpus and retraining the drafters each take hours of a 2-core
CPU, longer than a sitting. Such a job runs

* in its own session (so its own process group: `kill -STOP -<pgid>` pauses
  every process of it, vLLM's workers included, and `kill -CONT -<pgid>`
  continues it; a timing or a test run must never share the CPU with it);
* at the lowest CPU priority, for the whole session (`lower_autogroup`);
* from a snapshot of the code (`snapshot_source`), so that editing the
  working tree for hours beside it never breaks it;
* logging to $SPECDEC_CACHE/<name>_job.log, its pid in <name>_job.pid, one
  at a time (`hold_lock`); every job here is resumable, so a rerun after a
  kill continues where it stopped.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def files(name: str) -> tuple[Path, Path]:
    """(pid file, log file) of job `name`, in the cache."""
    from ..models import cache_dir

    cache = cache_dir()
    return cache / f"{name}_job.pid", cache / f"{name}_job.log"


def running_pid(name: str) -> int | None:
    """The job's process-group leader, if one is alive."""
    pid_file, _ = files(name)
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text().strip())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def hold_lock(name: str):
    """An open file whose lock says job `name` runs (the kernel releases it however we die), or None if taken."""
    from ..models import cache_dir

    lock = (cache_dir() / f"{name}_job.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def snapshot_source(name: str, cache: Path, keep: tuple[str, ...] = ()) -> Path:
    """A private copy of the package to run the job from: the last commit, with the files `keep` as they are.

    The job runs for hours in a working tree that others edit; a half-edited
    module must not break it (vLLM's worker processes import the package again
    when they start). So it runs from a copy: `git archive HEAD`, read-only
    for git, plus the job's own modules (`keep`, paths in the repository)
    from the working tree.
    """
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    out = cache / f"{name}_job_src" / commit
    tmp = out.with_name(f".{commit}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "specdec_learn"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    for path in keep:
        (tmp / path).write_bytes((REPO / path).read_bytes())
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    os.replace(tmp, out)
    return out


def lower_autogroup(pid: int) -> None:
    """Give the job's whole session the lowest CPU priority, not just its processes.

    Linux with autogroup scheduling (most desktop kernels, and this machine) shares
    the CPU fairly between sessions first and applies `nice` only within one, so a
    niced job in a session of its own still takes half the cores from the user's
    session. The session's own nice value (/proc/<pid>/autogroup) is what yields.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text("19\n")
    except OSError:  # not Linux, or autogroup off: plain nice is all there is
        pass


def start(name: str, module: str, argv: list[str], keep: tuple[str, ...] = ()) -> int:
    """Run `python -c <module>.main(argv)` in the background: its own session, niced, logging to a file.

    `python -c` rather than `-m`: spawned workers then do not import the main
    module (and the package) again.
    """
    if (pid := running_pid(name)) is not None:
        print(f"The {name} job is already running (process group {pid}).")
        return 1
    pid_file, log_file = files(name)
    source = snapshot_source(name, pid_file.parent, keep)
    env = dict(os.environ, PYTHONPATH=str(source), SPECDEC_CACHE=str(pid_file.parent))
    launcher = f"import sys; from specdec_learn.train.{module} import main; sys.exit(main(sys.argv[1:]))"
    command = ["nice", "-n", "19", sys.executable, "-u", "-c", launcher, *argv]
    with log_file.open("a") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} start, code from {source}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, cwd=source, env=env)  # setsid: pid == pgid; cwd: not the tree
    lower_autogroup(process.pid)
    tmp = pid_file.with_name(f".{pid_file.name}.tmp-{os.getpid()}")
    tmp.write_text(f"{process.pid}\n")
    os.replace(tmp, pid_file)
    print(f"Started the {name} job, process group {process.pid}; log: {log_file}\n"
          f"  pause:  kill -STOP -{process.pid}\n  resume: kill -CONT -{process.pid}")
    return 0


def last_line(name: str, marks: tuple[str, ...]) -> str:
    """The job log's last line holding one of `marks` (its progress lines), or a note that there is none."""
    _, log_file = files(name)
    if not log_file.exists():
        return "(nothing logged yet)"
    lines = [l for l in log_file.read_text(errors="replace").splitlines() if any(m in l for m in marks)]
    return lines[-1] if lines else "(nothing logged yet)"
