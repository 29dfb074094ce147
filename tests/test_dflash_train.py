"""Training DFlash and DSpark: the block mask and labels by hand, and a smoke run on a tiny
target that lowers the loss, resumes, and writes a checkpoint the drafter loads and decodes with."""

import json
import math

import pytest
import torch

import specdec_learn as sd
from conftest import tiny_llama, training_ids
from specdec_learn.drafters.dflash import DFlashDrafter, load_dflash
from specdec_learn.drafters.dspark import DSparkDrafter, load_dspark
from specdec_learn.target import Target
from specdec_learn.train import dflash, dspark
from specdec_learn.train.dflash import block_labels, block_mask, position_weights, sample_anchors


def test_block_mask_sees_the_context_before_the_anchor_and_its_own_block():
    mask = block_mask(torch.tensor([2, 4]), block_size=3, context_len=6)  # [6, 6 + 6]
    assert mask.shape == (6, 12)
    assert mask[:3, :6].tolist() == [[True, True, False, False, False, False]] * 3  # anchor 2: context 0, 1
    assert mask[3:, :6].tolist() == [[True, True, True, True, False, False]] * 3  # anchor 4: context 0..3
    assert mask[:3, 6:].tolist() == [[True] * 3 + [False] * 3] * 3  # its own block, all of it (not causal)
    assert mask[3:, 6:].tolist() == [[False] * 3 + [True] * 3] * 3


def test_labels_are_shifted_per_method_and_stop_at_the_first_gap():
    ids = torch.arange(10, 20)  # [10]
    loss_mask = torch.tensor([False, False, True, True, True, False, True, True, True, True])
    anchors = torch.tensor([2, 7])
    labels, valid = block_labels(ids, loss_mask, anchors, block_size=4, shift=0)  # DFlash: slot k -> x_{p+k}
    assert labels[0].tolist() == [12, 13, 14, 15] and valid[0].tolist() == [True, True, True, False]
    assert valid[1].tolist() == [True, True, True, False]  # x_10 is past the end
    labels, valid = block_labels(ids, loss_mask, anchors, block_size=4, shift=1)  # DSpark: slot k -> x_{p+k+1}
    assert labels[0].tolist() == [13, 14, 15, 16] and valid[0].tolist() == [True, True, False, False]


def test_anchors_and_weights():
    loss_mask = torch.tensor([False, False, True, True, True, False, True, True])
    anchors = sample_anchors(loss_mask, 10, torch.Generator().manual_seed(0))
    assert anchors.tolist() == [2, 3, 6]  # p and p + 1 both in the response
    torch.testing.assert_close(position_weights(4, 4.0, first=1), torch.tensor([0.0, 1.0, 0.7788, 0.6065]), atol=1e-4, rtol=0)
    assert position_weights(4, 4.0, first=0)[0] == 1.0


# -- a smoke run on a tiny target --------------------------------------------------------


