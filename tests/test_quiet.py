"""A run that other processes disturbed says so, in its results file and on the terminal (quiet.py).

Whether a run was QUIET cannot be tested here: the suite runs on two workers,
and each is the other's disturbance. What is tested is the arithmetic, and
that a synthetic load (busy processes on every core) gets a run flagged.
"""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from specdec_learn import bench as bench_module
from specdec_learn import quiet
from specdec_learn.stats import Stats

linux = pytest.mark.skipif(quiet.busy_seconds() is None, reason="no /proc/stat: the share is unknown here")


def test_others_share_is_the_busy_time_that_was_not_ours():
    cores = os.cpu_count()
    before = quiet.Snapshot(wall=10.0, busy=100.0, ours=5.0)
    after = quiet.Snapshot(wall=12.0, busy=100.0 + 2.0 * cores, ours=5.0 + cores)  # all cores busy, half of it ours
    assert quiet.others_share(before, after) == pytest.approx(0.5)
    assert quiet.conditions(before, after) == {"seconds": 2.0, "others_cpu_share": 0.5, "disturbed": True}
    alone = quiet.Snapshot(wall=12.0, busy=100.0 + cores, ours=5.0 + cores)  # every busy second ours
    assert quiet.conditions(before, alone)["disturbed"] is False
    assert quiet.warning(quiet.conditions(before, alone)) is None
    unknown = quiet.Snapshot(wall=12.0, busy=None, ours=6.0)
    assert quiet.conditions(before, unknown) == {"seconds": 2.0, "others_cpu_share": None, "disturbed": False}


# A busy process that is not ours: started through a child that exits at once, so it belongs to no one here.
# It lets go of the pipe its pid came through, or reading that pipe would wait for it forever.
DETACHED = """import os
pid = os.fork()
if pid:
    print(pid, flush=True)
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
while True:
    pass
"""


@pytest.fixture
def load():
    """Busy processes on every core while the test runs, none of them ours."""
    pids = []
    try:
        for _ in range(os.cpu_count() or 1):
            started = subprocess.run([sys.executable, "-c", DETACHED], capture_output=True, text=True, timeout=30)
            pids.append(int(started.stdout))
        time.sleep(0.3)
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@linux
def test_a_running_child_is_ours_not_another_process():
    before = quiet.snapshot()
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"])
    time.sleep(0.9)
    during = quiet.snapshot()  # the child still runs: its second of CPU time is in `ours` already
    child.wait()
    assert during.ours - before.ours > 0.5


@linux
def test_a_bench_under_load_is_flagged_disturbed(load, tmp_path, monkeypatch, capsys):
    def fake_generate(target, text, drafter=None, k=0, max_new_tokens=8, **kw):
        time.sleep(0.2)  # the run takes wall time but hardly any of our own CPU time
        return SimpleNamespace(stats=Stats(), tokens=[1])

    monkeypatch.setattr(bench_module, "generate", fake_generate)
    monkeypatch.setattr(bench_module, "make_drafter", lambda *a, **kw: None)
    prompts = [SimpleNamespace(text="x", id="p")] * 4
    target = SimpleNamespace(device="cpu", dtype="float32")
    records = bench_module.bench(target, ["ngram"], [2], prompts, max_new_tokens=4, progress=False)
    assert records.conditions["disturbed"], records.conditions
    assert records.conditions["others_cpu_share"] > quiet.OTHERS_LIMIT
    bench_module.write_json(tmp_path / "run.json", records, None, {"num_prompts": 4, "max_new_tokens": 4})
    assert json.loads((tmp_path / "run.json").read_text())["conditions"]["disturbed"] is True
    assert bench_module.read_results(tmp_path / "run.json").conditions["disturbed"] is True
    assert "rerun it on an idle machine" in quiet.warning(records.conditions)
