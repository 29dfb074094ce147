"""benchmarks/gpu_profile.py (issue 46) at tiny size on the CPU, so the GPU script cannot rot between GPU runs.

One run of the whole script (every model config shrunk to a miniature, every drafter, the lossless
checks, the cost model) and the structure of the JSON it writes; the GPU-only path it shares (models built
on the meta device and initialised in place) checked against transformers' ordinary construction; and
bad inputs refused with one line that names the input and says what to do.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_profile.py"
CONFIGS = ROOT / "benchmarks" / "gpu_configs"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gp = load_script()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The whole script, tiny, on the CPU: (exit code, the JSON it wrote, its folder)."""
    out = tmp_path_factory.mktemp("gpu_profile") / "profile.json"
    rc = gp.main(["--tiny", "--device", "cpu", "--out", str(out), "--repeats", "2", "--warmup", "1"])
    return rc, json.loads(out.read_text()), out.parent


def model(data, name):
    return next(m for m in data["models"] if m["name"] == name)


def test_it_runs_and_says_what_it_measured(run):
    rc, data, folder = run
    assert rc == 0, data["problems"]
    assert [p.name for p in folder.iterdir()] == ["profile.json"]  # written atomically: no temporary left behind
    assert data["kind"] == "gpu_profile" and data["mode"] == "tiny" and data["schema"] == gp.SCHEMA
    assert "Random weights" in data["note"] and "not an acceptance" in data["note"]
    for key in ("device", "device_name", "backend", "torch", "transformers", "python"):
        assert data["machine"][key], key
    assert data["machine"]["device"] == "cpu" and data["machine"]["transformers"] == transformers.__version__
    assert data["settings"]["rows"] == list(gp.ROWS) and data["settings"]["clock"] == "time.perf_counter"
    assert data["skipped_for_time"] == []


def test_every_config_is_profiled_with_its_source(run):
    _, data, _ = run
    names = {json.loads(f.read_text())["name"] for f in CONFIGS.glob("*.json")
             if "family" in json.loads(f.read_text())}
    assert {m["name"] for m in data["models"]} == names >= {"Qwen3-8B", "Gemma 4 E2B", "Qwen3.5-0.8B"}
    for m in data["models"]:
        assert m["status"] == "ok", m.get("reason")
        assert m["source"] and m["size"] == "tiny" and m["params"] > 0
        chain = m["target_steps"]["chain"]
        assert [s["rows"] for s in chain] == list(gp.ROWS)
        assert all(s["median_ms"] > 0 and s["repeats"] == 2 and s["warmup"] == 1 for s in chain)


def test_trees_where_the_target_can_verify_one(run):
    _, data, _ = run
    steps = model(data, "Qwen3-8B")["target_steps"]
    assert [s["rows"] for s in steps["tree"]] == list(gp.ROWS)
    for name in ("Gemma 4 E2B", "Qwen3.5-0.8B"):  # sliding-window / linear attention: chains only, said why
        steps = model(data, name)["target_steps"]
        assert steps["tree"] is None and "can_verify_tree" in steps["tree_skipped"]


@pytest.mark.parametrize("name,methods", [("Qwen3-8B", ["eagle3", "dflash", "dspark"]),
                                          ("Gemma 4 E2B", ["gemma4_mtp"]), ("Qwen3.5-0.8B", ["mtp"])])
def test_every_published_drafter_has_its_rounds(run, name, methods):
    _, data, _ = run
    spec = next(json.loads(f.read_text()) for f in CONFIGS.glob("*.json")
                if json.loads(f.read_text()).get("name") == name)
    drafters = model(data, name)["drafters"]
    assert [d["method"] for d in drafters] == methods
    for d, dspec in zip(drafters, spec["drafters"]):
        assert d["status"] == "ok" and d["published"] == dspec["published"] and d["source"]
        chains = [r for r in d["rounds"] if r["shape"] == "chain"]
        assert [r["k"] for r in chains] == dspec["ks"]
        for r in d["rounds"]:
            assert r["draft_median_ms"] > 0 and r["verify_median_ms"] > 0 and r["rounds"] == 2
            assert "random weights" in r["accepted_note"]
    if name == "Qwen3-8B":  # the branching drafters grow trees too
        assert all(any(r["shape"] == "tree" for r in d["rounds"]) for d in drafters)