@pytest.fixture
def tiny_setup(tmp_path, monkeypatch):
    """A tiny 8-layer target and a dataset of patterned 'responses' it could have written."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    model = tiny_llama(128, seed=5, hidden=32, layers=8)
    with torch.no_grad():  # O(1) embeddings and LM head, so a few steps can move the logits
        model.get_input_embeddings().weight.normal_(std=1.0)
        model.get_output_embeddings().weight.normal_(std=0.3)
    target = Target(model, name="tiny")
    data = tmp_path / "data"
    data.mkdir()
    g = torch.Generator().manual_seed(0)
    with (data / "greedy-000.jsonl").open("w") as f:
        for example_id in training_ids("train", 12):
            prompt = torch.randint(20, 128, (6,), generator=g).tolist()
            start = int(torch.randint(30, 60, (1,), generator=g))
            response = [30 + (start + j) % 30 for j in range(48)]  # counting: learnable from the context
            f.write(json.dumps({"id": example_id, "variant": "greedy", "input_ids": prompt + response,
                                "num_prompt_tokens": 6}) + "\n")
    return target, data, tmp_path / "out"


def mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_training_lowers_the_loss_resumes_and_ships_a_working_drafter(tiny_setup, method, capsys):
    target, data, out = tiny_setup
    if method == "dflash":
        train = lambda steps: dflash.train(target, layers=1, block_size=4, steps=steps, lr=1e-2, num_anchors=8,  # noqa: E731
                                           data_dir=data, progress=False)
    else:
        train = lambda steps: dspark.train(target, layers=1, block_size=4, markov_rank=4, steps=steps,  # noqa: E731
                                           lr=1e-2, num_anchors=8, data_dir=data, progress=False)
    _, run = train(40)
    losses = [record["loss"] for record in run.history if record["loss"] is not None]
    assert mean(losses[-8:]) < (0.8 if method == "dflash" else 0.9) * mean(losses[:8])
    if method == "dflash":  # plain cross-entropy: better than a uniform guess over the 128 tokens
        assert mean(losses[-8:]) < math.log(128)

    model, run = train(45)  # the same work dir ($SPECDEC_CACHE/train/<method>-tiny): continues from step 40
    assert "resumed at step 40" in capsys.readouterr().out and run.steps == 45 and len(run.history[run.resumed_from:]) == 5

    trainer = dflash if method == "dflash" else dspark
    trainer.export(model, target, out, run)
    assert json.loads((out / "recipe.json").read_text())["steps"] == 45
    if method == "dflash":
        drafter = DFlashDrafter(load_dflash(out))
    else:
        drafter = DSparkDrafter(load_dspark(out), markov=True, gate=0.5)
    prompt = [40, 41, 42, 43]
    ar = sd.generate(target, prompt, max_new_tokens=20)
    assert sd.generate(target, prompt, drafter, k=3, max_new_tokens=20).tokens == ar.tokens


def test_a_dspark_run_can_start_from_a_checkpoint_and_its_recipe_names_it(tiny_setup, tmp_path):
    import hashlib

    target, data, out = tiny_setup
    sizes = dict(layers=1, markov_rank=4, lr=1e-2, num_anchors=8, data_dir=data, progress=False)
    model, run = dspark.train(target, block_size=4, steps=6, **sizes)
    dspark.export(model, target, out, run)

    started, run = dspark.train(target, block_size=4, steps=0, work_dir=tmp_path / "warm", init_from=out, **sizes)
    saved = load_dspark(out).state_dict()  # bf16 on disk: the run starts from exactly those values
    assert all(torch.equal(t.float(), saved[name].float()) for name, t in started.state_dict().items())
    start = run.config["init_from"]
    assert start["steps"] == 6 and start["folder"] == str(out) and not run.config["init_from_target"]
    assert start["sha256"]["model.safetensors"] == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()

    with pytest.raises(ValueError, match=r"trained with block_size 4 \(this run: 5\)"):
        dspark.train(target, block_size=5, steps=0, work_dir=tmp_path / "other", init_from=out, **sizes)
    with pytest.raises(ValueError, match="markov_head.markov_w1.weight has shape"):
        dspark.train(target, block_size=4, steps=0, work_dir=tmp_path / "other",
                     init_from=out, **{**sizes, "markov_rank": 8})


# -- the mix of prompt sources a run reads --------------------------------------------------------


def sourced_examples(n_templated: int, n_magpie: int):
    from specdec_learn.train.examples import Example

    ids = [f"mbpp/{i}" for i in range(n_templated)] + [f"magpie/{i:016x}" for i in range(n_magpie)]
    return [Example(i, [1, 2, 3, 4], [False, True, True, True]) for i in ids]


def test_a_templated_share_sets_how_often_each_source_is_drawn():
    from specdec_learn.train.sources import prompt_source, source_weights

    examples = sourced_examples(3, 30)
    assert [prompt_source(ex.id) for ex in examples[2:4]] == ["templated", "magpie"]
    weights = source_weights(examples, 0.5)
    assert float(weights[:3].sum()) == pytest.approx(0.5) and float(weights[3:].sum()) == pytest.approx(0.5)

    drawn = []  # block_step draws its example with these weights, from the step's own generator
    feats = [type("F", (), {"id": ex.id, "ids": torch.tensor(ex.input_ids), "loss_mask": torch.tensor(ex.loss_mask)})()
             for ex in examples]
    step = dflash.block_step(feats, 1, lambda f, anchors: drawn.append(f.id) or (torch.tensor(0.0), {}), weights)
    for s in range(2000):
        step(s, torch.Generator().manual_seed(s))
    share = sum(prompt_source(i) == "templated" for i in drawn) / len(drawn)
    assert 0.45 < share < 0.55  # uniform drawing would give 3/33 = 0.09


@pytest.mark.parametrize("share", [1.5, 0.2])
def test_a_share_the_corpus_cannot_give_is_one_clear_error(share):
    from specdec_learn.train.sources import source_weights

    examples = sourced_examples(0, 5) if share == 0.2 else sourced_examples(2, 5)
    with pytest.raises(ValueError, match="--templated-share"):
        source_weights(examples, share)


def test_held_out_accuracy_is_reported_per_prompt_source():
    feats = [type("F", (), {"loss_mask": torch.tensor([True] * 6), "source": s})() for s in ["a", "b", "b"]]
    right = {"a": torch.tensor([float("nan"), 1.0, 1.0]), "b": torch.tensor([float("nan"), 0.0, 0.5])}
    result = dflash.evaluate(lambda f, anchors: (None, {"acc": right[f.source]}), feats, 3, sources=["a", "b", "b"])
    assert result["acc"][1:].tolist() == pytest.approx([1 / 3, 2 / 3])
    assert result["acc_a"][1:].tolist() == [1.0, 1.0] and result["acc_b"][1:].tolist() == [0.0, 0.5]
