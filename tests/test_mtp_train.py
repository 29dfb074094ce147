"""The MTP graft trainer: learns on a tiny target, resumes, exports a head `load_mtp` reads (and its recipe.json)."""

import json

import pytest
import torch
from conftest import tiny_target, training_ids

import specdec_learn as sd
from specdec_learn.drafters.mtp import MTPDrafter, load_mtp
from specdec_learn.train import mtp as train_mtp
from specdec_learn.train.data import load_examples
from specdec_learn.train.features import capture


def write_examples(folder, n=24, period=7, length=40, vocab=128):
    """Examples whose responses cycle through `period` tokens: learnable two and three tokens ahead."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, example_id in enumerate(training_ids("synthetic", n)):
        start = 10 + (i % 2) * 40  # two different cycles
        cycle = list(range(start, start + period))
        ids = [5, 6, 7] + [cycle[j % period] for j in range(length)]
        rows.append({"id": example_id, "variant": "greedy", "input_ids": ids, "num_prompt_tokens": 3})
    (folder / "greedy-000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_graft_learns_resumes_and_exports(tmp_path):
    torch.manual_seed(0)
    target = tiny_target()
    data = write_examples(tmp_path / "data")
    kw = dict(depth=2, lr=1e-2, max_rows=None, work_dir=tmp_path / "work", data_dir=data, log=lambda *_: None)
    examples = load_examples(data)
    feats = capture(target, examples[:6], progress=False)
    before = train_mtp.evaluate(train_mtp.graft_head(target).eval(), target, feats, depth=2)
    head, run = train_mtp.train(target, steps=40, **kw)
    after = train_mtp.evaluate(head, target, feats, depth=2)
    assert run.steps == 40 and after[0] > before[0] + 0.3 and after[1] > before[1] + 0.3

    logs = []
    _, run = train_mtp.train(target, steps=42, **{**kw, "log": logs.append})  # picks up where it stopped
    assert run.steps == 42 and logs[0] == "resumed at step 40"

    out = train_mtp.export(head, target, tmp_path / "export", run, command="specdec train mtp --steps 42")
    loaded = load_mtp(out, target)
    assert loaded.chain_depth == 2 and next(iter(loaded.state_dict().values())).dtype == target.dtype
    made = json.loads((out / "recipe.json").read_text())
    assert made["method"] == "mtp" and made["steps"] == 42 and made["command"] == "specdec train mtp --steps 42"
    assert len(made["held_out"]["acc"]) == 2 and made["data"]["train_examples"] + made["data"]["held_out_examples"] == len(examples)
    prompt = examples[0].input_ids[:12]
    ar = sd.generate(target, prompt, max_new_tokens=12)
    assert sd.generate(target, prompt, MTPDrafter(loaded, target), k=3, max_new_tokens=12).tokens == ar.tokens


@pytest.mark.parametrize("share,length", [(1.0, 40), (0.0, 20)])
def test_a_templated_share_picks_the_examples_each_step_reads(tmp_path, share, length):
    from test_draft_model import write_dataset

    target = tiny_target()
    write_dataset(tmp_path / "data", target.vocab_size, n=20, magpie=20)  # templated: 40 tokens, Magpie: 20
    _, run = train_mtp.train(target, steps=5, depth=2, max_rows=None, work_dir=tmp_path / "work",
                             data_dir=tmp_path / "data", templated_share=share, log=lambda *_: None, progress=False)
    assert run.tokens == 5 * length and run.config["templated_share"] == share  # one source only
