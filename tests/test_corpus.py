"""The persistent corpus (train/corpus.py) and its Magpie prompts (train/magpie.py), without vLLM.

A fake "model" (encode / generate below) stands in for the target, so the
store's promises are tested on the CPU in seconds: examples round-trip
exactly, a writer killed mid-shard leaves a readable store that the next run
completes, the committed dataset holds no benchmark prompt, and Magpie's
cleaning keeps one copy of each request and none of the benchmark's.
"""

import json
import os
import signal
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from specdec_learn.train import corpus, magpie
from specdec_learn.train import job as job_module
from specdec_learn.train.examples import Example, split_examples
from specdec_learn.train.prompts import bench_texts
from specdec_learn.workloads import Prompt, is_benchmark_prompt, load_workload

SETTINGS = corpus.Settings(target="fake-target", max_new_tokens=8, engine="fake")
VOCAB = 1000


def encode(text: str) -> list[int]:
    """The fake target's chat template: one id per character."""
    return [1] + [ord(c) % VOCAB for c in text]


def generate(batch: list[list[int]]) -> list[list[int]]:
    """The fake target's answers: a function of the prompt, ending with EOS (id 2)."""
    return [[(7 * t) % VOCAB for t in ids[1:6]] + [2] for ids in batch]


def train_prompts(n: int) -> list[Prompt]:
    """n prompts with train-split ids (the store refuses any other)."""
    ids = [f"test/{i}" for i in range(3 * n) if not is_benchmark_prompt(f"test/{i}")][:n]
    return [Prompt(i, f"Please answer question {i}.", "file") for i in ids]


def expected_examples(prompts: list[Prompt]) -> list[Example]:
    out = []
    for p in prompts:
        ids = encode(p.text)
        (response,) = generate([ids])
        out.append(Example(p.id, ids + response, [False] * len(ids) + [True] * len(response), SETTINGS.variant))
    return out


def random_examples(rng, n: int, vocab: int, variant: str = "greedy") -> list[Example]:
    examples = []
    for i in range(n):
        p, r = int(rng.integers(1, 40)), int(rng.integers(0, 60))  # a response may be empty
        ids = rng.integers(0, vocab, size=p + r).tolist()
        ids[0] = vocab - 1  # the largest id must survive uint16
        examples.append(Example(f"ex/{i}", ids, [False] * p + [True] * r, variant))
    return examples


# --- the store -----------------------------------------------------------------------------------


def test_round_trip_gives_the_same_examples(tmp_path):
    rng = np.random.default_rng(0)
    shards = [random_examples(rng, 30, 49_152), random_examples(rng, 17, 49_152)]
    settings = corpus.Settings(target="t")
    for examples in shards:
        manifest = corpus.append_shard(tmp_path, settings, examples, vocab_size=49_152)
    back = corpus.load_corpus(tmp_path)
    assert back == shards[0] + shards[1]
    assert manifest["examples"] == 47 and manifest["token_dtype"] == "uint16"
    assert manifest["response_tokens"] == sum(sum(ex.loss_mask) for ex in back)
    # uint16 really: two bytes per token id (plus a small header)
    tokens = sum(len(ex.input_ids) for ex in shards[0])
    assert (tmp_path / "shard-00000.safetensors").stat().st_size < 2 * tokens + 1200
    # the held-out split is examples.split_examples' rule
    assert corpus.load_split(tmp_path) == split_examples(back, eval_fraction=0.05)


def test_a_large_vocabulary_gets_uint32_and_an_id_outside_it_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    examples = random_examples(rng, 5, 100_000)
    corpus.append_shard(tmp_path / "big", SETTINGS, examples, vocab_size=100_000)
    assert corpus.load_corpus(tmp_path / "big") == examples
    with pytest.raises(ValueError, match="outside the vocabulary"):
        corpus.append_shard(tmp_path / "small", SETTINGS, examples, vocab_size=49_152)
    with pytest.raises(ValueError, match="loss mask"):
        corpus.encode_shard([Example("x", [1, 2, 3], [True, False, True])], VOCAB)


def test_a_damaged_shard_or_other_settings_are_refused(tmp_path):
    examples = random_examples(np.random.default_rng(2), 4, VOCAB)
    corpus.append_shard(tmp_path, SETTINGS, examples, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="made under"):
        corpus.append_shard(tmp_path, corpus.Settings(target="fake-target", max_new_tokens=9), examples, VOCAB)
    shard = tmp_path / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        corpus.load_corpus(tmp_path)


