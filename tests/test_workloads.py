"""Prompt workloads: sizes, the bench/train split, and loading your own JSONL file."""

import hashlib
import json

import pytest

from specdec_learn.workloads import WORKLOADS, Prompt, is_benchmark_prompt, load_workload


@pytest.mark.parametrize("name", WORKLOADS)
def test_bench_and_train_are_disjoint_and_cover_all(name):
    every = load_workload(name, split="all")
    bench = load_workload(name, split="bench")
    train = load_workload(name, split="train")
    ids = lambda prompts: {p.id for p in prompts}  # noqa: E731
    assert bench and train
    assert ids(bench).isdisjoint(ids(train))
    assert ids(bench) | ids(train) == ids(every)
    assert all(is_benchmark_prompt(p.id) for p in bench)
    assert not any(is_benchmark_prompt(p.id) for p in train)


@pytest.mark.parametrize("name", WORKLOADS)
def test_prompts_are_well_formed_with_unique_prefixed_ids(name):
    prompts = load_workload(name, split="all")
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert isinstance(p, Prompt)
        prefix = "humaneval/" if name == "edits" else f"{name}/"  # an edit carries its function's id
        assert p.workload == name and p.id.startswith(prefix)
        assert p.text.strip()


def test_sizes():
    assert len(load_workload("humaneval", split="all")) == 164
    assert 50 <= len(load_workload("math", split="all")) <= 80
    assert 50 <= len(load_workload("chat", split="all")) <= 80


def test_edits_come_in_fours_and_share_their_functions_split():
    edits = load_workload("edits", split="all")
    assert len(edits) == 4 * 164
    for i in range(0, len(edits), 4):
        group = edits[i : i + 4]
        function = group[0].id.split("#")[0]
        assert [p.id for p in group] == [f"{function}#{name}" for name in ("rename", "comment", "nodoc", "hints")]
        assert len({p.text.split("```")[1] for p in group}) == 1  # the same code each time
    humaneval_bench = {p.id for p in load_workload("humaneval", split="bench")}
    assert {p.id.split("#")[0] for p in load_workload("edits", split="bench")} == humaneval_bench


def test_humaneval_prompt_is_instruction_plus_stub():
    first = load_workload("humaneval", split="all")[0]
    assert first.id == "humaneval/HumanEval/0"
    assert first.text.startswith("Complete the following Python function.")
    assert "def has_close_elements(" in first.text
    assert first.text.rstrip().endswith("```")


def test_math_answers_present():
    for p in load_workload("math", split="all"):
        assert p.answer and p.answer.strip(), p.id


def test_split_rule_is_the_documented_sha256_rule():
    for p in load_workload("math", split="all"):
        digest = hashlib.sha256(p.id.encode()).hexdigest()
        assert is_benchmark_prompt(p.id) == (int(digest, 16) % 4 == 0)
    with pytest.raises(ValueError, match="split"):
        load_workload("math", split="test")


def test_n_takes_the_first_n_in_file_order():
    every = load_workload("chat", split="bench")
    assert load_workload("chat", n=3) == every[:3]
    assert load_workload("chat", n=10_000) == every
    for bad in (0, -1):
        with pytest.raises(ValueError, match="n must be at least 1"):
            load_workload("chat", n=bad)


def test_loading_a_jsonl_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [{"prompt": "Say hi."}, {"id": "q/2", "prompt": "Count to three."}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    prompts = load_workload(str(path), split="bench")  # split does not apply to files
    assert [(p.id, p.text, p.workload) for p in prompts] == [
        ("file/1", "Say hi.", "file"),
        ("q/2", "Count to three.", "file"),
    ]
    assert load_workload(path, n=1) == prompts[:1]  # a pathlib.Path works too


@pytest.mark.parametrize("bad_line", ['{"id": "a"}', '{"prompt": "  "}', "not json"])
def test_bad_jsonl_line_names_its_line_number(tmp_path, bad_line):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + bad_line + "\n")
    with pytest.raises(ValueError, match="line 2"):
        load_workload(str(path))


def test_missing_file_and_unknown_name(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_workload(str(missing))
    with pytest.raises(ValueError, match="humaneval, math, chat") as info:
        load_workload("poetry")
    assert "JSONL" in str(info.value)
