"""Each method is declared once (methods.py): the zoo, the CLI, the bench, the checkpoints registry and the vLLM
backend read it, the retraining plan covers exactly its trainers, and what a drafter can do is read off its class."""

import re
from pathlib import Path

import pytest
from test_cli import reuse_target

import specdec_learn as sd
from specdec_learn import methods
from specdec_learn.bench import bench
from specdec_learn.checkpoints import HERE, shipped_drafters
from specdec_learn.cli import main, trainers
from specdec_learn.drafters import Drafter, Proposal, branching, drafter_class, reducible
from specdec_learn.train.retrain import PLAN
from specdec_learn.workloads import load_workload
from specdec_learn.zoo import make_drafter

ROOT = Path(__file__).resolve().parent.parent


class EchoDrafter(Drafter):
    """A toy method: drafts the last token again (right whenever the text repeats a token)."""

    name = "echo"

    @classmethod
    def build(cls, target, draft, options):
        return cls()

    def propose(self, state, k, sampling, generator):
        return Proposal([state.ids[-1]] * k)


@pytest.fixture
def echo(monkeypatch):
    """The toy method, declared in one place."""
    monkeypatch.setitem(methods.METHODS, "echo", methods.Method("echo", f"{__name__}:EchoDrafter"))


def test_a_method_declared_once_is_in_the_zoo_the_cli_and_the_bench(echo, monkeypatch, target, capsys):
    assert isinstance(make_drafter("echo", target), EchoDrafter)
    reuse_target(monkeypatch, target)
    assert main(["generate", "--method", "echo", "--k", "2", "--max-new-tokens", "4", "--dtype", "fp32",
                 "--device", "cpu", "--prompt", "Say hi."]) == 0
    assert "[echo k=2]" in capsys.readouterr().err
    records = bench(target, ["echo"], [2], load_workload("chat", n=1), max_new_tokens=4, progress=False)
    assert [(r.method, r.k, r.greedy_match) for r in records] == [("ar", 0, 1.0), ("echo", 2, 1.0)]


def test_what_a_drafter_can_do_is_read_off_its_class():
    for name in methods.names(lambda m: m.drafter is not None):
        cls = drafter_class(name)
        assert cls.name == name, f"{name}'s drafter calls itself {cls.name}"
        assert (name in branching()) == cls.can_branch
        assert (name in reducible()) == cls.can_reduce_vocabulary
    assert drafter_class("ar") is None


def test_every_shipped_folder_and_trainer_exists():
    for (method, target), folder in shipped_drafters().items():
        assert (HERE / folder / "config.json").is_file(), f"{method} for {target}: {folder} has no config.json"
    for name in trainers():
        assert (ROOT / "specdec_learn" / "train" / f"{name}.py").is_file()
    assert set(PLAN) == set(trainers()), "the retraining plan covers exactly the methods that have a trainer"


def test_the_architecture_page_lists_the_branching_drafters():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed = re.search(r"Drafters that branch:((?:\s*`\w+`,?)+)", text)
    assert listed, "docs/ARCHITECTURE.md must say 'Drafters that branch: ...'"
    assert re.findall(r"`(\w+)`", listed.group(1)) == list(branching())


def test_an_unknown_method_is_one_line():
    with pytest.raises(ValueError, match=r"Unknown method 'nope': choose from ar, ngram"):
        make_drafter("nope", None)


def test_bench_runs_trees_for_the_drafters_that_branch_and_says_which_do_not(monkeypatch, target, capsys, tmp_path):
    reuse_target(monkeypatch, target)
    out = tmp_path / "bench.json"
    assert main(["bench", "--methods", "ar,ngram,mtp", "--k", "2", "--tree", "4,2", "--prompts", "1",
                 "--max-new-tokens", "4", "--dtype", "fp32", "--device", "cpu", "--no-progress",
                 "--json", str(out)]) == 0
    assert "--tree: mtp drafts chains only" in capsys.readouterr().err
    import json

    runs = [(r["method"], r["k"], r.get("tree") is not None) for r in json.loads(out.read_text())["results"]]
    assert any(method == "ngram" and tree for method, _, tree in runs) and ("mtp", 2, False) in runs
    assert not any(method == "mtp" and tree for method, _, tree in runs)
