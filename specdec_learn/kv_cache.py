"""Taking rejected drafts back out of a KV cache, whatever kind of layer holds it.

An HF DynamicCache holds one object per layer, of one of three kinds:

* full attention (DynamicLayer): K/V for every position; crop drops the last ones.
* sliding window (DynamicSlidingWindowLayer, Gemma 2/3/4, Mistral): K/V for
  the last window-1 positions only. Once the context passes the window, the
  positions a crop would expose again are gone, so transformers refuses to
  crop (RuntimeError) unless the layer was told to keep its past:
  `activate_past_recording()`. Then an update keeps all new K/V until the
  next crop, which drops the rejected ones AND trims back to window-1, even
  crop(0). That is exactly how transformers 5.19's own assisted decoding
  works (generation/utils.py `_assisted_decoding`: `cache.activate_past_recording()`
  before the loop, `crop(-rejected)` after every verify, including zero).
* linear attention (LinearAttentionLayer, Qwen3.5, Qwen3-Next): a conv state
  and a recurrent state that every token is folded into. Up to transformers
  5.24, past recording helps the conv state only; the recurrent state cannot
  be cropped (HF refuses assisted decoding on these models: `_is_stateful`).
  We snapshot and replay instead (`LinearState`, `Target.commit`), which
  works on every release in range. 5.25 can crop it: with
  `activate_past_recording(recurrent_states_to_keep=n)` the layer keeps the
  state after each of the last n positions, as vLLM's kernels do.

The cache invariant of target.py (the cache holds every committed token but
the last) rests on these: `Target.commit` calls them after every round.

A drafter with a network of its own (EAGLE-3) keeps its K/V in a `KVCache`:
two tensors that grow by rows and are cropped back after a rejection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin

# The attention kinds Target rolls back. Llama 4's "chunked_attention" uses the sliding
# cache class too but is not tested here, so it is refused rather than trusted.
ATTENTION_TYPES = ("full_attention", "sliding_attention")


def is_linear(layer) -> bool:
    """A linear-attention cache layer: states, no positions (crop does not apply)."""
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def keeps_every_position(config) -> bool:
    """Whether every cache layer of a model with this config keeps every position (no sliding window, no states).

    What a token tree needs of a cache: its rows are not consecutive
    positions, and only full-attention layers can keep any subset of them.
    """
    layers = DynamicCache(config=config).layers
    return not any(getattr(layer, "is_sliding", False) or is_linear(layer) for layer in layers)


def record_past(cache: DynamicCache) -> None:
    """Let the sliding-window layers of `cache` be cropped past their window (see above).

    Call it once everything in the cache is committed: K/V written before it
    are trimmed to the window as usual, K/V written after it wait for the next
    `crop_cache`. Linear-attention layers are left alone (they roll back by snapshot).
    """
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False) and not is_linear(layer):
            layer.activate_past_recording()


def crop_cache(cache: DynamicCache, keep: int) -> None:
    """Drop every cached position from `keep` on (the rejected drafts).

    A recording sliding-window layer is cropped even when nothing is dropped:
    crop(0) trims what it kept back to its window (HF's assisted decoding
    calls it every round for the same reason). Layers that hold no positions
    are skipped: linear-attention ones (Target.commit rolls them back) and the
    placeholders of Gemma 4's KV-shared layers (transformers >= 5.24's
    DummyLayer, whose keys stay None).
    """
    for layer in cache.layers:
        if is_linear(layer) or not layer.is_initialized or layer.keys is None:
            continue
        # each layer's own length: since transformers 5.25 the cache's get_seq_length() reads layer 0,
        # which on a hybrid model may be a linear layer that Target.commit has already rolled back
        extra = max(int(layer.get_seq_length()) - keep, 0)
        if extra or getattr(layer, "record_past", False):
            layer.crop(-extra)  # a negative count removes that many positions from the end


@torch.inference_mode()  # the cache's tensors were made in inference mode: update them there
def keep_path(cache: DynamicCache, start: int, path: list[int]) -> None:
    """After verifying a tree: keep positions < start (the cache and `last`), then only the path's rows.

    Node i's keys and values sit at start + i; the path's move down to start,
    start + 1, ... (in path order, which is increasing) and the rest is cropped.
    Full-attention layers only (Target.can_verify_tree).
    """
    rows = torch.tensor([start + i for i in path], dtype=torch.long)
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        index = rows.to(layer.keys.device)
        layer.keys[..., start : start + len(path), :] = layer.keys[..., index, :]  # the right side is a copy
        layer.values[..., start : start + len(path), :] = layer.values[..., index, :]
    crop_cache(cache, start + len(path))


@dataclass
class LinearState:
    """A copy of every linear-attention layer's state in a cache, to put back later.

    The fields copied are those of transformers 5.19's
    ``LinearAttentionCacheLayerMixin`` (cache_utils.py): per state index a
    conv state [1, conv_dim, kernel] and a recurrent state [1, heads, d_k, d_v],
    and the flags saying which exist. Since 5.25 the layer also counts the
    tokens it has folded in (``cumulative_length_linear``, a 0-d tensor), and
    the cache's ``get_seq_length()`` reads that count when layer 0 is linear:
    it is copied too, or after a rollback the cache would claim the rejected
    drafts. Tensors are cloned: the model updates them in place.
    """

    layers: dict[int, dict]  # layer index -> {field: value}

    FIELDS = ("conv_states", "recurrent_states", "is_conv_states_initialized",
              "is_recurrent_states_initialized", "has_previous_state", "conv_kernel_size",
              "cumulative_length_linear")  # the last one: transformers >= 5.25 only

    @classmethod
    def take(cls, cache: DynamicCache) -> LinearState:
        return cls({i: {f: _copied(getattr(layer, f)) for f in cls.FIELDS if hasattr(layer, f)}
                    for i, layer in enumerate(cache.layers) if is_linear(layer)})

    def restore(self, cache: DynamicCache) -> None:
        """Hand the copies back to `cache`, once: from then on the cache updates them in place."""
        for i, fields in self.layers.items():
            for f, value in fields.items():
                setattr(cache.layers[i], f, value)
        self.layers = {}


def _copied(value):
    """A copy of one field: a dict per state index (of tensors or flags), or a tensor."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in value.items()}


@dataclass
class Rollback:
    """What `Target.verify` leaves for `Target.commit` on a linear-attention target."""

    before: LinearState  # the linear state before verify
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> its mixer's input [1, k+1, H]

    @property
    def rows(self) -> int:
        return next(iter(self.inputs.values())).shape[1]


def linear_mixers(decoder, config) -> dict[int, torch.nn.Module]:
    """The token mixer of each linear-attention layer (Qwen3.5 / Qwen3-Next name it ``linear_attn``)."""
    types = getattr(config, "layer_types", None) or ()
    return {i: decoder.layers[i].linear_attn for i, kind in enumerate(types)
            if kind == "linear_attention" and hasattr(decoder.layers[i], "linear_attn")}


class KVCache:
    """A drafter's own keys and values, [kv_heads, T, d] each, row i at position i: it grows and is cropped."""

    def __init__(self):
        self.k = self.v = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=1)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=1)

    def crop(self, keep: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :keep], self.v[:, :keep]
