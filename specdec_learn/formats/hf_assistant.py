"""transformers' ``gemma4_assistant`` format: Gemma 4's MTP drafter, as ``google/gemma-4-E2B-it-assistant`` ships it.

An ordinary HF folder (config.json with ``model_type: "gemma4_assistant"``,
``backbone_hidden_size``, a ``text_config``; ``model.safetensors``) that
transformers' own ``Gemma4AssistantForCausalLM`` reads and writes, so this
module only checks what it is given and names the folder in every error.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .io import read_config, safetensors_files

MODEL_TYPE = "gemma4_assistant"


def read_assistant(path, dtype: torch.dtype | None = None):
    """A ``Gemma4AssistantForCausalLM`` from a complete gemma4_assistant folder."""
    from transformers import Gemma4AssistantForCausalLM

    path = Path(path)
    d = read_config(path, "a gemma4_assistant")
    if d.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path} is not a Gemma 4 assistant (model_type {d.get('model_type')!r}, "
                         f"expected {MODEL_TYPE!r}).")
    safetensors_files(path)  # a folder without weights says so, not a tokenizer error
    return Gemma4AssistantForCausalLM.from_pretrained(str(path), dtype=dtype)


def write_assistant(model, path) -> Path:
    """Save an assistant as transformers does (the folder `read_assistant` reads)."""
    from .io import partial_dir, replace_dir

    path = Path(path)
    tmp = partial_dir(path)
    model.save_pretrained(tmp)
    replace_dir(tmp, path)
    return path
