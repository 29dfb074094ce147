"""The one training loop (train/loop.py): its schedule, budgets, resumable state, refusals, atomic export,
and a trainer killed at random moments that always comes back."""

import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specdec_learn.train.loop import Budget, curve, export, load_state, save_state, train_loop, warmup_cosine

TESTS = Path(__file__).resolve().parent
QUIET = lambda *_: None  # noqa: E731


def test_schedule_warms_up_then_follows_a_cosine_down_to_a_tenth():
    lr, steps = 1.0, 1000  # warm-up: min(50, 1000 / 10) = 50 steps
    rates = [warmup_cosine(s, steps, lr) for s in range(steps)]
    assert rates[0] == pytest.approx(1 / 50) and rates[24] == pytest.approx(25 / 50) and rates[49] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(rates[50:], rates[51:]))  # never rises after the warm-up
    middle = 50 + (steps - 50) // 2
    assert rates[middle] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)), abs=1e-3)  # 0.55
    assert warmup_cosine(steps, steps, lr) == pytest.approx(0.1)
    assert warmup_cosine(2 * steps, steps, lr) == pytest.approx(0.1)  # past the horizon: the floor
    assert warmup_cosine(0, 5, lr) == 1.0  # a 5-step run warms up in one step


# --- a tiny problem: fit y = sin(x·w) with a small MLP -------------------------------------------


def tiny_problem(seed=0):
    g = torch.Generator().manual_seed(100)
    x = torch.randn(64, 4, generator=g)
    y = torch.sin(x @ torch.randn(4, 1, generator=g))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def loss(step, generator):
        rows = torch.randint(64, (8,), generator=generator)  # the step's batch, from the step's own stream
        return torch.nn.functional.mse_loss(model(x[rows]), y[rows]), {"acc": [0.5], "tokens": 8}

    return model, loss


def test_an_interrupted_run_resumed_equals_an_uninterrupted_one(tmp_path):
    steady, loss = tiny_problem()
    uninterrupted = train_loop(steady, loss, Budget(12), tmp_path / "a", lr=0.05, log=QUIET)

    stopped, loss = tiny_problem()

    def ctrl_c_at_step_7(step, generator):
        if step == 7:
            raise KeyboardInterrupt
        return loss(step, generator)

    logs = []
    with pytest.raises(KeyboardInterrupt):
        train_loop(stopped, ctrl_c_at_step_7, Budget(12), tmp_path / "b", lr=0.05, save_every=1000, log=logs.append)
    assert "interrupted: the state of step 7" in logs[-1]  # Ctrl-C saved the state, though save_every is 1000
    resumed, loss = tiny_problem(seed=123)  # other initial weights: the state must override them
    run = train_loop(resumed, loss, Budget(12), tmp_path / "b", lr=0.05, log=logs.append)
    assert "resumed at step 7" in logs and run.resumed_from == 7 and run.steps == 12 and run.tokens == 12 * 8
    for a, b in zip(steady.parameters(), resumed.parameters()):
        assert torch.equal(a, b)  # bit for bit: same batches, same rates, same optimiser state
    assert [r["loss"] for r in run.history] == [r["loss"] for r in uninterrupted.history]


def test_step_and_time_budgets_stop_the_run(tmp_path):
    model, loss = tiny_problem()
    run = train_loop(model, loss, Budget(5), tmp_path / "steps", lr=0.05, log=QUIET)
    assert run.steps == 5 and len(run.history) == 5
    again = train_loop(model, loss, Budget(5), tmp_path / "steps", lr=0.05, log=QUIET)
    assert again.resumed_from == 5 and again.steps == 5  # nothing left to do

    def slow(step, generator):
        time.sleep(0.05)
        return loss(step, generator)

    logs = []
    run = train_loop(model, slow, Budget(10_000, minutes=0.4 / 60), tmp_path / "time", lr=0.05, log=logs.append)
    assert 1 <= run.steps < 100 and any("time budget of" in line for line in logs)
    assert load_state(tmp_path / "time" / "state.pt")["step"] == run.steps  # saved where it stopped


