"""The retraining job (train/retrain.py): each planned run exports once, a rerun skips it, status says so.

A run is `specdec train <method>` in a child process (`retrain.specdec`). The plan's test runs
it in this one instead (`cli.main`: the same command, without ~10 s of imports per run);
`test_a_run_is_the_specdec_command_in_a_child_process` checks the child itself.
"""

import json

from test_mtp_train import write_examples
from test_train_cli import tiny_target_folder

from specdec_learn.train import retrain


def test_the_plan_runs_each_trainer_once_resumes_and_reports(tmp_path, monkeypatch, capsys):
    from specdec_learn.cli import main as specdec

    monkeypatch.setattr(retrain, "specdec", specdec)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(retrain, "PLAN", {"mtp": ["--depth", "2", "--lr", "0.01", "--steps", "3", "--eval-every", "2"],
                                          "draft_model": ["--hidden", "16", "--layers", "1", "--batch", "2",
                                                          "--steps", "2", "--eval-every", "1"]})
    target, data = tiny_target_folder(tmp_path / "tiny"), write_examples(tmp_path / "data")
    argv = ["--target", str(target), "--data-dir", str(data), "--threads", "1"]
    assert retrain.main(["status", *argv]) == 0
    assert "not started" in capsys.readouterr().out

    assert retrain.main(["run", *argv]) == 0
    out = capsys.readouterr().out
    assert "mtp: exported to" in out and "draft_model: exported to" in out and "every run is done" in out
    recipe = json.loads((retrain.folders("mtp", str(target), "any")[1] / "recipe.json").read_text())
    assert recipe["steps"] == 3 and [r["step"] for r in recipe["held_out_curve"]] == [2, 3]
    assert "--eval-every 2" in recipe["command"] and str(data) in recipe["command"]
    assert "--device cpu" in recipe["command"]  # the default; `--device cuda` passes through to every run
    assert retrain.folders("mtp", str(target), recipe["data"]["sha256"])[1].parent == tmp_path / "cache" / "retrain"

    assert retrain.main(["run", *argv]) == 0  # started again: nothing left to do
    assert capsys.readouterr().out.count("done already") == 2
    assert retrain.main(["status", *argv]) == 0
    assert capsys.readouterr().out.count("done, exported to") == 2

    write_examples(data, n=30)  # the corpus grew: each run starts afresh, in a new work folder
    assert retrain.main(["run", *argv]) == 0
    out = capsys.readouterr().out
    assert "done already" not in out and "resumed" not in out and out.count("exported to") == 2
    grown = json.loads((retrain.folders("mtp", str(target), "x")[1] / "recipe.json").read_text())
    assert grown["data"]["sha256"] != recipe["data"]["sha256"] and grown["data"]["train_examples"] > \
        recipe["data"]["train_examples"]
    assert len(list((tmp_path / "cache" / "retrain" / "work").iterdir())) == 4

    retrain.PLAN["mtp"][3] = "0.02"  # the plan changed (another --lr): that run is made again, the other is not
    assert retrain.main(["run", *argv]) == 0
    out = capsys.readouterr().out
    assert out.count("done already") == 1 and "mtp: exported to" in out
    assert len(list((tmp_path / "cache" / "retrain" / "work").iterdir())) == 5

    from specdec_learn.plots import learning_curves  # chapter 11 draws the curve from these recipes

    line, = learning_curves({"mtp": grown}).axes[0].get_lines()
    assert list(line.get_xdata()) == [p["tokens_seen"] for p in grown["held_out_curve"]]
    assert list(line.get_ydata()) == [p["acc"][0] for p in grown["held_out_curve"]]


def test_a_run_is_the_specdec_command_in_a_child_process(tmp_path, monkeypatch, capfd):
    """Training sits below the CLI: retrain runs `python -m specdec_learn.cli`, with this package's code."""
    monkeypatch.chdir(tmp_path)
    assert retrain.specdec(["train", "mtp", "--help"]) == 0
    out = capfd.readouterr().out
    assert "usage: specdec train mtp" in out and "--templated-share" in out


def test_an_unknown_method_is_one_line(capsys):
    import pytest

    with pytest.raises(SystemExit):
        retrain.main(["status", "--methods", "eagle3,nope"])
    assert "no plan for nope" in capsys.readouterr().err


def test_learning_curves_start_a_block_drafter_at_its_first_drafted_slot():
    """DFlash's acc[0] is the anchor's (nan, never drafted): position 0 is slot 1, as for a chain drafter."""
    from specdec_learn.plots import learning_curves

    nan = float("nan")
    block = {"held_out_curve": [{"step": 1, "tokens_seen": 100, "acc": [nan, 0.2, 0.1]},
                                {"step": 2, "tokens_seen": 200, "acc": [nan, 0.3, 0.1]}]}
    chain = {"held_out_curve": [{"step": 1, "tokens_seen": 100, "acc": [0.25, 0.1]}]}
    block_line, chain_line = learning_curves({"dflash": block, "eagle3": chain}).axes[0].get_lines()
    assert list(block_line.get_ydata()) == [0.2, 0.3] and list(chain_line.get_ydata()) == [0.25]


def test_training_runs_lines_read_the_curve_from_the_first_drafted_slot():
    """The lines chapter 11 prints beside a learning curve: a block drafter's anchor slot is skipped there too."""
    from specdec_learn.plots import training_runs

    nan = float("nan")
    block = {"steps": 2, "tokens_seen": 200, "train_minutes": 1.5, "held_out": {"acc": [nan, 0.3, 0.1, 0.05]},
             "held_out_curve": [{"step": 1, "tokens_seen": 100, "acc": [nan, 0.2, 0.1]},
                                {"step": 2, "tokens_seen": 200, "acc": [nan, 0.3, 0.1]}]}
    chain = {"steps": 1200, "tokens_seen": 1_234_567, "train_minutes": 61.5, "held_out": {"acc": [0.25, 0.125]},
             "held_out_curve": [{"step": 1200, "tokens_seen": 1_234_567, "acc": [0.25, 0.125]}]}
    lines = training_runs({"dflash": block, "eagle3, longer": chain}).splitlines()
    assert lines == ["dflash             2 steps,       200 tokens,   1.5 min; position 1: 0.20 -> 0.30",
                     "eagle3, longer 1,200 steps, 1,234,567 tokens,  61.5 min; position 1: 0.25 -> 0.25"]
    assert training_runs({"dflash": block}, positions=3).splitlines()[1] == \
        "       positions 1-3 at the end: 0.30 0.10 0.05"  # under the runs, past the labels
