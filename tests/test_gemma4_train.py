"""The Gemma-4-style assistant trainer: learns on a tiny target, resumes, ships its table as E·P, reloads."""

import json

import pytest
import torch
from conftest import tiny_target
from safetensors import safe_open
from test_mtp_train import write_examples

import specdec_learn as sd
from specdec_learn.drafters.gemma4_mtp import Gemma4AssistantDrafter, load_gemma4_assistant
from specdec_learn.checkpoints import PROJECTION, TABLE
from specdec_learn.train import gemma4_mtp as train_g4
from specdec_learn.train.data import load_examples
from specdec_learn.train.features import capture


def test_assistant_learns_resumes_and_ships_its_table_as_a_projection(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))  # where the shipped table is rebuilt
    torch.manual_seed(0)
    target = tiny_target()
    target.model.save_pretrained(tmp_path / "target")
    target.name = str(tmp_path / "target")  # materialize reads the target's embedding from its folder
    data = write_examples(tmp_path / "data")
    kw = dict(depth=2, lr=1e-2, anchors=32, hidden_size=16, num_layers=2, work_dir=tmp_path / "work",
              data_dir=data, log=lambda *_: None)
    examples = load_examples(data)
    feats = capture(target, examples[:6], kv_layer=train_g4.kv_layer(target), progress=False)
    untrained, _ = train_g4.train(target, steps=0, **{**kw, "work_dir": tmp_path / "untrained"})
    before = train_g4.evaluate(untrained.assistant, target, feats, depth=2)
    student, run = train_g4.train(target, steps=40, **kw)
    after = train_g4.evaluate(student.assistant, target, feats, depth=2)
    assert run.steps == 40 and after[0] > before[0] + 0.3 and after[1] > before[1]
    proj = student.table.proj.detach()
    torch.testing.assert_close(student.assistant.model.embed_tokens.weight, target.embed_tokens.weight.float() @ proj)

    logs = []
    _, run = train_g4.train(target, steps=41, **{**kw, "log": logs.append})
    assert run.steps == 41 and logs[0] == "resumed at step 40"

    out = train_g4.export(student, target, tmp_path / "export", run)
    with safe_open(out / "model.safetensors", "pt") as f:
        assert PROJECTION in f.keys() and TABLE not in f.keys()
    assert json.loads((out / "recipe.json").read_text())["steps"] == 41
    loaded = load_gemma4_assistant(out, target)  # the table rebuilt from the target's embedding
    prompt = examples[0].input_ids[:12]
    ar = sd.generate(target, prompt, max_new_tokens=12)
    out = sd.generate(target, prompt, Gemma4AssistantDrafter(loaded, target), k=3, max_new_tokens=12)
    assert out.tokens == ar.tokens


@pytest.mark.parametrize("share,length", [(1.0, 40), (0.0, 20)])
def test_a_templated_share_picks_the_examples_each_step_reads(tmp_path, share, length):
    from test_draft_model import write_dataset

    target = tiny_target()
    write_dataset(tmp_path / "data", target.vocab_size, n=20, magpie=20)  # templated: 40 tokens, Magpie: 20
    _, run = train_g4.train(target, steps=5, depth=2, anchors=8, hidden_size=16, num_layers=1,
                            work_dir=tmp_path / "work", data_dir=tmp_path / "data", templated_share=share,
                            log=lambda *_: None, progress=False)
    assert run.tokens == 5 * length and run.config["templated_share"] == share  # one source only
