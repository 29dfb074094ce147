"""Row invariance: a target forward whose row does not depend on how many rows the pass computes.

Speculative decoding promises the output of plain decoding. Plain decoding
runs the target on one row at a time; verification runs it on k + 1 rows at
once (a chain, or a tree's nodes). Mathematically row i of the wide pass is
the one-row pass over the same context. In floating point it is only if every
operation computes row i the same way whatever else is in the pass, and on a
CPU two do not:

* **Attention.** In a k + 1-row pass, row i's scores span the keys of rows
  after it too, masked out. A masked key adds exactly nothing to the softmax,
  but it changes how many keys the kernel's loops run over, and so how it
  blocks and orders its sums: the last bits of row i change (measured in
  bf16 and fp32 on SmolLM2-135M). `row_sdpa` gives each row its own call
  over exactly the keys it sees, the call a one-row pass makes.
* **Linear layers.** torch's CPU matmul picks its kernel by the number of
  rows. In fp32 (MKL's sgemm) one row, two or three, and four or more give
  three roundings of the same dot products; in bf16 one row alone now and
  then differs in its last bit from the same row among others. oneDNN's
  matmul with the weight packed once (what torch's inductor uses for CPU
  linears) rounds alike for every count from two rows up (tested to 64,
  more than a verify pass holds), in both dtypes. So `RowLinear` runs it,
  and never on one row alone: it sends it as two.

A near-tie between two tokens is then decided the same way in the one-row
step and in the verify pass, and greedy speculative decoding reproduces
plain decoding to the bit (tests/test_invariant.py): in fp32 on every CPU,
and in bf16 where oneDNN packs bf16 weights (not on a CPU with AVX2 only).
Elementwise operations and norms work row by row and need nothing.

`make_row_invariant(model)` switches a CPU model over; `target.load` does it
unless told not to (`invariant=False`), and warns where it cannot. It leaves
alone what it cannot make invariant (`not_invariant` says why): linear-attention
layers (Qwen3.5, Qwen3-Next), which compute many rows in chunks and one row
step by step; mixture-of-experts layers; soft-capped attention; bf16 where
oneDNN packs no bf16 weights. GPUs and vLLM batch by their own rules. There
the library promises what chapter 2 proves (each token is distributed as the
target's), not the last bit.
"""

from __future__ import annotations

import functools
import weakref

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROW_SDPA = "sdpa_row_invariant"  # the name make_row_invariant registers with transformers' AttentionInterface


class NotRowInvariant(UserWarning):
    """`target.load` was asked for rows computed alike on a CPU and could not give them (the message says why)."""


def visible_keys(mask: torch.Tensor | None, n: int, length: int) -> list[torch.Tensor | slice]:
    """For each of n query rows, the keys it attends to: a slice where they are consecutive, else their indices.

    mask: None (causal: row i sees keys 0..length-n+i), or [n, length], True (bool) or 0 (additive) where
    row i may look. A fully-masked row sees nothing (an empty slice).
    """
    if mask is None:
        return [slice(0, length - n + i + 1) for i in range(n)]
    seen = mask if mask.dtype == torch.bool else mask == 0  # [n, length]
    rows = []
    for i in range(n):
        where = seen[i].nonzero().flatten()  # [keys of row i]
        if where.numel() == 0:
            rows.append(slice(0, 0))
        elif int(where[-1] - where[0]) + 1 == where.numel():
            rows.append(slice(int(where[0]), int(where[-1]) + 1))
        else:
            rows.append(where)
    return rows


def shared_start(rows: list[torch.Tensor | slice]) -> int:
    """How many keys from key 0 on every gathered row (an index tensor) sees: a tree's cache and root."""
    gathered = [keys for keys in rows if not isinstance(keys, slice)]
    if not gathered:
        return 0
    width = min(keys.numel() for keys in gathered)
    run = torch.stack([keys[:width] for keys in gathered]) == torch.arange(width)  # [rows, width]
    return int(run.all(0).cumprod(0).sum())


_plan: tuple = (None, None)  # ((a weak reference to the last pass's mask, n, length), its plan)


