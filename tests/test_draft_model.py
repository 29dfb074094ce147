"""The distilled draft model: training lowers the loss, the shipped format round-trips, it is lossless."""

import json
from copy import deepcopy

import pytest
import torch
from transformers import AutoModelForCausalLM

import specdec_learn as sd
from conftest import tiny_target, training_ids
from specdec_learn.checkpoints import materialize, shipped, write_draft_delta
from specdec_learn.train.examples import Example
from specdec_learn.train.draft_model import Student, agreement, student_config, train
from specdec_learn.train.magpie import PREFIX as MAGPIE
from specdec_learn.zoo import make_drafter


def write_dataset(folder, vocab_size: int, n: int = 24, seed: int = 0, magpie: int = 0):
    """Tiny examples in the shared pipeline's format: counting (t -> t + 1), which a student learns fast.

    n templated examples of 40 tokens, then `magpie` examples of 20 (Magpie prompt ids).
    """
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "greedy-000.jsonl", "w") as f:
        for example_id, length in [(i, 40) for i in training_ids("tiny", n)] + [
                (i, 20) for i in training_ids(MAGPIE.rstrip("/"), magpie)]:
            start = int(torch.randint(3, vocab_size - 8, (1,), generator=g))
            ids = [(start + j) % vocab_size for j in range(length)]
            f.write(json.dumps({"id": example_id, "input_ids": ids, "num_prompt_tokens": 8}) + "\n")


def test_training_lowers_the_loss_and_resumes(tmp_path):
    target = tiny_target(vocab_size=64, hidden=32)
    write_dataset(tmp_path / "data", 64)
    shape = dict(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
    student, run = train(target, steps=60, batch=4, lr=2e-2, work_dir=tmp_path / "work", data_dir=tmp_path / "data",
                         log=lambda line: None, **shape)
    losses = [record["loss"] for record in run.history]  # one per step: step 10's is losses[9]
    assert run.steps == 60 and losses[59] < 0.8 * losses[9]
    _, run = train(target, steps=70, batch=4, lr=2e-2, work_dir=tmp_path / "work", data_dir=tmp_path / "data",
                   log=lambda line: None, **shape)
    assert run.steps == 70 and run.resumed_from == 60  # continued from the saved state, not from zero


def test_agreement_scores_next_response_tokens_of_greedy_answers_per_source():
    # a "model" that always predicts token 5: right exactly where the next response token is 5
    def always_5(ids, rows):
        return torch.nn.functional.one_hot(torch.full((len(rows),), 5), 8).float()  # [r, V]

    prompt = [1, 2]  # masked: never scored, even where the next token is 5
    examples = [
        Example(MAGPIE + "a", prompt + [5, 5, 3], [False, False, True, True, True]),  # 2 of 3 right
        Example("humaneval/7", [5] + prompt + [5], [False, False, False, True]),  # 1 of 1 right
        Example("gsm8k/3", prompt + [3, 3], [False, False, True, True]),  # 0 of 2 right
        Example("gsm8k/3", prompt + [5, 5], [False, False, True, True], variant="T0.8s1"),  # sampled: skipped
    ]
    assert agreement(always_5, examples) == {"acc": [0.5], "acc_magpie": [0.6667], "acc_templated": [0.3333]}


@pytest.mark.parametrize("share,length", [(1.0, 40), (0.0, 20)])
def test_a_templated_share_picks_the_examples_each_step_reads(tmp_path, share, length):
    target = tiny_target(vocab_size=64, hidden=32)
    write_dataset(tmp_path / "data", 64, n=20, magpie=20)  # templated answers are 40 tokens, Magpie ones 20
    _, run = train(target, steps=6, batch=4, work_dir=tmp_path / "work", data_dir=tmp_path / "data",
                   templated_share=share, log=lambda line: None, progress=False,
                   hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
    assert run.tokens == 6 * 4 * length  # every example read came from the one source the share allows


def test_shipped_format_materializes_to_the_same_model(tmp_path):
    target = tiny_target(vocab_size=64, hidden=32)
    target.model.save_pretrained(tmp_path / "target")
    student = Student(target.model.get_input_embeddings().weight.detach(),
                      student_config(target.model.config, hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32))
    for param in student.parameters():  # what the bf16 checkpoint keeps
        param.data = param.data.to(torch.bfloat16).float()
    write_draft_delta(student.llama, student.table.proj, tmp_path / "draft", str(tmp_path / "target"), {"steps": 0})
    folder = materialize(tmp_path / "draft", str(tmp_path / "target"), tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 11, 3, 40, 41]])
    table = student.table().to(torch.bfloat16).float()  # the materialized table is stored in bf16
    with torch.no_grad():
        ours = student.llama.model(inputs_embeds=table[ids]).last_hidden_state @ table.T
        theirs = model(ids).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert materialize(tmp_path / "draft", str(tmp_path / "target"), tmp_path / "hf") == folder  # cached
    stamp = (folder / "source.txt").stat().st_mtime_ns
    assert materialize(tmp_path / "draft", str(tmp_path / "target"), tmp_path / "hf") == folder
    assert (folder / "source.txt").stat().st_mtime_ns == stamp  # not rebuilt
    (tmp_path / "draft" / "recipe.json").write_text('{"steps": 1}\n')  # a shipped file changed, weights alike
    materialize(tmp_path / "draft", str(tmp_path / "target"), tmp_path / "hf")
    assert (folder / "recipe.json").read_text() == '{"steps": 1}\n'  # rebuilt: the copy follows every file


