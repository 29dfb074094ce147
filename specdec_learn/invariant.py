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
  linears) rounds alike for every count from two up, in both dtypes. So
  `RowLinear` runs it, and never on one row alone: it sends it as two.

A near-tie between two tokens is then decided the same way in the one-row
step and in the verify pass, and greedy speculative decoding reproduces
plain decoding to the bit, in bf16 as in fp32 (tests/test_invariant.py).
Elementwise operations and norms work row by row and need nothing.

`make_row_invariant(model)` switches a CPU model over; `target.load` does it
unless told not to (`invariant=False`). GPUs, and vLLM, batch by other rules:
the library promises the bits there only in the sense of chapter 2 (the
distribution is the target's), not row for row.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROW_SDPA = "sdpa_row_invariant"  # the name make_row_invariant registers with transformers' AttentionInterface


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


def row_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa attention, one query row at a time over the keys that row sees.

    query [1, H_q, n, D]; key, value [1, H_kv, L, D]; attention_mask [1, 1, n, L] (bool, or additive with
    0 where a row looks and a large negative elsewhere) or None. -> ([1, n, H_q, D], None), as
    transformers' attention functions return. Each row's call is the one a one-row pass makes (no mask,
    grouped K/V heads kept grouped), so its bits are the one-row pass's. Anything this does not model
    (a batch, dropout, soft-capping, a bias beside the mask, attention sinks) goes to transformers' own.
    """
    plain = attention_mask is None or attention_mask.dtype == torch.bool or bool(
        ((attention_mask == 0) | (attention_mask <= torch.finfo(attention_mask.dtype).min / 2)).all())
    special = any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "s_aux", "sinks"))
    if query.shape[0] != 1 or dropout or special or not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    n, length = query.shape[2], key.shape[2]
    mask = None if attention_mask is None else attention_mask[0, 0, -n:, -length:]  # [n, L]
    rows = []
    for i, keys in enumerate(visible_keys(mask, n, length)):
        k = key[:, :, keys] if isinstance(keys, slice) else key.index_select(2, keys)  # [1, H_kv, L_i, D]
        v = value[:, :, keys] if isinstance(keys, slice) else value.index_select(2, keys)
        rows.append(torch.nn.functional.scaled_dot_product_attention(query[:, :, i : i + 1], k, v, scale=scaling,
                                                                     enable_gqa=True))  # [1, H_q, 1, D]
    out = torch.cat(rows, dim=2) if n > 1 else rows[0]  # [1, H_q, n, D]
    return out.transpose(1, 2).contiguous(), None  # [1, n, H_q, D]


class RowLinear(nn.Module):
    """A CPU nn.Linear that rounds a row the same way in a pass of any number of rows.

    It runs oneDNN's matmul on the weight packed once into oneDNN's blocked
    layout, and never on one row alone: a one-row input goes through as two
    rows (itself twice) and one row of the output is kept. From two rows up
    that matmul rounds a row the same way whatever the count, in fp32 and
    bf16 alike; and reading a packed weight is faster than torch's own
    matmuls on the CPUs measured (benchmarks/row_invariance.py). The packed
    copy is a buffer, not a parameter: `weight` stays the layer's own (a tied
    embedding, a drafter reading the LM head), and anything else (fp16, a
    GPU, autograd) runs the plain layer.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear
        packed = None
        if linear.weight.dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available():
            with torch.no_grad():  # [out, in], blocked for a matmul of about 2 rows
                packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 2)
        self.register_buffer("packed", packed, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.dtype != self.packed.dtype or x.device.type != "cpu" or torch.is_grad_enabled():
            return self.linear(x)
        rows = x.reshape(-1, x.shape[-1])  # [n, in]
        n = rows.shape[0]
        if n == 1:  # the one-row kernel rounds differently: run it as two rows, keep one
            rows = rows.expand(2, -1)
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed, self.linear.bias, "none", [], "")
        return out[:n].view(*x.shape[:-1], out.shape[-1])  # [..., out]


def make_row_invariant(model: nn.Module) -> bool:
    """Switch a CPU model's attention and (in fp32) its linear layers to the row-invariant paths above.

    -> whether it did: only a CPU model whose attention is transformers' sdpa is switched. Idempotent.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if is_row_invariant(model):
        return True
    if model.device.type != "cpu" or model.config._attn_implementation not in ("sdpa", "sdpa_grouped"):
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
    """Whether `make_row_invariant` switched this model."""
    return model.config._attn_implementation == ROW_SDPA
