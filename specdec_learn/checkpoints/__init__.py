"""The drafters this package ships, and the one place that finds a drafter's checkpoint.

Every learned method needs weights to draft with. For the embedded CPU target
(SmolLM2-135M) this package ships small ones it trained itself, one folder
per method under ``specdec_learn/checkpoints/``; for any other target the
user names a folder or a hub id (``draft=``, CLI ``--draft``). `find` is the
one function the loop's zoo, the vLLM backend and the CLI call:

    find(method, target_name, draft=None)   # -> a local folder to load

* ``draft=None``: the shipped folder for (method, target); for ``mtp``, the
  target checkpoint's own MTP layers when the target is a local folder or a
  hub id, else the shipped graft;
* a local folder: as it is; a hub id: downloaded once by huggingface_hub.

Two shipped drafters carry no vocabulary table. A drafter's tied embedding /
LM head (49,152 rows for SmolLM2) is most of its bytes, so the distilled draft
model and the Gemma-4-style assistant learn theirs as a projection of the
target's, E_draft = E_target · P (train/projected.py). Their folders hold P
(``embed_projection`` [H_target, d]) instead of the table, and `complete`
writes the full HF folder into the cache on first use (`materialize`), keyed
on the shipped weights and the target, so HF, vLLM and our loop all load an
ordinary folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from ..formats.io import cpu_tensors, partial_dir, publish_dir, save_tensors_atomic, write_folder
from ..methods import METHODS, get
from ..models import EMBEDDED, cache_dir, drafter_dir, model_path

HERE = Path(__file__).resolve().parent


def shipped_drafters() -> dict[tuple[str, str], str]:
    """(method, target name) -> the folder under specdec_learn/checkpoints/ that ships it (methods.py)."""
    return {(m.name, target): folder for m in METHODS.values() for target, folder in m.shipped.items()}


SHIPPED = shipped_drafters()  # as the package was imported (shipped_drafters() reads methods.py again)


def target_key(target_name) -> str:
    """The registry's name for a target: its embedded name or its folder's last component."""
    return Path(str(target_name)).name


def shipped_folder(method: str, target_name) -> Path:
    """The folder this package ships (or a trainer writes by default) for (method, target), existing or not."""
    return HERE / get(method).shipped.get(target_key(target_name), f"{method}-{target_key(target_name)}")


def shipped(method: str, target_name) -> Path:
    """The shipped drafter for (method, target), complete and loadable, or a message that says what to do."""
    folder, m = shipped_folder(method, target_name), get(method)
    if target_key(target_name) not in m.shipped or not (folder / "config.json").is_file():
        raise ValueError(
            f"No {m.title} is shipped for {str(target_name)!r}: pass draft=<{m.draft}> "
            f"(CLI: --draft), or train one with `specdec train {method}`."
        )
    return complete(folder, target_name)


def find(method: str, target_name, draft: str | None = None) -> Path:
    """The local folder to load `method`'s drafter from (see the module docstring)."""
    if get(method).draft is None:
        raise ValueError(f"{method!r} loads no drafter checkpoint.")
    if draft is not None:
        if method == "draft_model" and draft in EMBEDDED:  # another embedded model drafts (converted once)
            return Path(model_path(draft))
        folder = drafter_dir(draft)
        return complete(folder, target_name) if method in ("draft_model", "gemma4_mtp") else folder
    if method == "mtp":
        name = Path(str(target_name))
        if (name / "config.json").is_file():
            return name  # a local checkpoint: native MTP reads the target's own files
        if "/" in str(target_name) and not name.exists():  # a hub id: the same files, from the HF cache
            return drafter_dir(str(target_name))
    return shipped(method, target_name)


# --- drafters shipped without their vocabulary table (E_draft = E_target · P) -----------

TABLE = "model.embed_tokens.weight"
PROJECTION = "embed_projection"


