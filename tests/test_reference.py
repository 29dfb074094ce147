"""The book's reference run (benchmarks/reference.py) and how chapters read it back (bench.read_reference)."""

import json
import sys
from pathlib import Path

import pytest

from specdec_learn import bench as bench_module
from specdec_learn.bench import Run, read_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import reference  # noqa: E402

MACHINE = {"cpu": "AMD EPYC", "cores": 2, "cpu_bf16": True, "dtype": "float32"}


def row(method, k, speedup):
    return {"method": method, "k": k, "tree": None, "speedup": speedup, "tok_per_s": 10 * speedup,
            "mean_acceptance_length": 1 + k * 0.3, "greedy_match": 1.0, "per_position_acceptance": [0.5] * k}


def write_reference(folder: Path, name="reference_amd_epyc", prompts=10, tokens=128):
    runs = [{"workload": w, "sampling": s, "num_prompts": prompts, "max_new_tokens": tokens, "prompt_ids": ["p"],
             "conditions": {"seconds": 1.0, "others_cpu_share": 0.01, "disturbed": False},
             "results": [row("ar", 0, 1.0), row("ngram", 3, 1.3 if w == "humaneval" else 0.9)]}
            for w, s in reference.RUNS]
    (folder / f"{name}.json").write_text(json.dumps({"machine": MACHINE, "full": True, "runs": runs}))


def test_read_reference_gives_each_run_with_its_label_and_table(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_module, "RESULTS", tmp_path)
    write_reference(tmp_path)
    greedy = read_reference("humaneval", "greedy")
    assert greedy.get("ngram", 3)["speedup"] == 1.3 and read_reference("chat").get("ngram", 3)["speedup"] == 0.9
    assert greedy.label == ("10 prompts x 128 new tokens (full run; humaneval, greedy), float32, torch's own "
                            "kernels, AMD EPYC with bf16 instructions, 2 cores")  # the machine records no row_invariant
    invariant = bench_module.Results(greedy.path, {**greedy.machine, "row_invariant": True}, greedy.config, greedy.rows)
    assert "torch's own kernels" not in invariant.label
    assert "(small run; humaneval, temperature 1)" not in read_reference("humaneval", "temperature 1").label
    table = greedy.table({"ar": 0, "ngram": 3}).splitlines()
    assert table[2].startswith("ar") and "1.30x" in table[3] and table[-1].endswith("reference_amd_epyc.json)")
    with pytest.raises(KeyError, match="no chat run at temperature 1"):
        read_reference("chat", "temperature 1")
    write_reference(tmp_path, "reference_intel_xeon")
    with pytest.raises(FileNotFoundError, match="found: reference_amd_epyc, reference_intel_xeon"):
        read_reference()
    assert read_reference(name="reference_intel_xeon").path.name == "reference_intel_xeon.json"


@pytest.fixture
def fake_runs(monkeypatch):
    """reference.main over a stand-in target and bench: what is tested is what it writes or refuses."""
    state = {"disturbed": False, "calls": []}

    def fake_bench(target, methods, ks, prompts, max_new_tokens, sampling, progress):
        state["calls"].append((ks, len(prompts), max_new_tokens, sampling.temperature))
        share = 0.5 if state["disturbed"] else 0.01
        return Run([bench_module.Record("ar", 0, bench_module.Stats(), [])],
                   {"seconds": 1.0, "others_cpu_share": share, "disturbed": state["disturbed"]})

    monkeypatch.setattr(reference.sd, "load", lambda name: None)
    monkeypatch.setattr(reference, "machine_info", lambda target: MACHINE)
    monkeypatch.setattr(reference, "bench", fake_bench)
    monkeypatch.setattr(reference, "load_workload", lambda name, n: [type("P", (), {"id": f"{name}{i}"}) for i in range(n)])
    return state


def test_reference_is_full_size_and_sweeps_once(fake_runs, tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "RESULTS", tmp_path)
    assert reference.main([]) == 0
    data = json.loads((tmp_path / "reference_amd_epyc.json").read_text())
    assert [(r["workload"], r["sampling"], r["num_prompts"], r["max_new_tokens"]) for r in data["runs"]] == [
        (w, s, 10, 128) for w, s in reference.RUNS]
    sweeps = [ks for ks, *_ in fake_runs["calls"]]
    assert sweeps[0]["ngram"] == reference.SWEEP["ngram"] and sweeps[1]["ngram"] == reference.KS["ngram"]
    with pytest.raises(SystemExit, match="at least 10 prompts x 128 tokens"):
        reference.main(["--prompts", "2"])


def test_a_disturbed_run_never_becomes_the_reference(fake_runs, tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "RESULTS", tmp_path)
    fake_runs["disturbed"] = True
    with pytest.raises(SystemExit, match="Not written: other processes disturbed"):
        reference.main([])
    assert not list(tmp_path.iterdir())
