"""z-lab's DFlash format (``DFlashDraftModel``): what ``z-lab/Qwen3-8B-DFlash-b16`` ships.

config.json: a Qwen3 config for the draft layers with
``architectures: ["DFlashDraftModel"]``, ``block_size``,
``num_target_layers`` and a ``dflash_config`` holding ``mask_token_id`` and
``target_layer_ids`` (DFlash numbering: layer i = the OUTPUT of target layer
i). Older checkpoints keep those two at the top level.

Tensors: ``fc.weight`` [H, n_taps * H_target], ``hidden_norm.weight``,
``layers.{i}.*`` with Qwen3's names, ``norm.weight``. No embedding or LM
head: the draft uses the target's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .io import cpu_tensors, qwen3_config, read_config, read_weights, write_folder

# Keys that are DFlash's rather than Qwen3Config's.
DFLASH_KEYS = ("block_size", "dflash_config", "mask_token_id", "target_layer_ids", "num_target_layers", "architectures")


def read_dflash(path):
    """(Qwen3Config with block_size / mask_token_id / target_layer_ids / num_target_layers, tensors)."""
    d = read_config(path, "a z-lab DFlash checkpoint")
    if "DFlashDraftModel" not in (d.get("architectures") or []):
        raise ValueError(f"{path} is not a z-lab DFlash checkpoint (architectures={d.get('architectures')}).")
    sub = d.get("dflash_config") or {}

    def field(name, default=None):  # dflash_config first, then the top level (older checkpoints)
        return sub.get(name, d.get(name, default))

    cfg = qwen3_config({k: v for k, v in d.items() if k not in DFLASH_KEYS})
    cfg.block_size = int(field("block_size", 16))
    cfg.mask_token_id = field("mask_token_id")
    cfg.target_layer_ids = field("target_layer_ids")
    cfg.num_target_layers = d.get("num_target_layers")
    if cfg.mask_token_id is None or cfg.target_layer_ids is None:
        raise ValueError(f"{path}/config.json lacks mask_token_id or target_layer_ids (in dflash_config).")
    return cfg, read_weights(path)


def write_dflash(cfg, tensors: dict[str, torch.Tensor], path, dtype=torch.bfloat16) -> Path:
    """Write a DFlash drafter as a z-lab checkpoint (config.json + model.safetensors)."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in DFLASH_KEYS}
    d.update(
        architectures=["DFlashDraftModel"], model_type="qwen3", block_size=cfg.block_size,
        num_target_layers=getattr(cfg, "num_target_layers", None),
        dflash_config={"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
    )
    return write_folder(path, d, cpu_tensors(tensors, dtype))
