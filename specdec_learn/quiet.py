"""Was the machine quiet while we timed? The share of the CPUs that other processes took during a run.

A speedup is a ratio of two timings taken in one run, so a machine that
slows down evenly changes neither; but a second process on a 2-core machine
takes a core for seconds at a time, and whichever run met it looks slow. The
kernel counts every CPU's busy time (/proc/stat) and every process's own
(getrusage, and /proc/<pid>/stat for the processes we started that still
run, such as a vLLM engine's worker): the busy time that was not ours, over
the run's wall time and the cores, is what others took. A run where they
took more than OTHERS_LIMIT is flagged as disturbed in its results file, and
a disturbed run cannot become a reference result (benchmarks/reference.py).

Linux only; elsewhere the share is unknown (None) and nothing is flagged.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

OTHERS_LIMIT = 0.10  # of all cores: more than this, taken by other processes, and the run is disturbed


@dataclass
class Snapshot:
    wall: float  # s, monotonic
    busy: float | None  # s of CPU time, all cores, all processes (None: no /proc/stat)
    ours: float  # s of CPU time, this process's threads and its children's, finished or running


def snapshot() -> Snapshot:
    """Now: the wall clock, all CPUs' busy time, and ours (with our children's: a notebook's kernel, vLLM's worker)."""
    ours = sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    return Snapshot(time.monotonic(), busy_seconds(), ours + running_children_seconds())


def running_children_seconds() -> float:
    """CPU time of the processes we started that still run, and of their own finished children (0.0 without /proc).

    A finished child that we waited for is in getrusage's RUSAGE_CHILDREN already; a running one is not.
    """
    parent, seconds = {}, {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on: the name may hold spaces
        parent[pid] = int(fields[1])
        seconds[pid] = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime, in clock ticks
    ours, total = {os.getpid()}, 0
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                total += seconds[pid]
                grew = True
    return total / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float | None:
    """CPU time every core spent on anything but idling, since boot (None where /proc/stat is missing)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]  # user nice system idle iowait irq softirq steal ...
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle  # guest time is already inside user time
    return busy / os.sysconf("SC_CLK_TCK")


def others_share(before: Snapshot, after: Snapshot) -> float | None:
    """The share of all cores (0..1) that other processes kept busy between two snapshots."""
    wall = after.wall - before.wall
    if before.busy is None or after.busy is None or wall <= 0:
        return None
    others = (after.busy - before.busy) - (after.ours - before.ours)
    return max(0.0, others / (wall * (os.cpu_count() or 1)))


def conditions(before: Snapshot, after: Snapshot) -> dict:
    """What a results file records about the run's machine: others' share and whether the run was disturbed."""
    share = others_share(before, after)
    return {"seconds": round(after.wall - before.wall, 1),
            "others_cpu_share": None if share is None else round(share, 3),
            "disturbed": share is not None and share > OTHERS_LIMIT}


def warning(conditions: dict | None) -> str | None:
    """One line saying a run was disturbed, or None when it was quiet (or nobody could tell)."""
    if not conditions or not conditions.get("disturbed"):
        return None
    return (f"disturbed: other processes kept {conditions['others_cpu_share']:.0%} of the CPUs busy during this run "
            f"(more than {OTHERS_LIMIT:.0%}), so its timings are not a fair comparison: rerun it on an idle machine.")
