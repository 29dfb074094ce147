"""The shared training-data pipeline: train split only, resumable, readable back."""

import json

import pytest

from specdec_learn.train import data, features
from specdec_learn.train.examples import Example, split_examples
from specdec_learn.train.prompts import bench_texts, check_no_benchmark_prompts_by_id, training_prompts
from specdec_learn.workloads import WORKLOADS, Prompt, is_benchmark_prompt, load_workload


def test_training_prompts_never_include_a_benchmark_prompt():
    prompts = training_prompts()
    held_out = bench_texts()
    assert len(held_out) > 50
    assert not [p.id for p in prompts if is_benchmark_prompt(p.id)]
    assert not [p.id for p in prompts if p.text in held_out]
    ids = {p.id for p in prompts}
    assert len(ids) == len(prompts), "prompt ids must be unique"
    # Every train-split workload prompt is in, plus hundreds of generated ones.
    train_split = {p.id for name in WORKLOADS for p in load_workload(name, split="train")}
    assert train_split <= ids
    assert len(prompts) > len(train_split) + 500  # the templated prompts
    assert {p.workload for p in prompts} >= {"gen-code", "gen-math", "gen-chat"}


def test_a_benchmark_prompt_is_refused(tmp_path):
    bench = load_workload("math", n=1, split="bench")[0]
    with pytest.raises(ValueError, match="benchmark split"):
        data.build_dataset(None, tmp_path, [bench])
    # ... even under another id, by its text.
    with pytest.raises(ValueError, match="benchmark split"):
        data.build_dataset(None, tmp_path, [Prompt("mine/1", bench.text, "file")])
    with pytest.raises(ValueError, match="benchmark prompts"):
        check_no_benchmark_prompts_by_id([bench.id])


def test_build_dataset_answers_the_training_prompts_unless_given_others(tmp_path, monkeypatch):
    checked = []
    monkeypatch.setattr(data, "check_no_benchmark_prompts", checked.append)
    with pytest.raises(ValueError, match="needs a target with a tokenizer"):
        data.build_dataset(None, tmp_path)
    assert [p.id for p in checked[0]] == [p.id for p in training_prompts()]


def test_load_examples_reads_shards_and_skips_a_half_written_line(tmp_path):
    rows = [{"id": "a", "variant": "greedy", "input_ids": [1, 2, 3, 4], "num_prompt_tokens": 2},
            {"id": "b", "variant": "T0.8s1", "input_ids": [5, 6, 7], "num_prompt_tokens": 1}]
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"id": "c", "input_'
    (tmp_path / "greedy-000.jsonl").write_text(text)
    examples = data.load_examples(tmp_path)
    assert [(e.id, e.variant) for e in examples] == [("a", "greedy"), ("b", "T0.8s1")]
    assert examples[0].loss_mask == [False, False, True, True]
    assert examples[0].num_prompt_tokens == 2
    assert data.done_keys(tmp_path) == {("a", "greedy"), ("b", "T0.8s1")}


def test_split_examples_keeps_all_variants_of_a_prompt_together():
    examples = [Example(f"p{i}", [1, 2], [False, True], v) for i in range(200) for v in ("greedy", "T0.8s1")]
    train, held = split_examples(examples, eval_fraction=0.1)
    assert len(train) + len(held) == 400 and 0 < len(held) < 80
    assert not {e.id for e in train} & {e.id for e in held}


@pytest.mark.slow
def test_build_dataset_is_resumable(target, tmp_path):
    prompts = training_prompts()[:3]
    data.build_dataset(target, tmp_path, prompts[:2], max_new_tokens=4, batch_size=2, progress=False)
    first = data.load_examples(tmp_path)
    assert sorted(e.id for e in first) == sorted(p.id for p in prompts[:2])
    for ex in first:
        n = ex.num_prompt_tokens
        assert ex.input_ids[:n] == target.encode(next(p.text for p in prompts if p.id == ex.id))
        assert 1 <= len(ex.input_ids) - n <= 4
    # Same call again: nothing new. One more prompt: only that one is answered.
    data.build_dataset(target, tmp_path, prompts, max_new_tokens=4, batch_size=2, progress=False)
    again = data.load_examples(tmp_path)
    assert len(again) == 3 and [e.id for e in again[:2]] == [e.id for e in first]
    # A greedy answer equals what the loop's AR decoding gives (batched, left-padded generate is exact in fp32).
    import specdec_learn as sd

    ex = again[0]
    assert ex.input_ids[ex.num_prompt_tokens :] == sd.generate(target, ex.input_ids[: ex.num_prompt_tokens],
                                                               None, max_new_tokens=4).tokens
    taps = features.capture_taps(target, ex, (2, 15))
    assert taps[2].shape == (len(ex.input_ids), target.hidden_size)


# --- the feature step every trainer ends its data stage at -------------------------------------


