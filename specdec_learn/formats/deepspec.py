"""DeepSpec's DSpark format (deepseek-ai/DeepSpec, ``Qwen3DSparkModel``).

config.json: the Qwen3 fields of the draft layers, plus DSpark's own:
``block_size``, ``target_layer_ids`` (DFlash numbering, -1 = the embedding
output), ``mask_token_id``, ``markov_rank``, ``markov_head_type``,
``enable_confidence_head``, ``confidence_head_with_markov``, ``num_anchors``
(and ``num_target_layers``).

Tensors: the DFlash backbone (``fc``, ``hidden_norm``, ``layers.*``,
``norm``), ``markov_head.markov_w{1,2}.weight``,
``confidence_head.proj.{weight,bias}``, and the draft's OWN ``embed_tokens``
and ``lm_head`` (copies of the target's).

The head fields are shared with the speculators ``dspark`` format, which
stores them under the same names (speculators.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .io import cpu_tensors, qwen3_config, read_weights, write_folder

# Keys that are DSpark's (or DFlash's) rather than Qwen3Config's.
HEAD_KEYS = (
    "block_size", "target_layer_ids", "mask_token_id", "markov_rank", "markov_head_type", "enable_confidence_head",
    "confidence_head_with_markov", "num_anchors", "num_target_layers", "architectures", "dflash_config",
    "dflash_attention",
)
MARKOV_HEAD_TYPES = ("vanilla",)  # what the network implements (vLLM too); "gated" / "rnn" are refused
# What a Qwen3DSparkModel config without a head field means (DeepSpec's build_draft_config writes them all).
DEFAULTS = {"markov_rank": 0, "markov_head_type": "vanilla", "enable_confidence_head": False,
            "confidence_head_with_markov": False, "num_anchors": 256}


def is_deepspec(d: dict) -> bool:
    return "Qwen3DSparkModel" in (d.get("architectures") or [])


def read_heads(cfg, fields: dict, path, defaults: dict = DEFAULTS) -> None:
    """Copy DSpark's head fields from a config dict onto `cfg` (a missing one takes its format's default),
    refusing a Markov head we do not implement."""
    fields = {**defaults, **{k: v for k, v in fields.items() if v is not None}}
    if "block_size" not in fields or fields.get("mask_token_id") is None:
        raise ValueError(f"{path}/config.json lacks block_size or mask_token_id.")
    cfg.block_size = int(fields["block_size"])
    cfg.mask_token_id = fields["mask_token_id"]
    cfg.markov_rank = int(fields["markov_rank"])
    cfg.markov_head_type = str(fields["markov_head_type"]).lower()
    cfg.enable_confidence_head = bool(fields["enable_confidence_head"])
    cfg.confidence_head_with_markov = bool(fields["confidence_head_with_markov"])
    cfg.num_anchors = int(fields["num_anchors"])
    cfg.num_target_layers = fields.get("num_target_layers")
    if cfg.markov_rank > 0 and cfg.markov_head_type not in MARKOV_HEAD_TYPES:
        raise ValueError(
            f"{path}: markov_head_type {cfg.markov_head_type!r} is not implemented here, only 'vanilla' "
            "(as in vLLM). Use a vanilla-head checkpoint."
        )


def head_fields(cfg) -> dict:
    """DSpark's head fields of `cfg`, as both formats write them."""
    return {
        "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id, "markov_rank": cfg.markov_rank,
        "markov_head_type": cfg.markov_head_type, "enable_confidence_head": cfg.enable_confidence_head,
        "confidence_head_with_markov": cfg.confidence_head_with_markov, "num_anchors": cfg.num_anchors,
    }


def read_dspark(path, d: dict):
    """(Qwen3Config with DSpark's fields, tensors) of a DeepSpec folder (config dict `d`)."""
    cfg = qwen3_config({k: v for k, v in d.items() if k not in HEAD_KEYS})
    cfg.target_layer_ids = list(d["target_layer_ids"])
    read_heads(cfg, d, path)
    return cfg, read_weights(path)


def write_dspark(cfg, tensors: dict[str, torch.Tensor], embed_tokens: torch.Tensor, lm_head: torch.Tensor, path,
                 dtype=torch.bfloat16) -> Path:
    """Write a DSpark drafter in DeepSpec's format, with the embedding and LM head it must carry."""
    layer_cfg = {k: v for k, v in cfg.to_dict().items() if k not in HEAD_KEYS}
    d = {**layer_cfg, "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3",
         "target_layer_ids": list(cfg.target_layer_ids), "num_target_layers": cfg.num_target_layers,
         **head_fields(cfg)}
    state = {k: v for k, v in tensors.items() if not k.startswith(("embed_tokens.", "lm_head."))}
    state["embed_tokens.weight"], state["lm_head.weight"] = embed_tokens, lm_head
    return write_folder(path, d, cpu_tensors(state, dtype))