def test_fill_answers_each_prompt_once_and_a_rerun_adds_only_new_ones(tmp_path):
    prompts = train_prompts(7)
    corpus.fill(tmp_path, SETTINGS, prompts[:5], encode, generate, VOCAB, shard_size=2, log=lambda _: None)
    manifest = corpus.fill(tmp_path, SETTINGS, prompts, encode, generate, VOCAB, shard_size=2, log=lambda _: None)
    assert [s["examples"] for s in manifest["shards"]] == [2, 2, 1, 2]
    assert sorted(corpus.load_corpus(tmp_path), key=lambda e: e.id) == sorted(expected_examples(prompts), key=lambda e: e.id)


def test_fill_refuses_a_benchmark_prompt(tmp_path):
    bench_id = next(f"test/{i}" for i in range(100) if is_benchmark_prompt(f"test/{i}"))
    with pytest.raises(ValueError, match="benchmark split"):
        corpus.fill(tmp_path, SETTINGS, [Prompt(bench_id, "hello there", "file")], encode, generate, VOCAB)


# A child process (forked: it needs no second start-up) fills a store and is SIGKILLed at its Nth os.replace:
#   3rd: shard 1 is written to its temporary name, not yet renamed;
#   4th: shard 1 is in place, the manifest does not list it yet.
def fill_until_replace(folder: Path, ready: Path, hang_at: int) -> None:
    """In the child: fill the store, but stop dead (and say so) before the hang_at-th rename."""
    calls, real_replace = [0], os.replace

    def replace(src, dst):
        calls[0] += 1
        if calls[0] == hang_at:
            ready.write_text("ready")
            time.sleep(600)
        real_replace(src, dst)

    os.replace = replace
    corpus.fill(folder, SETTINGS, train_prompts(6), encode, generate, VOCAB, shard_size=2, log=lambda _: None)


@pytest.mark.parametrize("hang_at, leftover", [(3, ".shard-00001.safetensors.tmp-*"), (4, "shard-00001.safetensors")])
def test_a_kill_mid_shard_leaves_a_readable_store_and_the_rerun_completes(tmp_path, hang_at, leftover):
    folder, ready = tmp_path / "store", tmp_path / "ready"
    pid = os.fork()
    if pid == 0:  # the child
        try:
            fill_until_replace(folder, ready, hang_at)
        finally:
            os._exit(0)
    deadline = time.time() + 20
    while not ready.exists() and time.time() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert ready.exists(), "the child never reached the write it was to be killed in"

    assert list(folder.glob(leftover)), "the kill did not land mid-shard"
    prompts = train_prompts(6)
    assert corpus.load_corpus(folder) == expected_examples(prompts[:2])  # shard 0 only, intact

    corpus.fill(folder, SETTINGS, prompts, encode, generate, VOCAB, shard_size=2, log=lambda _: None)
    assert corpus.load_corpus(folder) == expected_examples(prompts)
    assert not list(folder.glob(".*.tmp-*"))
    assert sorted(p.name for p in folder.glob("shard-*")) == [f"shard-{i:05d}.safetensors" for i in range(3)]


def test_corpus_prompts_refuses_two_prompts_with_one_id(tmp_path):
    folder = corpus.target_dir("t", tmp_path) / "prompts"
    magpie.write_prompts(folder / "a.jsonl", [Prompt("x/1", "one question here", "magpie")])
    magpie.write_prompts(folder / "b.jsonl", [Prompt("x/2", "another question", "magpie")])
    assert {p.id for p in corpus.corpus_prompts("t", tmp_path)} == {"x/1", "x/2"}
    magpie.write_prompts(folder / "c.jsonl", [Prompt("x/1", "a third question", "magpie")])
    with pytest.raises(ValueError, match="share an id"):
        corpus.corpus_prompts("t", tmp_path)


# --- the dataset in the repository ---------------------------------------------------------------------


def committed_stores() -> list[Path]:
    return sorted(p.parent for p in corpus.DATASETS.glob("*/*/manifest.json"))


def test_the_dataset_is_committed_small_and_free_of_benchmark_prompts():
    stores = committed_stores()
    assert stores, f"no dataset under {corpus.DATASETS}: the corpus ships in the repository"
    size = sum(p.stat().st_size for p in corpus.DATASETS.rglob("*") if p.is_file())
    assert size <= 30e6, f"the dataset is {size / 1e6:.1f} MB, over its 30 MB budget"
    held_out = {magpie.normalise(t) for t in bench_texts()}
    for store in stores:
        prompts = {p.id: p for p in corpus.corpus_prompts(store.parent.name)}
        assert not [i for i in prompts if is_benchmark_prompt(i)], "a benchmark id in the prompt files"
        assert not [i for i, p in prompts.items() if magpie.normalise(p.text) in held_out], "a benchmark text"
        ids = corpus.done_ids(store)
        assert ids, f"{store} has no examples"
        assert not [i for i in ids if is_benchmark_prompt(i)], "a benchmark id in the shards"
        assert ids <= set(prompts), "an example whose prompt is not in the prompt files (its text is unchecked)"