def test_features_are_cached_a_damaged_file_is_recomputed_and_no_write_is_half_done(tmp_path, capsys):
    import torch
    from conftest import tiny_target

    target = tiny_target()
    examples = [Example(f"x/{i}", list(range(3 + i, 13 + i)), [False] * 4 + [True] * 6) for i in range(3)]
    cache = tmp_path / "features"
    first = features.capture(target, examples, (1,), cache, progress=False, kv_layer=1)
    files = sorted(cache.glob("*.pt"))
    assert len(files) == 3 and not list(cache.glob(".*"))  # every write renamed into place, no temporary left
    f = first[0]
    assert f.taps.shape == (10, 32) and f.last.shape == (10, 32) and f.top1.shape == (10,)
    assert f.keys.shape == f.values.shape == (1, 2, 10, 8)  # [1, kv_heads, T, head_dim] of layer 1

    files[1].write_bytes(files[1].read_bytes()[:100])  # a file cut short (a disk error)
    again = features.capture(target, examples, (1,), cache, progress=False, kv_layer=1)
    assert "damaged feature file" in capsys.readouterr().err
    for a, b in zip(first, again):
        assert torch.equal(a.taps, b.taps) and torch.equal(a.keys, b.keys)
    assert features.read_features(files[1]) is not None  # rewritten whole

    tokens_only = features.capture(None, examples)  # the draft model's features: no target forward
    assert tokens_only[0].taps is None and tokens_only[0].ids.tolist() == examples[0].input_ids


def test_training_data_splits_records_and_refuses_benchmark_examples(tmp_path):
    from conftest import tiny_target, training_ids

    target = tiny_target()
    rows = [{"id": i, "input_ids": [5, 6, 7, 8, 9, 10], "num_prompt_tokens": 2} for i in training_ids("t", 120)]
    (tmp_path / "greedy-000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    made = features.training_data(target, data_dir=tmp_path, progress=False)
    assert len(made.train) == len(made.examples) and len(made.eval) == len(made.held_out) > 0
    assert made.record["train_examples"] + made.record["held_out_examples"] == 120
    assert made.record["sha256"] == features.training_data(target, data_dir=tmp_path, states=False).record["sha256"]

    leaked = next(i for i in (f"t/{n}" for n in range(100)) if is_benchmark_prompt(i))
    rows.append({"id": leaked, "input_ids": [5, 6, 7, 8], "num_prompt_tokens": 2})
    (tmp_path / "greedy-000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="come from benchmark prompts"):
        features.training_data(target, data_dir=tmp_path, progress=False)


def corpus_store(root, n: int = 60):
    """A corpus store (corpus.py's format) of n short examples with train-split ids, for the tiny target."""
    import random as rand

    from conftest import training_ids
    from specdec_learn.train import corpus

    rng = rand.Random(0)
    settings = corpus.Settings(target="tiny-llama", engine="fake")
    examples = [Example(i, [rng.randrange(3, 128) for _ in range(9)], [False] * 3 + [True] * 6, "greedy")
                for i in training_ids("c", n)]
    folder = corpus.store_dir(settings, root)
    corpus.append_shard(folder, settings, examples[: n // 2], 128)
    corpus.append_shard(folder, settings, examples[n // 2 :], 128)
    return folder, examples


def test_training_reads_the_committed_corpus_and_keeps_features_out_of_the_repository(tmp_path, monkeypatch):
    from conftest import tiny_target
    from specdec_learn.train import corpus

    assert data.default_dir("smollm2-135m") == corpus.store_dir(corpus.Settings())  # the committed corpus
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    assert data.default_dir("no-such-target") == tmp_path / "cache" / "data" / "no-such-target"

    folder, examples = corpus_store(tmp_path / "datasets")
    before = sorted(p.name for p in folder.iterdir())
    made = features.training_data(tiny_target(), taps=(1,), data_dir=folder, progress=False)
    assert sorted(made.examples + made.held_out, key=lambda e: e.id) == sorted(examples, key=lambda e: e.id)
    assert (made.examples, made.held_out) == corpus.load_split(folder) and len(made.train) == len(made.examples)
    assert sorted(p.name for p in folder.iterdir()) == before  # the store holds token ids and nothing else
    cached = list((tmp_path / "cache" / "features").rglob("*.pt"))
    assert len(cached) == len(examples) and all("tiny-llama" in str(p) for p in cached)


def test_features_too_big_to_keep_are_computed_on_demand_and_equal_the_cached_ones(tmp_path, monkeypatch):
    import torch
    from conftest import tiny_target
    from specdec_learn.train import eagle3

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target = tiny_target()
    folder, _ = corpus_store(tmp_path / "datasets")
    kept = features.training_data(target, taps=(0, 1), kv_layer=1, data_dir=folder, progress=False)
    files = sorted(tmp_path.rglob("*.pt"))
    lines = []
    lazy = features.training_data(target, taps=(0, 1), kv_layer=1, data_dir=folder, keep_gib=0, log=lines.append)
    assert isinstance(lazy.train, features.OnDemand) and isinstance(lazy.eval, features.OnDemand)
    assert "on demand" in lines[0] and sorted(tmp_path.rglob("*.pt")) == files  # nothing written
    assert features.lengths(lazy.train) == features.lengths(kept.train) == [len(e.input_ids) for e in kept.examples]
    assert isinstance(lazy.eval[:2], features.OnDemand) and len(lazy.eval[:2]) == min(2, len(lazy.eval))
    for a, b in zip(kept.train, lazy.train):
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("ids", "taps", "last", "top1", "keys", "values"))
    # EAGLE-3's batches: the same examples whichever way the features come
    cfg = eagle3.TrainConfig(tokens_per_batch=40)
    for step in range(4):
        assert [f.ids.tolist() for f in eagle3.batches(lazy.train, cfg)(step)] == \
               [f.ids.tolist() for f in eagle3.batches(kept.train, cfg)(step)]