def test_the_evaluation_hook_runs_every_n_steps_and_at_the_end(tmp_path):
    model, loss = tiny_problem()
    calls = []

    def held_out():
        calls.append(model.training)
        return {"acc": torch.tensor([0.25, 0.5])}

    run = train_loop(model, loss, Budget(9), tmp_path / "a", lr=0.05, evaluate=held_out, eval_every=4, log=QUIET)
    assert len(calls) == 3 and run.held_out == {"acc": [0.25, 0.5]}  # steps 4, 8 and the end; tensors made plain
    assert run.history[3]["eval"] == {"acc": [0.25, 0.5]} and "eval" not in run.history[4]
    assert calls == [False] * 3 and model.training is False  # evaluated in eval mode, left in eval mode
    # the learning curve recipe.json keeps: every evaluation, with the tokens read by then
    assert [(r["step"], r["acc"]) for r in curve(run)] == [(4, [0.25, 0.5]), (8, [0.25, 0.5]), (9, [0.25, 0.5])]
    assert [r["tokens_seen"] for r in curve(run)] == [run.history[i]["tokens_seen"] for i in (3, 7, 8)]
    assert 0 < curve(run)[0]["tokens_seen"] < curve(run)[1]["tokens_seen"] < curve(run)[2]["tokens_seen"] == run.tokens
    calls.clear()
    train_loop(model, loss, Budget(8), tmp_path / "b", lr=0.05, evaluate=held_out, eval_every=4, log=QUIET)
    assert len(calls) == 2  # steps 4 and 8: the end is step 8, not evaluated twice


# --- a state file that cannot be used: one line, naming it ---------------------------------------


def test_a_damaged_state_file_is_refused_naming_it(tmp_path):
    model, loss = tiny_problem()
    train_loop(model, loss, Budget(3), tmp_path, lr=0.05, log=QUIET)
    state = tmp_path / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated
    with pytest.raises(ValueError, match=r"state\.pt cannot be read as a training state \(it is truncated .*delete it"):
        train_loop(model, loss, Budget(6), tmp_path, lr=0.05, log=QUIET)
    state.write_bytes(b"")  # empty
    with pytest.raises(ValueError, match="delete it"):
        load_state(state)
    save_state(state, {"step": 3})  # readable, but not a state of this loop
    with pytest.raises(ValueError, match=r"not a training state of this loop \(it lacks"):
        load_state(state)


def test_a_state_of_another_shape_is_refused_saying_what_to_do(tmp_path):
    model, loss = tiny_problem()
    train_loop(model, loss, Budget(2), tmp_path, lr=0.05, log=QUIET)
    wider = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    with pytest.raises(ValueError, match="holds a run of another shape .*delete it"):
        train_loop(wider, loss, Budget(4), tmp_path, lr=0.05, log=QUIET)


class Payload:
    """What an attacker would put in a state file: unpickling it runs a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_crafted_pickle_in_the_state_file_is_refused(tmp_path, how):
    marker = tmp_path / "code-ran"
    state = tmp_path / "work" / "state.pt"
    state.parent.mkdir()
    crafted = {"module": Payload(marker), "optimizer": {}, "step": 1, "history": []}
    if how == "torch.save":
        torch.save(crafted, state)
    else:
        state.write_bytes(pickle.dumps(crafted))
    model, loss = tiny_problem()
    with pytest.raises(ValueError, match=r"state\.pt cannot be read as a training state \(it is not tensors and numbers alone"):
        train_loop(model, loss, Budget(2), state.parent, lr=0.05, log=QUIET)
    assert not marker.exists()  # weights_only=True: the command never ran


# --- the export: all at once, the record last -----------------------------------------------------


def test_export_writes_the_folder_at_once_and_keeps_what_it_does_not_write(tmp_path):
    out = tmp_path / "drafter"
    out.mkdir()
    (out / "README.md").write_text("how to use it")
    (out / "weights.bin").write_text("old weights")
    (out / "recipe.json").write_text('{"steps": 1}')

    def fails(folder):
        (folder / "weights.bin").write_text("half of the new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(out, fails, {"steps": 2})
    assert (out / "weights.bin").read_text() == "old weights" and json.loads((out / "recipe.json").read_text()) == {"steps": 1}

    export(out, lambda folder: (folder / "weights.bin").write_text("new weights"), {"steps": 2})
    assert (out / "weights.bin").read_text() == "new weights" and json.loads((out / "recipe.json").read_text()) == {"steps": 2}
    assert (out / "README.md").read_text() == "how to use it"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".drafter.")]  # no temporary folder left


# --- a trainer killed at random moments -----------------------------------------------------------

CHILD = """
import sys
sys.path.insert(0, {tests!r})
from conftest import tiny_target
from specdec_learn.train import mtp

