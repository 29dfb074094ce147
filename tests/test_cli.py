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