def target_embedding(target_dir) -> torch.Tensor:
    """The token embedding [V, H] of the HF model in `target_dir`, read from its safetensors files."""
    from safetensors import safe_open

    for file in sorted(Path(target_dir).glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            if TABLE in f.keys():
                return f.get_tensor(TABLE)
    raise FileNotFoundError(f"No {TABLE} in {target_dir}/*.safetensors.")


def without_table(tensors: dict[str, torch.Tensor], proj: torch.Tensor) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with the vocabulary table (it is E_target · P) dropped and P kept instead, bf16."""
    kept = cpu_tensors({k: v for k, v in tensors.items() if k != TABLE}, torch.bfloat16)
    kept[PROJECTION] = proj.detach().to("cpu", torch.bfloat16).contiguous()  # P [H_target, d]
    return kept


def strip_table(folder, proj: torch.Tensor) -> None:
    """Rewrite folder/model.safetensors without its vocabulary table, keeping P instead (atomically)."""
    from safetensors.torch import load_file

    file = Path(folder) / "model.safetensors"
    save_tensors_atomic(without_table(load_file(file), proj), file)


def write_draft_delta(llama, proj: torch.Tensor, out_dir, target_name, info: dict, files: dict | None = None) -> Path:
    """Write a draft model without its embedding: config.json + model.safetensors (layers, norm, P), bf16."""
    config = llama.config.to_dict()
    config.update(architectures=["LlamaForCausalLM"], dtype="bfloat16")
    config["specdec_draft"] = {"target": target_key(target_name),
                               "embedding": "model.embed_tokens.weight = target embedding @ embed_projection",
                               "training": info}
    return write_folder(out_dir, config, without_table(llama.state_dict(), proj), files)


def has_projection(folder) -> bool:
    from safetensors import safe_open

    file = Path(folder) / "model.safetensors"
    if not file.is_file():
        return False
    with safe_open(file, "pt") as f:
        return PROJECTION in f.keys()


def complete(folder, target_name) -> Path:
    """`folder` as it is, or its materialized copy when it was shipped without its table."""
    return materialize(folder, target_name) if has_projection(folder) else Path(folder)


def shipped_digest(folder: Path) -> str:
    """SHA-256 over the names and bytes of every file a materialized copy is made from."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.iterdir() if p.is_file() and p.name != "README.md"):
        digest.update(file.name.encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def materialize(folder, target_name, out_dir=None) -> Path:
    """A folder shipped without its table + the target's embedding -> a complete HF folder (cached, rebuilt when stale).

    Every other file is copied as it is; the target's tokenizer files are
    added, so HF and vLLM can load the folder on its own. The copy is keyed on
    every shipped file (weights, config, recipe) AND the target's folder, so a
    changed file or another target rebuilds it.
    """
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    out = Path(out_dir or cache_dir() / "models" / folder.name)
    target_dir = Path(model_path(str(target_name)))
    source = shipped_digest(folder) + " " + str(target_dir.resolve())
    if (out / "source.txt").exists() and (out / "source.txt").read_text() == source:
        return out
    tensors = load_file(folder / "model.safetensors")
    if PROJECTION not in tensors:
        raise ValueError(f"{folder}/model.safetensors has no {PROJECTION}: it is a complete checkpoint, load it as it is.")
    shutil.rmtree(out, ignore_errors=True)  # a stale copy (another shipped file or target)
    proj = tensors.pop(PROJECTION).float()  # [H_target, d]
    embedding = target_embedding(target_dir).float()  # [V, H_target]
    if embedding.shape[1] != proj.shape[0]:
        raise ValueError(f"{folder.name}'s projection expects a target hidden size of {proj.shape[0]}, "
                         f"but {str(target_name)!r} has {embedding.shape[1]}: it was trained for another target.")
    tensors[TABLE] = (embedding @ proj).to(torch.bfloat16)  # E_draft [V, d]
    tmp = partial_dir(out)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    for file in folder.iterdir():
        if file.is_file() and file.name not in ("model.safetensors", "README.md"):
            shutil.copy(file, tmp / file.name)
    config = json.loads((tmp / "config.json").read_text())
    config.pop("specdec_draft", None)  # our note on how it was made; HF needs none of it
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target_dir / name).exists() and not (tmp / name).exists():
            shutil.copy(target_dir / name, tmp / name)
    (tmp / "source.txt").write_text(source)  # the manifest, last
    publish_dir(tmp, out)
    return out
