"""`specdec train <method>`: every method has the shared flags and its own, refuses the others', and runs."""

import json

import pytest
import torch
from conftest import tiny_llama
from test_mtp_train import write_examples

from specdec_learn.cli import main, trainers

TRAINERS = trainers()

SHARED = ["--target", "--steps", "--budget-min", "--lr", "--out", "--threads", "--device", "--data-dir", "--work-dir", "--seed",
          "--eval-every", "--no-progress"]
OWN = {  # each method's own flags: no other method accepts them unless it has its own flag of that name
    "eagle3": ["--dtype", "--draft-vocab", "--ttt-steps", "--tokens-per-batch", "--templated-share"],
    "dflash": ["--dtype", "--layers", "--block-size", "--anchors", "--gamma", "--loss-slots",
               "--templated-share"],
    "dspark": ["--dtype", "--layers", "--block-size", "--markov-rank", "--anchors", "--gamma",
               "--init-from", "--templated-share"],
    "mtp": ["--depth", "--beta", "--max-rows", "--templated-share"],
    "gemma4_mtp": ["--depth", "--beta", "--anchors", "--hidden-size", "--layers", "--templated-share"],
    "draft_model": ["--batch", "--hidden", "--layers", "--templated-share"],
}
DATA = ["--target", "--dtype", "--device", "--data-dir", "--budget-min", "--backend", "--temperature",
        "--max-new-tokens", "--batch-size", "--seed", "--no-progress"]


def test_the_cli_covers_every_trainer():
    assert sorted(TRAINERS) == sorted(OWN)


@pytest.mark.parametrize("method", ["data", *OWN])
def test_every_method_parses_its_help_with_the_shared_flags_and_its_own(method, capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", method, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for flag in DATA if method == "data" else SHARED + OWN[method]:
        assert f"{flag} " in text or f"{flag}\n" in text, f"{method} --help does not list {flag}"


FOREIGN = sorted({(method, flag) for method in OWN for other in OWN.values() for flag in other
                  if flag not in OWN[method]} | {("data", "--steps"), ("data", "--lr"), ("dflash", "--gpu"),
                                                 ("eagle3", "--generate-minutes"), ("mtp", "--budget-minutes"),
                                                 ("dflash", "--block")})  # no guessing an abbreviation either


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_one_line(capsys):
    assert main(["train", "dflash", "--device", "cuda", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: --device cuda:") and "--device cpu" in err and err.count("\n") == 1


@pytest.mark.parametrize("method,flag", FOREIGN)
def test_a_flag_the_method_does_not_have_is_refused(method, flag, capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", method, flag, "1"])
    assert done.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err


# --- a real run through the command line -------------------------------------------------------


def tiny_target_folder(path):
    """A tiny Llama with a 128-word tokenizer, saved as an HF folder `specdec train --target` can load."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tiny_llama(128, hidden=32).save_pretrained(path)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token="t2", pad_token="t0").save_pretrained(path)
    return path


def test_train_mtp_through_the_cli_records_the_command_resumes_and_refuses_a_damaged_state(tmp_path, capsys):
    target = tiny_target_folder(tmp_path / "tiny")
    data, work, out = write_examples(tmp_path / "data"), tmp_path / "work", tmp_path / "out"
    argv = ["train", "mtp", "--target", str(target), "--data-dir", str(data), "--work-dir", str(work),
            "--out", str(out), "--depth", "2", "--lr", "0.01", "--threads", "1", "--no-progress", "--eval-every", "2"]
    assert main([*argv, "--steps", "4"]) == 0
    made = json.loads((out / "recipe.json").read_text())
    assert [(r["step"], len(r["acc"])) for r in made["held_out_curve"]] == [(2, 2), (4, 2)]  # the learning curve
    assert 0 < made["held_out_curve"][0]["tokens_seen"] < made["held_out_curve"][1]["tokens_seen"] == made["tokens_seen"]
    assert made["steps"] == 4 and made["method"] == "mtp" and made["config"]["depth"] == 2
    assert made["command"].startswith(f"specdec train mtp --target {target} --steps 4 ") and "--depth 2" in made["command"]
    assert made["tokens_seen"] > 0 and len(made["held_out"]["acc"]) == 2 and len(made["data"]["sha256"]) == 64
    assert made["machine"]["torch"] == torch.__version__

    assert main([*argv, "--steps", "6"]) == 0  # the same command with a larger budget continues
    assert "resumed at step 4" in capsys.readouterr().out
    again = json.loads((out / "recipe.json").read_text())
    assert again["steps"] == 6 and [r["step"] for r in again["held_out_curve"]] == [2, 4, 6]  # kept across a resume

    (work / "state.pt").write_bytes(b"not a state")
    assert main([*argv, "--steps", "8"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and str(work / "state.pt") in errors[0] and "delete it" in errors[0]
    assert errors[0].startswith("specdec: error: ") and "Traceback" not in errors[0]


def test_train_data_names_the_committed_corpus_instead_of_writing_into_it(tmp_path, capsys):
    from specdec_learn.train import corpus, data

    folder = corpus.store_dir(corpus.Settings())
    before = sorted(p.name for p in folder.iterdir())
    assert main(["train", "data", "--target", "smollm2-135m", "--dtype", "auto"]) == 0
    out = capsys.readouterr().out
    assert f"committed corpus in {folder}" in out and "specdec_learn.train.corpus start" in out
    assert sorted(p.name for p in folder.iterdir()) == before
    with pytest.raises(ValueError, match="is a corpus store"):
        data.build_dataset(None, folder, [])


def test_a_warm_start_may_not_write_over_the_checkpoint_it_starts_from(tmp_path, capsys):
    target, folder = tiny_target_folder(tmp_path / "tiny"), tmp_path / "dspark"
    assert main(["train", "dspark", "--target", str(target), "--init-from", str(folder), "--out", str(folder)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]  # not the progress bars
    assert len(errors) == 1 and errors[0].startswith(f"specdec: error: --init-from {folder} is where this run would write")
