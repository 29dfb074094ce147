"""CI's own tools: .ci/slowest.py reads what a run kept, and benchmarks/tables.py keeps each generated
table equal to the JSON it shows."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


slowest = module(ROOT / ".ci" / "slowest.py")
tables = module(ROOT / "benchmarks" / "tables.py")

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3" time="7.5">
<testcase classname="tests.test_a" name="test_one" time="1.25"/>
<testcase classname="tests.test_b" name="test_two" time="4.0"/>
<testcase classname="tests.test_a" name="test_three" time="2.0"/>
</testsuite></testsuites>"""


def test_a_run_is_summed_by_file_and_step(tmp_path):
    (tmp_path / "main.xml").write_text(REPORT)
    (tmp_path / "steps.txt").write_text("== make setup vllm-env: 205 s\n== make test: 1036 s\n== all: 1241 s\n")
    run = slowest.record(tmp_path, "a test")
    assert run["steps_s"] == {"make setup vllm-env": 205, "make test": 1036, "all": 1241}
    assert run["pytest"]["main"] == {"tests": 3, "wall_s": 7.5, "by_file_s": {"tests.test_b": 4.0, "tests.test_a": 3.2}}
    out = tmp_path / "run.json"
    assert slowest.main([str(tmp_path), "--json", str(out), "--label", "a test"]) == 0
    assert json.loads(out.read_text())["label"] == "a test"


def test_no_reports_is_one_line_not_a_traceback(tmp_path, capsys):
    assert slowest.main([str(tmp_path)]) == 1
    assert "no JUnit XML reports" in capsys.readouterr().err


def test_every_generated_table_equals_its_json():
    assert tables.main(["--check"]) == 0, "run: python benchmarks/tables.py"


def test_a_table_follows_its_json(tmp_path):
    shutil.copytree(tables.RESULTS / "ci", tmp_path / "ci")
    text = "<!-- table: ci-times -->\n<!-- end table -->"
    before = tables.render(text, tmp_path)
    run = json.loads((tmp_path / "ci" / "ci_run.json").read_text())
    run["steps_s"]["all"] += 600
    (tmp_path / "ci" / "ci_run.json").write_text(json.dumps(run))
    after = tables.render(text, tmp_path)
    assert before != after and f"| **all** | {run['steps_s']['all'] / 60:.1f} |" in after


def test_a_bench_table_follows_its_json(tmp_path):
    shutil.copy(tables.RESULTS / "trees_bf16_xeon.json", tmp_path / "run.json")
    text = "<!-- table: bench:run -->\n<!-- end table -->\n<!-- table: costs:run -->\n<!-- end table -->"
    before = tables.render(text, tmp_path)
    run = json.loads((tmp_path / "run.json").read_text())
    row = next(r for r in run["results"] if r["method"] == "eagle3" and r["k"] == 3 and r["tree"] is None)
    row["speedup"] = 9.87
    (tmp_path / "run.json").write_text(json.dumps(run))
    after = tables.render(text, tmp_path)
    assert "9.87×" not in before and after.count("9.87×") == 2  # the grid's cell and the costs' fastest chain


def test_an_unknown_table_is_named():
    with pytest.raises(KeyError, match="unknown table 'speed:run'"):
        tables.render("<!-- table: speed:run -->\n<!-- end table -->")
