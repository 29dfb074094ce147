"""What each drafter reads from the target, once per example: captured, cached on disk, or computed on demand.

A drafter learns to predict the target from the target's own inner states,
so before any step every example is run through the frozen target once
(`capture`; `capture_taps` is that one forward) and what its drafter reads
is kept (`Features`): the taps (EAGLE-3, DFlash, DSpark), the final-normed
last state and the target's top-1 (all of them), one layer's K/V (the
Gemma-4-style assistant); for the draft model, which learns from the tokens
alone, no forward runs at all.

Why a cache, and where: a target forward over a corpus costs minutes to
hours of CPU, a training run reads each example many times, and a resumed or
repeated run should not pay again. So features are written once per example
(named by `examples.example_key`, atomically: temp name, then rename) under
$SPECDEC_CACHE/features/ for the corpus (the repository keeps token ids,
never what is rebuilt from them), and a damaged file is recomputed, saying
so. Above `KEEP_GIB` (EAGLE-3's three taps are ~5 KB a token, so 3M tokens
would be 16 GB) they are computed when a trainer asks for them instead
(`OnDemand`): one target forward per example read, nothing on disk.

`training_data(target, taps, kv_layer)` is where every trainer's data stage
ends: the dataset (data.py), split by prompt id, benchmark ids refused
(prompts.py), each example's features, and the record recipe.json keeps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import cache_dir
from .data import default_dir, is_corpus, training_split
from .examples import Example, example_key, fingerprint
from .prompts import check_no_benchmark_prompts_by_id


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
    held_out: list[Example]  # held out by prompt id (`examples.split_examples`)
    train: list[Features] | OnDemand  # one per training example
    eval: list[Features] | OnDemand  # one per held-out example
    record: dict  # `examples.fingerprint`: folder, counts, a hash of which examples


def training_data(target, taps=(), kv_layer: int | None = None, data_dir=None, states: bool = True,
                  progress: bool = True, keep_gib: float = KEEP_GIB, log=print) -> TrainingData:
    """The step every trainer ends its data stage at: the dataset, split, with each example's features.

    data_dir: the corpus store or JSONL folder (default: `data.default_dir`).
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