def plan(attention_mask: torch.Tensor | None, n: int, length: int) -> tuple[list[torch.Tensor | slice], int] | None:
    """The keys each of n rows sees and `shared_start` of them, or None where the mask is not a plain one.

    Every layer of a pass gets the same mask object, so the answer is worked out
    once per pass and kept while that mask object lives (nothing writes into a
    mask once it is made).
    """
    global _plan
    key, rows = _plan
    if attention_mask is not None and key is not None and key[0]() is attention_mask and key[1:] == (n, length):
        return rows
    mask = None if attention_mask is None else attention_mask[0, 0, :, :length]  # [n, L], as transformers slices
    plain = mask is None or mask.dtype == torch.bool or bool(
        ((mask == 0) | (mask <= torch.finfo(mask.dtype).min / 2)).all())
    rows = None
    if plain and (mask is None or mask.shape[0] == n):
        keys = visible_keys(mask, n, length)
        rows = keys, shared_start(keys)
    if attention_mask is not None:
        _plan = (weakref.ref(attention_mask), n, length), rows
    return rows


def row_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa attention, one query row at a time over the keys that row sees.

    query [1, H_q, n, D]; key, value [1, H_kv, L, D]; attention_mask [1, 1, n, >= L] (bool, or additive with
    0 where a row looks and a large negative elsewhere) or None (causal). -> ([1, n, H_q, D], None), as
    transformers' attention functions return. Each row's call is the one a one-row pass makes (no mask,
    grouped K/V heads kept grouped), so its bits are the one-row pass's. bf16 rows are attended in fp32,
    whose one-row kernel on a CPU is several times faster, and no less exact. Anything this does not model
    (a GPU, a batch, autograd, dropout, a non-causal layer without a mask, soft-capping, a bias beside the
    mask, attention sinks, a row that sees nothing) goes to transformers' own.

    A chain's rows see consecutive keys: each call takes a view of the cache. A
    tree row sees the cache, the root and its ancestors: those keys are copied
    into one scratch tensor per layer, the cache part once and each row's few
    ancestors over the end of it, rather than the whole cache once per row.
    """
    n, length = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    special = any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "s_aux", "sinks"))
    planned = None if special else plan(attention_mask, n, length)
    rows, start = planned if planned is not None else (None, 0)
    if (query.device.type != "cpu" or query.shape[0] != 1 or torch.is_grad_enabled() or dropout or special
            or rows is None or (attention_mask is None and (not causal or (n > 1 and length != n)))
            or any(isinstance(keys, slice) and keys.stop == keys.start for keys in rows)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    q, k_all, v_all = (x.float() for x in (query, key, value))  # fp32 (no copy when already fp32)
    widest = max((keys.numel() for keys in rows if not isinstance(keys, slice)), default=0)
    if widest:  # the shared keys now, each tree row's own ones below
        shape = (*k_all.shape[:2], widest, k_all.shape[3])  # [1, H_kv, widest, D]
        k_tree, v_tree = k_all.new_empty(shape), v_all.new_empty(shape)
        k_tree[:, :, :start], v_tree[:, :, :start] = k_all[:, :, :start], v_all[:, :, :start]
    out = []
    for i, keys in enumerate(rows):
        if isinstance(keys, slice):
            k, v = k_all[:, :, keys], v_all[:, :, keys]  # [1, H_kv, L_i, D], views
        else:
            end = keys.numel()
            torch.index_select(k_all, 2, keys[start:], out=k_tree[:, :, start:end])
            torch.index_select(v_all, 2, keys[start:], out=v_tree[:, :, start:end])
            k, v = k_tree[:, :, :end], v_tree[:, :, :end]
        out.append(torch.nn.functional.scaled_dot_product_attention(q[:, :, i : i + 1], k, v, scale=scaling,
                                                                    enable_gqa=True))  # [1, H_q, 1, D]
    attended = torch.cat(out, dim=2) if n > 1 else out[0]  # [1, H_q, n, D]
    return attended.to(query.dtype).transpose(1, 2).contiguous(), None  # [1, n, H_q, D]


class RowLinear(nn.Linear):
    """A CPU nn.Linear that rounds a row the same way in a pass of any number of rows.

    It runs oneDNN's matmul on the weight packed once into oneDNN's blocked
    layout, and never on one row alone: a one-row input goes through as two
    rows (itself twice) and one row of the output is kept. From two rows up
    that matmul rounds a row the same way whatever the count, in fp32 and
    bf16 alike. What it costs against torch's own matmuls depends on the CPU
    and the dtype (MKL's one-row fp32 product on an Intel CPU is the fast
    one to beat); benchmarks/row_invariance.py measures it. It is the
    layer it replaces in every other way: the same `weight` and `bias`
    Parameters (a tied embedding stays tied; the state dict keeps its
    names), and anything else (fp16, a GPU, autograd) runs the plain
    nn.Linear forward. The packed copy is a buffer outside the state dict,
    as large as the weight, made again when the weight is changed in place.
    """

    def __init__(self, linear: nn.Linear):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameters, not copies
        self.register_parameter("bias", linear.bias)
        self.register_buffer("packed", None, persistent=False)
        self.packed_version = -1  # the weight's version the packed copy was made from

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype not in (torch.float32, torch.bfloat16) or x.dtype != self.weight.dtype or x.device.type != "cpu"
                or torch.is_grad_enabled() or x.numel() == 0):
            return super().forward(x)
        if self.packed_version != self.weight._version:  # the first call, or the weight changed in place
            with torch.no_grad():  # [out, in], blocked for a matmul of about 2 rows
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 2)
            self.packed_version = self.weight._version
        rows = x.reshape(-1, x.shape[-1])  # [n, in]
        n = rows.shape[0]
        if n == 1:  # the one-row kernel rounds differently: run it as two rows, keep one
            rows = torch.cat([rows, rows])  # [2, in]; a copy made by cat costs less than expand(...).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed, self.bias, "none", [], "")
        return out[:n].view(*x.shape[:-1], out.shape[-1])  # [..., out]


@functools.cache
def packed_matmul_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch and this CPU run oneDNN's packed matmul (RowLinear's path) in `dtype`, tried once on a
    tiny layer. In bf16 oneDNN packs only with AVX512 (or AVX-NE-CONVERT): not on an AVX2-only CPU."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 8, dtype=dtype), 2)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8, dtype=dtype), packed, None, "none", [], "")
        return bool(torch.backends.mkldnn.is_available()) and torch.equal(out, torch.full((2, 4), 8.0, dtype=dtype))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def not_invariant(model: nn.Module) -> str | None:
    """Why `make_row_invariant` would leave `model` as it is (None: it can switch it)."""
    config = model.config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if model.device.type != "cpu":
        return "it is not on a CPU (GPUs batch by their own rules)"
    if model.dtype not in (torch.float32, torch.bfloat16):
        return f"its dtype is {model.dtype}, not fp32 or bf16"
    if model.config._attn_implementation not in ("sdpa", "sdpa_grouped", ROW_SDPA):
        return f"its attention is {model.config._attn_implementation!r}, not sdpa"
    if kinds:
        return f"it has {', '.join(sorted(kinds))} layers, which compute a pass of many rows another way than one row"
    if any(getattr(config, key, None) for key in ("num_experts", "num_local_experts", "n_routed_experts")):
        return "its experts see as many rows as the router sends them"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "its attention soft-caps the scores"
    if not packed_matmul_works(model.dtype):
        dtype = str(model.dtype).replace("torch.", "")
        return (f"this torch on this CPU has no oneDNN packed matmul in {dtype} (fp32 has one wherever torch has "
                "oneDNN: load in fp32, or --dtype auto, to compute rows alike)")
    return None


def make_row_invariant(model: nn.Module) -> bool:
    """Switch a CPU model's attention and its linear layers to the row-invariant paths above.

    -> whether it did; a model `not_invariant` gives a reason for is left as it is. Idempotent.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if is_row_invariant(model):
        return True
    if not_invariant(model) is not None:
        return False
    AttentionInterface.register(ROW_SDPA, row_sdpa)
    AttentionMaskInterface.register(ROW_SDPA, sdpa_mask)  # the masks sdpa gets, unchanged
    model.set_attn_implementation(ROW_SDPA)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, RowLinear(child))
    return True


def is_row_invariant(model: nn.Module) -> bool:
    """Whether `make_row_invariant` switched this model, and it is still on the CPU."""
    return model.config._attn_implementation == ROW_SDPA and model.device.type == "cpu"
