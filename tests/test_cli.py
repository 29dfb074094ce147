"""`specdec bench` end to end: the JSON interface the book and outside checks drive.

The commands run in this process, on the session's `target`: `reuse_target` hands it to the CLI wherever the
CLI would load the same model (test_every_method.py keeps the real load path).
"""

import json

import pytest

import specdec_learn.target as target_module
from specdec_learn.cli import main
from specdec_learn.models import default_device, resolve_dtype


def reuse_target(monkeypatch, target) -> None:
    """Make `load` (the CLI's, which it imports when a command runs) return `target` when asked for it (name, dtype
    and device as resolved), else load."""
    load = target_module.load

    def load_or_reuse(name="smollm2-135m", dtype=None, device=None, cache_dir=None, invariant=True):
        resolved = device or default_device()
        asked = (name, resolve_dtype(dtype, resolved), resolved, cache_dir, invariant)
        if asked == (target.name, target.dtype, str(target.device), None, target.row_invariant):
            return target
        return load(name, dtype=dtype, device=device, cache_dir=cache_dir, invariant=invariant)

    monkeypatch.setattr(target_module, "load", load_or_reuse)


@pytest.fixture(autouse=True)
def _reuse_target(monkeypatch, target):
    reuse_target(monkeypatch, target)


def test_bench_writes_table_json_and_plot(tmp_path, capsys):
    out, fig = tmp_path / "results.json", tmp_path / "bench.png"
    rc = main([
        "bench", "--model", "smollm2-135m", "--methods", "ar,ngram", "--k", "1,3", "--workload", "math",
        "--prompts", "1", "--max-new-tokens", "12", "--dtype", "fp32", "--json", str(out), "--plot", str(fig),
        "--no-progress",
    ])
    assert rc == 0
    table = capsys.readouterr().out
    assert "ngram" in table and "speedup" in table
    data = json.loads(out.read_text())
    assert {"cpu", "cores", "torch", "transformers", "dtype"} <= set(data["machine"])
    assert data["machine"]["dtype"] == "float32"
    records = {(r["method"], r["k"]): r for r in data["results"]}
    assert set(records) == {("ar", 0), ("ngram", 1), ("ngram", 3)}
    ar = records[("ar", 0)]
    for r in records.values():
        for key in ("tok_per_s", "speedup", "mean_acceptance_length", "per_position_acceptance", "greedy_match"):
            assert key in r
        assert r["greedy_match"] == 1.0  # fp32 greedy: lossless
        assert len(r["per_position_acceptance"]) <= r["k"]
    for k in (1, 3):  # the n-gram rows, by the definitions (stats.py: compare_to_ar)
        r = records[("ngram", k)]
        assert r["num_drafts"] > 0 and r["num_accepted_tokens"] > 0
        assert r["speedup"] == pytest.approx(r["tok_per_s"] / ar["tok_per_s"])
        assert r["mean_acceptance_length"] == pytest.approx(1 + sum(r["per_position_acceptance"]))
        assert r["mean_acceptance_length"] == pytest.approx(1 + r["num_accepted_tokens"] / r["num_drafts"])
    assert fig.stat().st_size > 10_000


