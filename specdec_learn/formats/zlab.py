"""z-lab's DFlash format (``DFlashDraftModel``): what ``z-lab/Qwen3-8B-DFlash-b16`` ships.

config.json: a Qwen3 config for the draft layers with
``architectures: ["DFlashDraftModel"]``, ``block_size``,
``num_target_layers`` and a ``dflash_config`` holding ``mask_token_id`` and
``target_layer_ids`` (DFlash numbering: layer i = the OUTPUT of target layer
i). Older checkpoints keep those two at the top level.

Tensors: ``fc.weight`` [H, n_taps * H_target], ``hidden_norm.weight``,
``layers.{i}.*`` with Qwen3's names, ``norm.weight``. No embedding or LM
head: the draft uses the target's.

Keys honoured (checked against z-lab/dflash ``dflash/model.py`` and vLLM's
``model_executor/models/qwen3_dflash.py``):

* the Qwen3 fields of the draft layers (shape, ``rms_norm_eps``,
  ``attention_bias``, RoPE and its scaling, ``layer_types`` /
  ``sliding_window`` / ``use_sliding_window``);
* ``block_size``, ``mask_token_id``, ``num_target_layers``;
* ``target_layer_ids``: when absent, z-lab's own default
  ``build_target_layer_ids(num_target_layers, num_hidden_layers)`` (one tap
  per DRAFT layer, spread over layers 1..L-3);
* how each layer attends, by vLLM's rules (``_resolve_layer_attention``):
  top-level ``is_causal`` and ``dflash_config.causal`` (override causality
  for every layer), ``dflash_config.use_swa`` (every layer sliding) and
  ``dflash_config.swa_window_size`` (the window), copied into
  ``cfg.dflash_attention`` for ``drafters/dflash.layer_attention``.

Refused with a message: an attention sink bias, ``attention_value_scale``,
``is_neox_style: false`` (interleaved RoPE), a reduced ``draft_vocab_size``,
``use_aux_hidden_state: false``, ``sample_from_anchor: true`` (that is
DSpark's slot convention), a config with neither ``target_layer_ids`` nor
``num_target_layers``, or without ``mask_token_id``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .io import (cpu_tensors, full_attention_head_dim, full_attention_rope, qwen3_config, read_config, read_weights,
                 write_folder)

SMOLLM2_MASK_TOKEN_ID = 16  # "<empty_output>", free to mean MASK (drafters/dflash.py says why)

# Keys that are DFlash's rather than Qwen3Config's.
DFLASH_KEYS = ("block_size", "dflash_config", "mask_token_id", "target_layer_ids", "num_target_layers", "architectures",
               "is_causal", "draft_vocab_size", "add_swa_attention_sink_bias", "is_neox_style", "use_aux_hidden_state")
ATTENTION_KEYS = ("causal", "use_swa", "swa_window_size")  # in dflash_config; honoured (see the module docstring)
ATTENTION_TYPES = ("full_attention", "sliding_attention")


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps: the middle layer for one draft layer, else round(1 + i (L - 4) / (n - 1))."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def draft_config(target, num_layers: int = 1, block_size: int = 16, num_taps: int = 3,
                 mask_token_id: int = SMOLLM2_MASK_TOKEN_ID, target_layer_ids=None) -> Qwen3Config:
    """The config of a fresh DFlash drafter for `target`: a Qwen3Config sized like the target's layers (hidden size,
    heads, MLP, RoPE) with the three DFlash fields (``target_layer_ids`` in DFlash numbering)."""
    from transformers import Qwen3Config

    t = target.config
    cfg = Qwen3Config(
        vocab_size=target.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=full_attention_head_dim(t),
        rms_norm_eps=t.rms_norm_eps, max_position_embeddings=t.max_position_embeddings,
        rope_parameters=full_attention_rope(t),
        tie_word_embeddings=False,
    )
    cfg.block_size = block_size
    cfg.mask_token_id = mask_token_id
    cfg.target_layer_ids = list(target_layer_ids or build_target_layer_ids(target.num_layers, num_taps))
    cfg.num_target_layers = target.num_layers
    return cfg


def layer_attention(cfg, i: int) -> tuple[int | None, bool]:
    """(window or None, causal) of draft layer i, by vLLM's rules for DFlash drafters.

    A ``sliding_attention`` layer has a window (``dflash_config.swa_window_size``,
    else ``sliding_window``) and is causal; a full layer neither. ``use_swa``
    makes every layer sliding (unless ``layer_types`` already has sliding
    ones); ``is_causal`` / ``causal`` override causality for every layer.
    The overrides come from `read_dflash` (``cfg.dflash_attention``); the
    DFlash network (drafters/dflash.py, DSpark's too) asks this for each layer.
    """
    over = getattr(cfg, "dflash_attention", None) or {}
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)
    unknown = sorted(set(types) - set(ATTENTION_TYPES))
    if unknown:
        raise ValueError(f"DFlash layer types {unknown} are not implemented (only {', '.join(ATTENTION_TYPES)}).")
    sliding = types[i] == "sliding_attention" or (over.get("use_swa", False) and "sliding_attention" not in types)
    window = over.get("swa_window_size", cfg.sliding_window) if sliding else None
    if sliding and window is None:
        raise ValueError(f"DFlash layer {i} is sliding_attention but the config gives no window (sliding_window, "
                         "or use_sliding_window: false nulls it); vLLM refuses it too.")
    causal = over.get("is_causal", over.get("causal", types[i] == "sliding_attention"))
    return window, bool(causal)


def refused_keys(d: dict, sub: dict) -> list[str]:
    """The keys of a DFlash config (`d`, its dflash_config `sub`) that change the forward in ways not implemented."""
    refused = []
    if sub.get("attention_sink_bias") or d.get("add_swa_attention_sink_bias"):
        refused.append("an attention sink bias")
    if sub.get("attention_value_scale") is not None:
        refused.append("attention_value_scale")
    if d.get("is_neox_style", True) is False:
        refused.append("is_neox_style false (interleaved RoPE)")
    if d.get("draft_vocab_size") not in (None, d.get("vocab_size")):
        refused.append(f"a reduced draft_vocab_size ({d['draft_vocab_size']} of {d.get('vocab_size')})")
    if sub.get("use_aux_hidden_state", d.get("use_aux_hidden_state", True)) is False:
        refused.append("use_aux_hidden_state false")
    if sub.get("sample_from_anchor"):
        refused.append("sample_from_anchor true (DSpark's convention: load it as a DSpark drafter)")
    return refused


def read_dflash(path):
    """(Qwen3Config with block_size / mask_token_id / target_layer_ids / num_target_layers, tensors)."""
    d = read_config(path, "a z-lab DFlash checkpoint")
    if "DFlashDraftModel" not in (d.get("architectures") or []):
        raise ValueError(f"{path} is not a z-lab DFlash checkpoint (architectures={d.get('architectures')}).")
    sub = d.get("dflash_config") or {}
    refused = refused_keys(d, sub)
    if refused:
        raise ValueError(f"{path}/config.json asks for what this DFlash network does not implement: "
                         + "; ".join(refused) + ".")

    def field(name, default=None):  # dflash_config first, then the top level (older checkpoints)
        return sub.get(name, d.get(name, default))

    cfg = qwen3_config({k: v for k, v in d.items() if k not in DFLASH_KEYS})
    cfg.block_size = int(field("block_size", 16))
    cfg.mask_token_id = field("mask_token_id")
    cfg.num_target_layers = d.get("num_target_layers")
    cfg.target_layer_ids = field("target_layer_ids")
    if cfg.target_layer_ids is None and cfg.num_target_layers is not None:  # z-lab's fallback
        cfg.target_layer_ids = build_target_layer_ids(int(cfg.num_target_layers), cfg.num_hidden_layers)
    if cfg.mask_token_id is None or cfg.target_layer_ids is None:
        raise ValueError(f"{path}/config.json lacks mask_token_id, or both target_layer_ids and num_target_layers "
                         "(in dflash_config or at the top level).")
    cfg.target_layer_ids = list(cfg.target_layer_ids)
    cfg.dflash_attention = {k: sub[k] for k in ATTENTION_KEYS if sub.get(k) is not None}
    if d.get("is_causal") is not None:
        cfg.dflash_attention["is_causal"] = bool(d["is_causal"])
    return cfg, read_weights(path)


def write_dflash(cfg, tensors: dict[str, torch.Tensor], path, dtype=torch.bfloat16) -> Path:
    """Write a DFlash drafter as a z-lab checkpoint (config.json + model.safetensors)."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in DFLASH_KEYS and k != "dflash_attention"}
    attention = dict(getattr(cfg, "dflash_attention", None) or {})
    is_causal = attention.pop("is_causal", None)
    d.update(
        architectures=["DFlashDraftModel"], model_type="qwen3", block_size=cfg.block_size,
        num_target_layers=getattr(cfg, "num_target_layers", None),
        dflash_config={"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                       **attention},
    )
    if is_causal is not None:
        d["is_causal"] = is_causal
    return write_folder(path, d, cpu_tensors(tensors, dtype))