target = tiny_target(hidden=64)
steps, forever = int(sys.argv[1]), sys.argv[2] == "forever"
print("ready", flush=True)
while True:  # short resumed runs back to back: state writes, feature reads, evaluations, exports
    head, run = mtp.train(target, steps=steps, depth=2, lr=1e-2, max_rows=None, save_every=1, work_dir={work!r},
                          data_dir={data!r}, progress=False, log=lambda *_: None)
    mtp.export(head, target, {out!r}, run)
    print("resumed_from", run.resumed_from, "steps", run.steps, flush=True)
    if not forever:
        break
    steps += 4
"""


def check_nothing_is_corrupt(work: Path, out: Path, data: Path, target, last_step: int) -> int:
    """Every file a kill may have hit is whole: the state, the features, the exported folder."""
    from specdec_learn.drafters.mtp import load_mtp
    from specdec_learn.train.features import read_features

    state = load_state(work / "state.pt")  # raises on a damaged file
    step = state["step"] if state else 0
    assert step >= last_step, "the state went back in time"
    for f in (data / "last-float32").glob("*.pt") if (data / "last-float32").exists() else []:
        assert read_features(f) is not None, f
    if out.exists():
        made = json.loads((out / "recipe.json").read_text())
        assert json.loads((out / "config.json").read_text())["mtp_chain_depth"] == 2
        assert made["steps"] <= step and load_mtp(out, target) is not None
    return step


def kill_when(child, seen, timeout: float = 120.0) -> bool:
    """SIGKILL `child` as soon as seen() is true (or at the timeout): no chance to clean up. -> whether it was seen."""
    deadline, hit = time.monotonic() + timeout, False
    while child.poll() is None and time.monotonic() < deadline and not (hit := seen()):
        time.sleep(0.0005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    return hit


def test_a_trainer_killed_at_random_moments_resumes_and_never_leaves_a_corrupt_file(tmp_path):
    from conftest import tiny_target
    from test_mtp_train import write_examples

    import specdec_learn as sd
    from specdec_learn.drafters.mtp import MTPDrafter, load_mtp

    data, work, out = write_examples(tmp_path / "data", n=16), tmp_path / "work", tmp_path / "out"
    code = CHILD.format(tests=str(TESTS), work=str(work), data=str(data), out=str(out))
    env = {**os.environ, "SPECDEC_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    target = tiny_target(hidden=64)
    rng, step = random.Random(0), 0
    moments = {  # when to kill: while a state file is being written, while a checkpoint is, or at a random time
        "mid-state-write": lambda: any(work.glob(".state.pt.tmp-*")),
        "mid-export": lambda: any(tmp_path.glob(".out.partial-*")) or any(tmp_path.glob(".out.old-*")),
        "at a random time": lambda: time.monotonic() > start + pause,
    }
    for moment, seen in moments.items():
        child = subprocess.Popen([sys.executable, "-c", code, "4", "forever"], stdout=subprocess.PIPE, text=True,
                                 env=env, cwd=tmp_path)
        assert child.stdout.readline().strip() == "ready"
        start, pause = time.monotonic(), rng.uniform(0.5, 3.0)
        assert kill_when(child, seen), f"never saw the moment {moment!r}"
        child.stdout.close()
        step = check_nothing_is_corrupt(work, out, data, target, step)
    final = subprocess.run([sys.executable, "-c", code, str(step + 3), "once"], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    assert f"resumed_from {step} steps {step + 3}" in final.stdout  # it continued, not restarted
    check_nothing_is_corrupt(work, out, data, target, step + 3)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # a killed export's folders: gone
    prompt = [5, 6, 7, 10, 11, 12, 13]
    drafter = MTPDrafter(load_mtp(out, target), target)
    assert sd.generate(target, prompt, drafter, k=3, max_new_tokens=10).tokens == \
        sd.generate(target, prompt, max_new_tokens=10).tokens