def test_the_committed_magpie_prompts_are_distinct():
    files = list(corpus.DATASETS.glob("*/prompts/magpie.jsonl"))
    assert files, "no Magpie prompts committed"
    for path in files:
        prompts = magpie.read_prompts(path)
        keys = [magpie.normalise(p.text) for p in prompts]
        assert len(prompts) > 1000 and len(set(keys)) == len(keys)
        assert all(magpie.clean(p.text) == p.text for p in prompts)


# --- Magpie ----------------------------------------------------------------------------------------------


def test_keep_new_dedupes_cleans_and_drops_benchmark_texts():
    bench = next(p.text for p in load_workload("chat", split="bench") if magpie.clean(p.text.upper()))
    texts = [
        "How do I bake sourdough bread at home?",
        "how do I bake   SOURDOUGH bread at home",  # the same request, other case and spacing
        "Hi",  # too short
        "the the the the the the the the the the the",  # degenerate
        "What is <|im_start|> used for in chat templates?",  # a template marker
        bench.upper(),  # a benchmark prompt, disguised
        "Can you suggest three names for a small bakery?",
    ]
    seen = {magpie.normalise("Can you suggest three names for a small bakery")}  # already kept earlier
    kept = magpie.keep_new(texts, seen, {magpie.normalise(bench)})
    assert [p.text for p in kept] == ["How do I bake sourdough bread at home?"]
    assert magpie.normalise(texts[0]) in seen
    assert kept[0].id == magpie.train_split_id("how do i bake sourdough bread at home")  # id = hash of the normalised text


def test_every_magpie_id_is_in_the_train_split():
    texts = [f"Tell me a fact about the number {i}, please." for i in range(200)]
    ids = [magpie.train_split_id(t) for t in texts]
    assert not [i for i in ids if is_benchmark_prompt(i)]
    assert len(set(ids)) == len(ids)
    salted = [i for i in ids if "." in i.split("/")[1]]
    assert salted, "about a quarter of the unsalted hashes fall in the bench split; none was salted"


class ChatMLTokenizer:
    """Just enough of a tokenizer: a ChatML template with a default system turn, one id per special marker."""

    eos_token_id = 2
    vocab: ClassVar[dict[str, int]] = {"<|im_start|>": 1, "<|im_end|>": 2}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "<|im_start|>system\nBe brief.<|im_end|>\n"
        text += "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            marker = next((m for m in self.vocab if text.startswith(m, i)), None)
            ids.append(self.vocab[marker] if marker else 100 + ord(text[i]))
            i += len(marker) if marker else 1
        return {"input_ids": ids}


def test_user_prefix_and_end_of_turn_come_from_the_template():
    tok = ChatMLTokenizer()
    assert magpie.user_prefix(tok) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert magpie.end_of_turn_ids(tok) == [2]


def test_user_prefix_of_the_real_smollm2_template():
    from transformers import AutoTokenizer

    from specdec_learn.models import model_path

    tok = AutoTokenizer.from_pretrained(model_path("smollm2-135m"))  # converted into the cache first if need be
    prefix = magpie.user_prefix(tok)
    full = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False)
    assert full.startswith(prefix + "Hi there") and prefix.endswith("user\n")
    assert magpie.end_of_turn_ids(tok) == [tok.convert_tokens_to_ids("<|im_end|>")]


def test_prompt_files_round_trip(tmp_path):
    prompts = [Prompt("magpie/a", "Ünïcode and \"quotes\"\nand lines", "magpie"), Prompt("b/1", "x y z w", "gen-chat")]
    magpie.write_prompts(tmp_path / "p.jsonl", prompts)
    assert magpie.read_prompts(tmp_path / "p.jsonl") == prompts
    assert [json.loads(line)["id"] for line in (tmp_path / "p.jsonl").read_text().splitlines()] == ["magpie/a", "b/1"]


def test_the_job_session_yields_the_cpu():
    """`nice` alone does not yield under autogroup scheduling: the job's session gets nice 19 too."""
    import subprocess

    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no autogroup scheduling here (not Linux, or switched off): plain nice applies")
    job = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job_module.lower_autogroup(job.pid)
        assert Path(f"/proc/{job.pid}/autogroup").read_text().split()[-1] == "19"
    finally:
        job.kill()
        job.wait()