def test_every_drafter_is_lossless_in_its_published_format(run):
    _, data, _ = run
    checks = data["lossless"]
    assert checks["dtype"] == "float32" and checks["all_lossless"] is True and checks["runs"] >= 60
    ran = [r for r in checks["results"] if r["status"] == "ok"]
    assert all(r["lossless"] for r in ran)
    done = {(r["family"], r["drafter"], r["shape"]) for r in ran}
    for family in gp.FAMILIES:  # every family ran, with the drafters that read no target state at least
        assert {(family, "ngram", "chain"), (family, "suffix", "chain"), (family, "draft_model", "chain")} <= done
    for drafter in ("eagle3", "dflash", "dspark"):  # the Qwen3-8B pairs' formats, chains and trees
        assert {("qwen3", drafter, "chain"), ("qwen3", drafter, "tree")} <= done
    assert ("gemma4", "gemma4_mtp", "chain") in done and ("qwen3_5", "mtp", "chain") in done
    assert ("gemma3", "dflash", "chain") in done and ("qwen3_5", "dspark", "chain") in done
    for r in checks["results"]:  # whatever did not run says why
        assert r["status"] in ("ok", "skipped", "error") and (r["status"] == "ok" or r["reason"])
    assert any(r["accepted"] > 0 for r in ran) and any(r["accepted"] < r["drafted"] for r in ran)


def test_the_cost_model_uses_only_quoted_acceptance_lengths(run):
    _, data, _ = run
    cost = data["cost_model"]
    published = json.loads((CONFIGS / "published.json").read_text())
    assert cost["pairs"] and "round_speedup" in cost["formula"]
    for pair in cost["pairs"]:
        assert pair["break_even_L"] == pytest.approx(pair["draft_cost_steps"] + pair["verify_cost_steps"])
        assert pair["break_even_L"] > 0 and pair["ceiling_speedup"] > 0
        for p in pair["published"]:
            quoted = next(q for q in published["acceptance_lengths"] if q["source"] == p["source"])
            assert p["L"] == quoted["L"] and pair["k"] == quoted["k"] and p["source"].startswith("http")
            assert p["predicted_speedup"] == pytest.approx(
                p["L"] / (pair["draft_cost_steps"] + pair["verify_cost_steps"]))
    assert any(pair["published"] for pair in cost["pairs"])  # the Qwen3-8B DFlash figure at k = 7
    assert cost["no_acceptance_length"] and cost["published_speedups"]["source"]


def test_the_configs_name_their_sources():
    for file in CONFIGS.glob("*.json"):
        spec = json.loads(file.read_text())
        if file.name == "published.json":
            for entry in spec["acceptance_lengths"]:
                assert entry["source"] and entry["k"] >= 1 and entry["L"] >= 1
            continue
        assert spec["source"] and spec["hub_id"] and spec["model_class"] and spec["config"], file.name
        for d in spec.get("drafters", []):
            assert d["published"] and (d.get("source") or d.get("config_file")), (file.name, d["method"])