def test_a_draft_for_another_target_is_refused(tmp_path):
    big, small = tiny_target(hidden=64), tiny_target(hidden=32)
    small.model.save_pretrained(tmp_path / "small")
    student = Student(big.model.get_input_embeddings().weight.detach(),
                      student_config(big.model.config, hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32))
    write_draft_delta(student.llama, student.table.proj, tmp_path / "draft", "big", {})
    with pytest.raises(ValueError, match="hidden size of 64.*has 32"):
        materialize(tmp_path / "draft", str(tmp_path / "small"), tmp_path / "hf")


def test_no_shipped_draft_says_what_to_do():
    with pytest.raises(ValueError, match="No draft model is shipped for 'tiny-llama'.*--draft"):
        make_drafter("draft_model", tiny_target())


NOISE = 0.5  # noisy_copy's scale, in standard deviations of the head's weights


def noisy_copy(model, scale: float, seed: int = 0):
    """`model` with Gaussian noise on its output head: it agrees with `model`'s argmax often, not always."""
    copy = deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = copy.get_output_embeddings().weight
        head.add_(scale * head.std() * torch.randn(head.shape, generator=g))
    return copy


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_partly_right_draft_model_is_lossless_at_every_k(k):
    """Rounds that keep some drafts and reject the rest: the draft cache is cropped by a different amount at each k
    (k = 1 feeds no draft back). The shipped draft model on the real model: test_shipped.py."""
    target = tiny_target()
    prompt = [5, 9, 14, 3, 27, 8, 5, 9, 14, 3, 27, 8, 20, 21, 5, 9]
    ar = sd.generate(target, prompt, max_new_tokens=40)
    out = sd.generate(target, prompt, sd.DraftModelDrafter(noisy_copy(target.model, NOISE), target), k=k,
                      max_new_tokens=40)
    assert out.tokens == ar.tokens
    assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens


def test_shipped_draft_model_is_an_ordinary_hf_model(target):
    model = AutoModelForCausalLM.from_pretrained(shipped("draft_model", target.name), dtype=torch.float32)
    assert model.config.vocab_size == target.vocab_size
    assert sum(p.numel() for p in model.parameters()) < 0.2 * sum(p.numel() for p in target.model.parameters())
    ids = torch.tensor([target.tokenizer.encode("def add(a, b):")])
    out = model.generate(ids, max_new_tokens=4, do_sample=False)  # what HF's assistant_model runs
    assert out.shape[1] == ids.shape[1] + 4
