"""`specdec bench` end to end: the JSON interface the book and outside checks drive."""

import json

from specdec_learn.cli import main


def test_bench_writes_table_json_and_plot(tmp_path, capsys, target):
    out, fig = tmp_path / "results.json", tmp_path / "bench.png"
    rc = main([
        "bench", "--model", "smollm2-135m", "--methods", "ar,ngram", "--k", "1,3", "--workload", "math",
        "--prompts", "2", "--max-new-tokens", "12", "--dtype", "fp32", "--json", str(out), "--plot", str(fig),
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
    for r in records.values():
        for key in ("tok_per_s", "speedup", "mean_acceptance_length", "per_position_acceptance", "greedy_match"):
            assert key in r
        assert r["greedy_match"] == 1.0  # fp32 greedy: lossless
        assert len(r["per_position_acceptance"]) <= r["k"]
    assert records[("ar", 0)]["speedup"] == 1.0
    assert fig.stat().st_size > 10_000


def test_generate_command(capsys, target):
    assert main(["generate", "--prompt", "Say hi.", "--method", "ngram", "--k", "2", "--max-new-tokens", "8",
                 "--dtype", "fp32"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "mean acceptance length" in captured.err


def test_bench_runs_another_drafter_folder_beside_the_default(tmp_path, capsys, target):
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


def test_bench_labels_the_other_run_even_when_draft_names_the_same_folder(tmp_path, target):
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


def test_bench_drafter_flag_errors_are_one_line(tmp_path, capsys):
    assert main(["bench", "--methods", "ar,ngram", "--k", "2", "--drafter", f"eagle3={tmp_path}"]) == 2
    assert "not among the methods run: add it to --methods" in capsys.readouterr().err
    assert main(["bench", "--methods", "ar,eagle3", "--k", "2", "--prompts", "1",
                 "--drafter", f"eagle3={tmp_path / 'none'}"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (above it: the target's loading bar)
    assert last.startswith("specdec: error:") and "none" in last and "check the path" in last
