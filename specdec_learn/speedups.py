"""CPU speed-ups: changes to a model that make it faster on a CPU and leave its numbers as they were.

`target.load` applies them (`speed_up`) to the model it builds for the user,
unless told `speedups=False`; `Target(model)` leaves a model it is handed as
it is. On a row-invariant model (invariant.py) both are already covered: its
linear layers never see one row alone, and its attention keeps K/V heads
grouped; `speed_up` then leaves it as it is.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .invariant import is_row_invariant


def speed_up(model) -> None:
    """Every speed-up below that applies to `model` (on a CPU); none for a row-invariant one, which has both."""
    if is_row_invariant(model):
        return
    pack_single_rows(model.get_output_embeddings())
    attend_grouped_heads(model)


def pack_single_rows(head: torch.nn.Module) -> None:
    """Hand `head` (an LM head) a one-row input in the packed layout: a CPU bf16 pitfall.

    HF computes the last position's logits from ``hidden[:, -1:]``, a view of
    [1, n, H] whose strides stay (n*H, H, 1). torch counts it contiguous (its
    size-1 dims do not matter), but its bf16 matmul on a CPU does not: it takes
    a path tens of times slower for such a row (fp32 is unaffected;
    benchmarks/README.md has the figures). The prefill pays it once per prompt,
    and a drafter that reads the last row of a longer run (the MTP head after
    its catch-up, a draft model after a tree) every round.
    Re-viewing the row with packed strides costs nothing; a pre-forward hook
    does it wherever the head is called from.
    """
    if getattr(head, "_packs_single_rows", False):
        return

    def pack(_module, args):
        x = args[0]
        if x.dim() > 2 and x.numel() == x.shape[-1]:  # one row: [1, ..., 1, H]
            return (x.reshape(1, -1).view(x.shape), *args[1:])
        return None

    head.register_forward_pre_hook(pack)
    head._packs_single_rows = True


GROUPED = "sdpa_grouped"  # the name attend_grouped_heads registers with transformers' AttentionInterface


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa attention, but grouped K/V heads stay grouped when a mask is given.

    query [B, H_q, n, D]; key, value [B, H_kv, L, D] with H_q a multiple of H_kv.
    -> ([B, n, H_q, D], None), as transformers' attention functions return.
    """
    grouped = attention_mask is not None and query.shape[1] != key.shape[1] and query.device.type == "cpu"
    if not grouped or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None  # [B, n, H_q, D]


def attend_grouped_heads(model) -> None:
    """Run a CPU model's sdpa attention without copying its cache into every query head: the verify pass's own cost.

    SmolLM2 has 9 query heads and 3 K/V heads (grouped-query attention).
    transformers' sdpa attention hands the kernel the 3 heads as they are
    (`enable_gqa`) only when it is given no mask, because CUDA's fused kernels
    take grouped heads only then; with a mask it first repeats each K/V head
    for its 3 query heads, a copy of the layer's whole cache, keys and values.
    Decoding one token needs no mask. Verifying [last, d1..dk] over a cache
    does (row i sees the cache and rows 0..i), so every verify pass paid two
    cache copies per layer that plain decoding never pays. On a CPU torch's
    kernel takes grouped heads with a mask, with the same numbers
    (tests/test_target.py) and without the copies (`make verify-cost`
    measures the difference). GPUs keep transformers' own.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if model.config._attn_implementation != "sdpa" or model.device.type != "cpu":
        return
    AttentionInterface.register(GROUPED, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED, sdpa_mask)  # the masks sdpa gets, unchanged
    model.set_attn_implementation(GROUPED)