def test_generate_command(capsys):
    assert main(["generate", "--prompt", "Say hi.", "--method", "ngram", "--k", "2", "--max-new-tokens", "8",
                 "--dtype", "fp32"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "mean acceptance length" in captured.err


def test_bench_runs_another_drafter_folder_beside_the_default(tmp_path, capsys):
    """--drafter METHOD=DIR: the folder's weights are what runs (zeroed, they accept less), and the JSON says which."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from specdec_learn.bench import read_results
    from specdec_learn.checkpoints import shipped

    other = tmp_path / "zeroed" / "gemma4-assistant"
    shutil.copytree(shipped("gemma4_mtp", "smollm2-135m"), other)
    weights = other / "model.safetensors"
    save_file({name: torch.zeros_like(t) for name, t in load_file(weights).items()}, weights, {"format": "pt"})
    out = tmp_path / "results.json"
    assert main(["bench", "--methods", "ar,gemma4_mtp", "--k", "2", "--workload", "math", "--prompts", "1",
                 "--max-new-tokens", "16", "--dtype", "fp32", "--drafter", f"gemma4_mtp={other}", "--json", str(out),
                 "--no-progress"]) == 0
    assert "gemma4_mtp @zeroed/gemma4-assistant" in capsys.readouterr().out
    results = read_results(out)
    default, zeroed = results.get("gemma4_mtp", 2), results.get("gemma4_mtp", 2, drafter=str(other))
    assert default["drafter"] is None and zeroed["drafter"] == str(other) and len(results.rows) == 3
    assert default["greedy_match"] == zeroed["greedy_match"] == 1.0
    assert zeroed["mean_acceptance_length"] < default["mean_acceptance_length"]
    assert results.config["drafter"] == [["gemma4_mtp", str(other)]]


def test_bench_labels_the_other_run_even_when_draft_names_the_same_folder(tmp_path):
    """--draft X with --drafter m=X: only the --drafter run carries the folder; the default rows stay unlabelled."""
    from specdec_learn.bench import read_results
    from specdec_learn.checkpoints import shipped

    folder, out = str(shipped("gemma4_mtp", "smollm2-135m")), tmp_path / "results.json"
    assert main(["bench", "--methods", "ar,gemma4_mtp", "--k", "2", "--workload", "math", "--prompts", "1",
                 "--max-new-tokens", "8", "--dtype", "fp32", "--draft", folder, "--drafter", f"gemma4_mtp={folder}",
                 "--json", str(out), "--no-progress"]) == 0
    results = read_results(out)
    assert [r["drafter"] for r in results.rows] == [None, None, folder]
    assert results.get("gemma4_mtp", 2)["drafter"] is None


def test_bench_runs_take_turns_prompt_by_prompt_each_with_its_own_drafter(monkeypatch, target):
    """AR and every run on prompt 1, then on prompt 2: a drifting machine slows them alike; no drafter is shared."""
    from types import SimpleNamespace

    from specdec_learn import bench as bench_module
    from specdec_learn.stats import Stats
    from specdec_learn.workloads import load_workload

    calls = []

    def fake_generate(target, text, drafter=None, k=0, max_new_tokens=8, **kw):
        calls.append((text, None if drafter is None else id(drafter), k))
        return SimpleNamespace(stats=Stats(), tokens=[1])

    monkeypatch.setattr(bench_module, "generate", fake_generate)
    prompts = load_workload("math", n=2)
    records = bench_module.bench(target, ["ngram"], [2, 3], prompts, max_new_tokens=4, progress=False)
    timed = calls[1:]  # the first call is the warm-up
    assert [(text, k) for text, _, k in timed] == [(p.text, k) for p in prompts for k in (0, 2, 3)]
    drafters = [d for _, d, k in timed[:3]]
    assert drafters[0] is None and drafters[1] != drafters[2]  # k = 2 and k = 3 each have their own
    assert [d for _, d, _ in timed[3:]] == drafters  # and keep it from prompt to prompt
    assert [(r.method, r.k) for r in records] == [("ar", 0), ("ngram", 2), ("ngram", 3)]


def test_results_label_says_whether_the_cpu_has_bf16_instructions(tmp_path):
    """Results files from before machine.cpu_bf16 (or cpu_amx) keep their label; newer ones say which kind of CPU
    ran them."""
    import json

    from specdec_learn.bench import read_results

    machine = {"dtype": "bfloat16", "cpu": "AMD EPYC", "cores": 2, "row_invariant": True}  # the kernels: test_reference
    labels = []
    for bf16 in ("absent", True, False, None):
        path = tmp_path / f"{bf16}.json"
        path.write_text(json.dumps({"machine": machine if bf16 == "absent" else {**machine, "cpu_bf16": bf16},
                                    "config": {"num_prompts": 3, "max_new_tokens": 8}, "results": []}))
        labels.append(read_results(path).label)
    run = "3 prompts x 8 new tokens (small run; greedy), bfloat16, AMD EPYC"
    assert labels == [f"{run}, 2 cores", f"{run} with bf16 instructions, 2 cores",
                      f"{run} without bf16 instructions, 2 cores", f"{run}, 2 cores"]
    for amx, words in [(True, "with AMX bf16 instructions"), (False, "with AVX512-BF16, no AMX")]:
        path = tmp_path / f"amx{amx}.json"
        path.write_text(json.dumps({"machine": {**machine, "cpu_bf16": True, "cpu_amx": amx},
                                    "config": {"num_prompts": 3, "max_new_tokens": 8}, "results": []}))
        assert read_results(path).label == f"{run} {words}, 2 cores"


def test_bench_drafter_flag_errors_are_one_line(tmp_path, capsys):
    assert main(["bench", "--methods", "ar,ngram", "--k", "2", "--drafter", f"eagle3={tmp_path}"]) == 2
    assert "not among the methods run: add it to --methods" in capsys.readouterr().err
    assert main(["bench", "--methods", "ar,eagle3", "--k", "2", "--prompts", "1",
                 "--drafter", f"eagle3={tmp_path / 'none'}"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (above it: the target's loading bar)
    assert last.startswith("specdec: error:") and "none" in last and "check the path" in last
