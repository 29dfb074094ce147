"""The Gemma-4-style assistant trainer: learns on a tiny target, resumes, round-trips the HF format."""

import torch
from conftest import tiny_target
from test_mtp_train import write_examples

import specdec_learn as sd
from specdec_learn.drafters.gemma4_mtp import Gemma4AssistantDrafter, load_gemma4_assistant
from specdec_learn.train import gemma4_mtp as train_g4
from specdec_learn.train.data import load_examples


def test_assistant_learns_resumes_and_exports(tmp_path):
    torch.manual_seed(0)
    target = tiny_target()
    data = write_examples(tmp_path / "data")
    kw = dict(depth=2, lr=1e-2, anchors=32, hidden_size=16, num_layers=2, work_dir=tmp_path / "work",
              data_dir=data, log=lambda *_: None)
    examples = load_examples(data)
    untrained, _ = train_g4.train(target, steps=0, **{**kw, "work_dir": tmp_path / "untrained"})
    before = train_g4.evaluate(untrained, target, examples[:6], depth=2)
    assistant, step = train_g4.train(target, steps=40, **kw)
    after = train_g4.evaluate(assistant, target, examples[:6], depth=2)
    assert step == 40 and after[0] > before[0] + 0.3 and after[1] > before[1]

    logs = []
    _, step = train_g4.train(target, steps=41, **{**kw, "log": logs.append})
    assert step == 41 and logs[0] == "resumed at step 40"

    assistant.save_pretrained(tmp_path / "export")
    loaded = load_gemma4_assistant(tmp_path / "export", target)
    prompt = examples[0].input_ids[:12]
    ar = sd.generate(target, prompt, max_new_tokens=12)
    out = sd.generate(target, prompt, Gemma4AssistantDrafter(loaded, target), k=3, max_new_tokens=12)
    assert out.tokens == ar.tokens
