"""Generic checkpoint IO: what every format module needs, written once.

A checkpoint here is a folder with ``config.json`` and ``*.safetensors``
files. Reading names the folder in every error, so a user with a truncated
download is told which file to fetch again. Writing is atomic: a folder is
built under a private name beside its destination and renamed into place in
one step, a single file is written to a temporary name and renamed, so an
interrupted save never leaves a half-written checkpoint that a later load
mistakes for a real one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn


def read_config(path, what: str = "a drafter checkpoint") -> dict:
    """config.json of the checkpoint folder `path`, as a dict."""
    path = Path(path)
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"No config.json in {path}: point to {what} directory.")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON ({err}): the download is damaged, fetch it again.") from err


def safetensors_files(path) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"No *.safetensors weights in {path}.")
    return files


def read_weights(path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in `path`."""
    from safetensors.torch import load_file

    weights = {}
    for file in safetensors_files(path):
        try:
            weights.update(load_file(file))
        except Exception as err:  # safetensors raises its own error type, without the file's name
            raise ValueError(f"{file} cannot be read ({err}): the file is truncated or damaged; "
                             "fetch or write it again.") from err
    return weights


def load_strict(model: nn.Module, weights: dict[str, torch.Tensor], what: str) -> None:
    """Load `weights` into `model`, naming the missing, unexpected and mis-shaped tensors."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    if missing or unexpected:
        raise ValueError(f"{what}: missing tensors {missing[:6]}, unexpected tensors {unexpected[:6]}.")
    for name, tensor in weights.items():
        if own[name].shape != tensor.shape:
            raise ValueError(f"{what}: tensor {name} has shape {tuple(tensor.shape)}, the config implies "
                             f"{tuple(own[name].shape)}.")
        if kind(own[name]) != kind(tensor):  # bf16 for fp32 is a cast; an integer for a float is damage
            raise ValueError(f"{what}: tensor {name} is {tensor.dtype} where the network holds "
                             f"{own[name].dtype}: the checkpoint is damaged or of another format.")
    model.load_state_dict(weights)


def kind(t: torch.Tensor) -> str:
    """A tensor's kind of number: "float", "bool" or "int" (the precision within a kind may differ)."""
    return "float" if t.is_floating_point() else "bool" if t.dtype == torch.bool else "int"


def qwen3_config(d: dict):
    """A Qwen3Config from a config.json dict, old (`rope_theta`) or new (`rope_parameters`) style."""
    from transformers import Qwen3Config

    d = dict(d)
    if "rope_parameters" not in d and "rope_theta" in d:
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": d.pop("rope_theta")}
        if d.get("rope_scaling"):
            d["rope_parameters"].update(d.pop("rope_scaling"))
    return Qwen3Config(**d)


def full_attention_rope(config) -> dict:
    """A target's RoPE settings as one flat dict (``rope_type``, ``rope_theta``, scaling keys).

    Most configs hold one dict; Gemma 3 keys it by layer type (``{"sliding_attention": ...,
    "full_attention": ...}``, different thetas). A drafter's layer attends over the whole
    context, so it takes the full-attention settings.
    """
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]
    rope = dict(rope)
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope.setdefault("rope_type", "default")
    return rope


def full_attention_head_dim(config) -> int:
    """The head size of a target's full-attention layers, which a drafter's layer copies (as its RoPE).

    Gemma 4 gives its full-attention layers larger heads than its sliding ones;
    transformers then makes ``head_dim`` a per-layer attribute and refuses to read
    it from the whole config, so it is read from the first full-attention layer.
    """
    if getattr(config, "is_heterogeneous", False) and "head_dim" in (config.per_layer_attributes or ()):
        types = getattr(config, "layer_types", None) or []
        layer = types.index("full_attention") if "full_attention" in types else 0
        return config.per_layer_config[layer].head_dim
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cpu_tensors(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies, floats cast to `dtype` (None keeps each tensor's own), as safetensors wants."""
    return {name: t.detach().to("cpu", dtype if (dtype is not None and t.is_floating_point()) else t.dtype)
            .contiguous().clone() for name, t in tensors.items()}


# --- atomic writes ----------------------------------------------------------------------


def write_text_atomic(file, text: str) -> None:
    """Write `text` to `file` through a temporary name in the same folder, then rename."""
    file = Path(file)
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, file)


def save_tensors_atomic(tensors: dict[str, torch.Tensor], file, metadata: dict | None = None) -> None:
    """safetensors.save_file through a temporary name, then rename."""
    from safetensors.torch import save_file

    file = Path(file)
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata=metadata or {"format": "pt"})
    os.replace(tmp, file)


def write_folder(path, config: dict, tensors: dict[str, torch.Tensor], files: dict[str, str] | None = None,
                 weights_name: str = "model.safetensors") -> Path:
    """Write a whole checkpoint folder atomically: config.json, the weights and any text `files`.

    The folder is built beside `path` under a private name and renamed into
    place; an older folder at `path` is replaced, never half-overwritten.
    Files of the older folder that this write does not produce (a README, a
    benchmark record) are carried over unchanged.
    """
    path = Path(path)
    tmp = partial_dir(path)
    if path.is_dir():
        for old in path.iterdir():
            if old.is_file() and old.name not in {weights_name, "config.json", *(files or {})}:
                shutil.copy2(old, tmp / old.name)
    save_tensors_atomic(tensors, tmp / weights_name)
    for name, text in (files or {}).items():
        (tmp / name).write_text(text, encoding="utf-8")
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")  # the manifest, last
    replace_dir(tmp, path)
    return path


def partial_dir(out: Path) -> Path:
    """A private, empty folder beside `out` to build in; `replace_dir` / `publish_dir` move it into place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def replace_dir(tmp: Path, out: Path) -> None:
    """Move `tmp` to `out`, replacing what is there: at every moment `out` is absent, old or new, never mixed."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def publish_dir(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out` unless another process published it first (then `tmp` is dropped).

    For caches that two processes may build at once (parallel test workers,
    two notebooks): the first rename wins, the loser's identical copy goes.
    """
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
