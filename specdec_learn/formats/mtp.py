"""Native MTP weights inside a target checkpoint: the two published naming schemes.

Qwen3.5 / Qwen3-Next (config ``mtp_num_hidden_layers``, or
``num_nextn_predict_layers`` for Qwen3-Next; in ``text_config`` for the VL
checkpoints): every MTP tensor is under ``mtp.``, with shared
``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.fc``,
``mtp.norm`` and the layers as ``mtp.layers.{j}.*``.

DeepSeek-V3 (config ``num_nextn_predict_layers``): MTP layer j is stored as
decoder layer ``model.layers.{L + j}`` (L = num_hidden_layers), holding its
own ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``, the block's
weights at the layer's top level, and copies of the target's embedding and
head (``embed_tokens``, ``shared_head.head``).

MoE layers: transformers fuses experts (``experts.gate_up_proj [E, 2I, H]``,
``experts.down_proj [E, H, I]``); the published files store one
``experts.{e}.{gate,up,down}_proj.weight`` per expert. `split_experts` and
`fuse_experts` convert.

Our MTPHead (drafters/mtp.py) names its modules ``pre_fc_norm_embedding``,
``fc``, ``layers.{j}``, ``norm`` (Qwen layout) or ``layers.{j}.{enorm, hnorm,
eh_proj, mtp_block, shared_head_norm}`` (DeepSeek layout); this module maps
those names to and from the files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .io import cpu_tensors, read_config, save_tensors_atomic, write_text_atomic

LAYOUTS = ("qwen3_next", "deepseek_v3")
WEIGHTS_FILE = "mtp.safetensors"  # where `write_mtp` puts a graft's weights


def mtp_config(checkpoint_dir) -> tuple[str, int]:
    """(layout, number of MTP layers) from a checkpoint's config.json; (layout, 0) when it has none."""
    cfg = read_config(checkpoint_dir, "a target checkpoint")
    configs = [cfg, cfg.get("text_config") or {}]
    for c in configs:  # Qwen3.5 names it mtp_num_hidden_layers (in text_config for the VL checkpoints)
        if c.get("mtp_num_hidden_layers"):
            return "qwen3_next", int(c["mtp_num_hidden_layers"])
    for c in configs:  # Qwen3-Next and DeepSeek-V3 both say num_nextn_predict_layers
        if c.get("num_nextn_predict_layers"):
            layout = "deepseek_v3" if c.get("model_type", "").startswith("deepseek") else "qwen3_next"
            return layout, int(c["num_nextn_predict_layers"])
    return "qwen3_next", 0


def is_mtp_name(name: str, layout: str, L: int) -> bool:
    """Whether a checkpoint tensor belongs to the MTP layers (not to the main model)."""
    if layout == "qwen3_next":
        return name.startswith("mtp.")
    if not name.startswith("model.layers."):
        return False
    return int(name.split(".")[2]) >= L


def read_mtp_tensors(checkpoint_dir, layout: str, L: int) -> dict[str, torch.Tensor]:
    """Every MTP tensor in the checkpoint's safetensors files (the main model's are skipped)."""
    from safetensors import safe_open

    tensors = {}
    for file in sorted(Path(checkpoint_dir).glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if is_mtp_name(name, layout, L):
                        tensors[name] = f.get_tensor(name)
        except Exception as err:  # safetensors' own error type names no file
            raise ValueError(f"{file} cannot be read ({err}): the file is truncated or damaged.") from err
    return tensors


# --- names: ours <-> the checkpoint's ------------------------------------------------


def to_checkpoint_name(name: str, layout: str, L: int) -> str:
    if layout == "qwen3_next":
        return "mtp." + name
    j, rest = name.removeprefix("layers.").split(".", 1)  # layers.{j}.<rest>
    rest = rest.removeprefix("mtp_block.").replace("shared_head_norm.", "shared_head.norm.")
    return f"model.layers.{L + int(j)}.{rest}"


def from_checkpoint_name(name: str, layout: str, L: int) -> str:
    if layout == "qwen3_next":
        return name.removeprefix("mtp.")
    n, rest = name.removeprefix("model.layers.").split(".", 1)
    rest = rest.replace("shared_head.norm.", "shared_head_norm.")
    if not rest.startswith(("enorm.", "hnorm.", "eh_proj.", "shared_head_norm.", "mtp_block.")):
        rest = "mtp_block." + rest  # the published files keep the block weights at the layer's top level
    return f"layers.{int(n) - L}.{rest}"


def to_checkpoint(state: dict[str, torch.Tensor], layout: str, L: int, num_layers: int,
                  embed_tokens: torch.Tensor, lm_head: torch.Tensor) -> dict[str, torch.Tensor]:
    """Our MTPHead state dict -> the published names (DeepSeek also repeats the target's embedding and head)."""
    out = {to_checkpoint_name(name, layout, L): t for name, t in split_experts(state).items()}
    if layout == "deepseek_v3":
        for j in range(num_layers):
            out[f"model.layers.{L + j}.embed_tokens.weight"] = embed_tokens
            out[f"model.layers.{L + j}.shared_head.head.weight"] = lm_head
    return out


def from_checkpoint(tensors: dict[str, torch.Tensor], layout: str, L: int) -> dict[str, torch.Tensor]:
    """Published MTP tensors -> our MTPHead names (the repeated embedding and head are dropped: we use the target's)."""
    ours = {}
    for name, tensor in fuse_experts(tensors).items():
        if name.endswith(("shared_head.head.weight", "embed_tokens.weight")):
            continue
        ours[from_checkpoint_name(name, layout, L)] = tensor
    return ours


def split_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused MoE experts -> one ``experts.{e}.{gate,up,down}_proj.weight`` each."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]
            base, inter = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter]
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith("experts.down_proj"):  # [E, H, I]
            base = name.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def fuse_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `split_experts`: per-expert checkpoint tensors -> transformers' fused ones."""
    out, experts = {}, {}
    for name, t in tensors.items():
        match = re.match(r"(.*experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", name)
        if match is None:
            out[name] = t
            continue
        base, e, proj = match.group(1), int(match.group(2)), match.group(3)
        experts.setdefault(base, {}).setdefault(proj, {})[e] = t
    for base, projs in experts.items():
        def stack(proj):
            return torch.stack([projs[proj][e] for e in sorted(projs[proj])])
        out[base + "gate_up_proj"] = torch.cat([stack("gate_proj"), stack("up_proj")], dim=1)  # [E, 2I, H]
        out[base + "down_proj"] = stack("down_proj")  # [E, H, I]
    return out


# --- writing a graft -------------------------------------------------------------------


def write_mtp(tensors: dict[str, torch.Tensor], checkpoint_dir, layout: str, num_layers: int,
              config_extra: dict | None = None, dtype=None) -> Path:
    """Write MTP tensors (published names) as ``mtp.safetensors`` + the layer count in config.json.

    The count goes in the way the layout's models say it
    (``mtp_num_hidden_layers`` for Qwen3.5, ``num_nextn_predict_layers``
    otherwise), so a graft reads back like a real checkpoint. Each file is
    written atomically, the weights first and config.json (the manifest) last.
    """
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    save_tensors_atomic(cpu_tensors(tensors, dtype), checkpoint_dir / WEIGHTS_FILE)
    cfg_path = checkpoint_dir / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    cfg["num_nextn_predict_layers" if layout == "deepseek_v3" else "mtp_num_hidden_layers"] = num_layers
    cfg.update(config_extra or {})
    write_text_atomic(cfg_path, json.dumps(cfg, indent=2))
    return checkpoint_dir