@pytest.mark.parametrize("file", sorted(p.name for p in CONFIGS.glob("*.json") if p.name != "published.json"))
def test_meta_construction_equals_transformers_own(file):
    """The GPU path builds on the meta device and initialises in place: every buffer (RoPE frequencies,
    embedding scales) and every norm must come out as transformers' ordinary construction makes them."""
    spec = json.loads((CONFIGS / file).read_text())
    model_class, config_class = getattr(transformers, spec["model_class"]), getattr(transformers, spec["config_class"])
    fields = gp.merged(spec["config"], spec["tiny"])
    torch.manual_seed(0)
    ours = gp.build_hf(model_class, config_class(**fields), torch.device("cpu"), torch.float32)
    theirs = model_class(config_class(**fields)).eval()
    ours_buffers, their_buffers = dict(ours.named_buffers()), dict(theirs.named_buffers())
    assert ours_buffers.keys() == their_buffers.keys()
    for name, buf in their_buffers.items():
        if name.endswith("token_ordering"):  # a permutation the checkpoint ships; zeros at init either way
            continue
        torch.testing.assert_close(ours_buffers[name], buf, msg=name)
    ours_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert {n: p.shape for n, p in ours_params.items()} == {n: p.shape for n, p in their_params.items()}
    for name, p in their_params.items():
        if p.ndim == 1 and p.unique().numel() == 1:  # norms, scalars, biases: a constant at init
            torch.testing.assert_close(ours_params[name], p, msg=name)
        elif p.ndim >= 2:  # matrices are random: the same spread (1-d random ones, Qwen3.5's A_log, too few)
            assert abs(ours_params[name].float().std() - p.float().std()) < 0.01, name
    if spec["config"].get("tie_word_embeddings"):
        assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight


def test_a_budget_spent_skips_and_still_writes(tmp_path):
    out = tmp_path / "p.json"
    assert gp.main(["--tiny", "--device", "cpu", "--out", str(out), "--budget-s", "0.001", "--skip-lossless"]) == 0
    data = json.loads(out.read_text())
    assert all(m["status"] == "skipped" and "budget" in m["reason"] for m in data["models"])
    assert data["lossless"] == {"skipped": "--skip-lossless"} and data["problems"]


def bad_config(tmp_path, name, text):
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return str(folder)


@pytest.mark.parametrize("args,says", [
    (["--budget-s", "-1"], "--budget-s must be a positive number of seconds"),
    (["--budget-s", "nan"], "--budget-s must be a positive number of seconds"),
    (["--rows", "1,x"], "--rows takes whole numbers"),
    (["--rows", "0,4"], "--rows takes whole numbers"),
    (["--context", "0"], "--context must be a whole number >= 1"),
    (["--repeats", "0"], "--repeats must be a whole number >= 1"),
    (["--warmup", "-2"], "--warmup must be a whole number >= 0"),
    (["--device", "tpu"], "--device must be cpu or cuda"),
    (["--configs", "/no/such/folder"], "--configs /no/such/folder: no such folder"),
    (["--models", "qwen9"], "--models qwen9: no such config"),
    (["--out", "/no/such/folder/p.json"], "the folder /no/such/folder does not exist"),
])
def test_bad_inputs_get_one_line_that_says_what_to_do(args, says, capsys):
    assert gp.main(["--tiny", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpu_profile: ") and says in err and "\n" not in err


def test_an_output_folder_is_refused(tmp_path, capsys):
    assert gp.main(["--tiny", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a folder: give a file name" in err and "\n" not in err


@pytest.mark.parametrize("text,says", [
    ("{ not json", "not valid JSON (line 1"),
    ('{"name": "x", "family": "qwen3"}', "missing source, model_class, config_class, config"),
    ('["a list"]', "expected a JSON object"),
])
def test_a_broken_config_is_named(tmp_path, capsys, text, says):
    assert gp.main(["--tiny", "--configs", bad_config(tmp_path, "broken.json", text)]) == 2
    err = capsys.readouterr().err.strip()
    assert "broken.json" in err and says in err and "\n" not in err


def test_an_old_transformers_is_refused_with_what_to_install(monkeypatch):
    monkeypatch.setattr(transformers, "__version__", "4.57.3")
    with pytest.raises(gp.InputError, match=r"transformers 4\.57\.3 is installed; specdec_learn needs >= 5\.19: "
                                            r"install the wheel carried"):
        gp.check_transformers()
