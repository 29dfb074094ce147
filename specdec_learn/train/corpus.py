"""The corpus: the target's own answers to ~20k prompts, as token ids, kept in the repository.

Every learned drafter trains on text the target wrote (see data.py). Writing
it is the slow part: millions of tokens take hours of CPU, far longer than
any one training run. Kept in a cache, that work is lost with the machine;
kept here, in git, anyone with a clone trains (and reproduces a shipped
drafter) without regenerating a token. So the corpus is stored small:

* token ids, not text: SmolLM2's vocabulary has 49,152 entries, so one id is
  a uint16, two bytes; 3M answer tokens are 6 MB;
* in safetensors shards (the format of the checkpoints; tensors and a JSON
  header, nothing executable: no pickle anywhere);
* keyed by the target and by everything that decides its answers, so data
  from two settings never mixes:

    datasets/<target>/prompts/templated.jsonl      train-split + templated prompts (prompts.training_prompts, frozen)
    datasets/<target>/prompts/magpie.jsonl         requests the target wrote itself (magpie.py)
    datasets/<target>/<key>/manifest.json          settings, split rule, the complete shards (+ their sha256)
    datasets/<target>/<key>/shard-00000.safetensors
    key = "<variant>-n<max_new_tokens>-<engine>", e.g. "greedy-n256-vllm-bf16"

One shard holds E examples laid end to end:

    tokens            uint16 [sum_e P_e + R_e]   example e's prompt ids (P_e), then its response ids (R_e)
    prompt_lengths    int32  [E]                 P_e
    response_lengths  int32  [E]                 R_e
    header metadata   "ids": JSON list of E prompt ids, "variant"

so `Example(id, tokens[start : start + P + R], [False] * P + [True] * R)` is
an example again, exactly as data.load_examples returns it.

Killed at any moment, the store stays readable. A shard is written to a
temporary name in its own folder and renamed into place (a rename is atomic
on one file system); only then is the manifest rewritten the same way, and
the manifest alone says which shards count. A kill before the manifest's
rename leaves at most a stray file that the next run overwrites or deletes,
and its prompts unanswered, so the next run answers them again.

The held-out split is examples.split_examples' rule, by prompt id (recorded in
the manifest); `load_split` applies it. `corpus_vocabulary` counts a draft
vocabulary (vocab.py) in its training split, for `specdec generate/bench
--draft-vocab` (the zoo asks for it).

The job (`python -m specdec_learn.train.corpus start`, in .venv-vllm) grows
the prompts and the answers together: the answer to every prompt not yet
answered, one shard after another, then a round of Magpie requests, and
again, until the Magpie file holds --magpie requests. It runs as a job.py job: niced, from a
snapshot of the code, in its own process group, so it can be paused
(kill -STOP -<pgid>) and continued (kill -CONT -<pgid>); a rerun after a kill
skips every prompt already answered. `status` says where it stands;
`measure` times vLLM at several batch sizes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import struct
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import safetensors.numpy

from ..workloads import Prompt
from . import job, magpie
from .examples import Example, split_examples, variant_name
from .prompts import bench_texts, check_no_benchmark_prompts, training_prompts

REPO = Path(__file__).resolve().parents[2]
DATASETS = REPO / "datasets"
FORMAT = 1
EVAL_FRACTION = 0.05  # examples.split_examples' default
SPLIT_RULE = "eval <=> int(sha256('eval:' + id).hexdigest(), 16) % 10000 < eval_fraction * 10000 (examples.split_examples)"


@dataclass(frozen=True)
class Settings:
    """Everything that decides the target's answers: data made under other settings is other data."""

    target: str = "smollm2-135m"
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = the greedy answer
    seed: int = 0
    engine: str = "vllm-bf16"  # who generated, in what precision

    @property
    def variant(self) -> str:
        return variant_name(self.temperature, self.seed)

    def key(self) -> str:
        return f"{self.variant}-n{self.max_new_tokens}-{self.engine}"


def target_dir(target: str, root=None) -> Path:
    return Path(root or DATASETS) / Path(target).name


def store_dir(settings: Settings, root=None) -> Path:
    """datasets/<target>/<key>/: one store per target and settings."""
    return target_dir(settings.target, root) / settings.key()


# --- atomic files -----------------------------------------------------------------------


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic within one folder


def remove_leftovers(folder: Path, manifest: dict) -> list[Path]:
    """Delete what a killed writer left: temporary files and shards the manifest does not list."""
    listed = {s["file"] for s in manifest["shards"]}
    stray = [p for p in folder.glob(".*.tmp-*")] + [p for p in folder.glob("shard-*") if p.name not in listed]
    for p in stray:
        p.unlink(missing_ok=True)
    return stray


# --- one shard: examples <-> bytes ----------------------------------------------------------


def token_dtype(vocab_size: int):
    """The narrowest unsigned type that holds every id: uint16 for vocabularies up to 65,536."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def encode_shard(examples: list[Example], vocab_size: int) -> bytes:
    """Examples -> the bytes of one safetensors shard (layout in the module docstring)."""
    dtype = token_dtype(vocab_size)
    for ex in examples:
        n = ex.num_prompt_tokens
        if ex.loss_mask != [False] * n + [True] * (len(ex.input_ids) - n):
            raise ValueError(f"Example {ex.id!r}: the store keeps a prompt followed by a response, "
                             "so its loss mask must be False...False True...True.")
        if ex.input_ids and not 0 <= min(ex.input_ids) <= max(ex.input_ids) < vocab_size:
            raise ValueError(f"Example {ex.id!r} has a token id outside the vocabulary of {vocab_size}.")
    tokens = np.array([t for ex in examples for t in ex.input_ids], dtype=dtype)  # [sum P_e + R_e]
    prompt_lengths = np.array([ex.num_prompt_tokens for ex in examples], dtype=np.int32)  # [E]
    response_lengths = np.array([len(ex.input_ids) - ex.num_prompt_tokens for ex in examples], dtype=np.int32)
    variants = {ex.variant for ex in examples}
    if len(variants) > 1:
        raise ValueError(f"One shard holds one variant, got {sorted(variants)}.")
    metadata = {"ids": json.dumps([ex.id for ex in examples]), "variant": variants.pop() if variants else ""}
    arrays = {"tokens": tokens, "prompt_lengths": prompt_lengths, "response_lengths": response_lengths}
    return safetensors.numpy.save(arrays, metadata=metadata)


def shard_metadata(data: bytes) -> dict[str, str]:
    """The header's metadata: a safetensors file opens with its header's length (u64, little end) and the JSON header."""
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]).get("__metadata__", {})


def decode_shard(data: bytes) -> list[Example]:
    """The bytes of one shard -> its examples (the inverse of encode_shard)."""
    meta = shard_metadata(data)
    arrays = safetensors.numpy.load(data)
    tokens = arrays["tokens"].tolist()
    ids = json.loads(meta["ids"])
    examples, start = [], 0
    for prompt_id, p, r in zip(ids, arrays["prompt_lengths"].tolist(), arrays["response_lengths"].tolist()):
        examples.append(Example(prompt_id, tokens[start : start + p + r], [False] * p + [True] * r, meta["variant"]))
        start += p + r
    if len(examples) != len(ids) or start != len(tokens):
        raise ValueError("A shard's lengths do not add up to its tokens: the file is damaged.")
    return examples


# --- the store: a manifest and its shards -------------------------------------------------------


def new_manifest(settings: Settings, vocab_size: int) -> dict:
    return {
        "format": FORMAT, "key": settings.key(), "settings": asdict(settings),
        "vocab_size": vocab_size, "token_dtype": np.dtype(token_dtype(vocab_size)).name,
        "split": {"eval_fraction": EVAL_FRACTION, "rule": SPLIT_RULE},
        "examples": 0, "response_tokens": 0, "shards": [],
    }


def read_manifest(folder) -> dict | None:
    path = Path(folder) / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def append_shard(folder, settings: Settings, examples: list[Example], vocab_size: int) -> dict:
    """Add one shard of examples to the store: the shard first, then the manifest that lists it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(folder) or new_manifest(settings, vocab_size)
    if manifest["settings"] != asdict(settings) or manifest["vocab_size"] != vocab_size:
        raise ValueError(f"{folder} holds data made under {manifest['settings']}, not {asdict(settings)}.")
    data = encode_shard(examples, vocab_size)
    name = f"shard-{len(manifest['shards']):05d}.safetensors"
    write_atomic(folder / name, data)  # 1. the shard, complete, under its final name
    responses = sum(len(ex.input_ids) - ex.num_prompt_tokens for ex in examples)
    manifest["shards"].append({"file": name, "examples": len(examples), "response_tokens": responses,
                               "sha256": hashlib.sha256(data).hexdigest()})
    manifest["examples"] += len(examples)
    manifest["response_tokens"] += responses
    write_atomic(folder / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())  # 2. now it counts
    return manifest


def load_corpus(folder) -> list[Example]:
    """Every example the manifest lists, in order; a shard whose bytes changed is an error."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return []
    examples = []
    for shard in manifest["shards"]:
        data = (folder / shard["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != shard["sha256"]:
            raise ValueError(f"{folder / shard['file']} does not match its checksum in the manifest: it is damaged.")
        examples += decode_shard(data)
    return examples


def load_split(folder) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples, by the split rule the manifest records."""
    manifest = read_manifest(folder)
    fraction = manifest["split"]["eval_fraction"] if manifest else EVAL_FRACTION
    return split_examples(load_corpus(folder), eval_fraction=fraction)


@lru_cache(maxsize=8)
def corpus_vocabulary(target_name: str, size: int, vocab_size: int, always: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The draft vocabulary of `size` tokens counted in the committed corpus's training split (datasets/)."""
    from ..vocab import choose_draft_vocab

    folder = store_dir(Settings(target=target_name))
    train, _ = load_split(folder)
    if not train:
        raise ValueError(f"No corpus for {target_name} in {folder}: a draft vocabulary is counted there. "
                         "Build it (python -m specdec_learn.train.corpus build) or drop --draft-vocab.")
    return tuple(choose_draft_vocab(train, size, vocab_size, always).tolist())


def done_ids(folder) -> set[str]:
    """The ids of every prompt already answered in this store."""
    return {ex.id for ex in load_corpus(folder)}


# --- prompts: the files in datasets/<target>/prompts/ ----------------------------------------------


def freeze_templated(target: str, root=None) -> list[Prompt]:
    """prompts.training_prompts(), written once to prompts/templated.jsonl, so a clone answers the same ones."""
    path = target_dir(target, root) / "prompts" / "templated.jsonl"
    if not path.exists():
        magpie.write_prompts(path, training_prompts())
    return magpie.read_prompts(path)


def corpus_prompts(target: str, root=None, seed: int = 0) -> list[Prompt]:
    """Every prompt file's prompts, in one seeded mixed order (any prefix of the run covers every kind)."""
    folder = target_dir(target, root) / "prompts"
    prompts = [p for path in sorted(folder.glob("*.jsonl")) for p in magpie.read_prompts(path)]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"Two prompts in {folder} share an id.")
    random.Random(seed).shuffle(prompts)
    return prompts


# --- answering: prompts -> shards ----------------------------------------------------------------


def fill(folder, settings: Settings, prompts: list[Prompt], encode, generate, vocab_size: int,
         shard_size: int = 512, goal: int | None = None, log=print) -> dict:
    """Answer every prompt the store does not hold yet, shard_size at a time; -> the manifest.

    encode: text -> prompt ids (the chat template); generate: [prompt ids] -> [response ids].
    goal: how many prompts the whole corpus will have (for the log's time left; default: these).
    """
    check_no_benchmark_prompts(prompts)
    folder = Path(folder)
    manifest = read_manifest(folder) or new_manifest(settings, vocab_size)
    if folder.exists():
        remove_leftovers(folder, manifest)
    done = done_ids(folder)
    todo = [p for p in prompts if p.id not in done]
    log(f"corpus: {len(done)} prompts answered, {len(todo)} to go, in {folder}")
    for start in range(0, len(todo), shard_size):
        chunk = todo[start : start + shard_size]
        t0 = time.perf_counter()
        prompt_ids = [encode(p.text) for p in chunk]
        responses = generate(prompt_ids)
        examples = [Example(p.id, ids + r, [False] * len(ids) + [True] * len(r), settings.variant)
                    for p, ids, r in zip(chunk, prompt_ids, responses)]
        manifest = append_shard(folder, settings, examples, vocab_size)
        left = max(goal or len(prompts), len(prompts)) - manifest["examples"]
        log(progress_line(manifest, left, examples, time.perf_counter() - t0))
    return manifest


def progress_line(manifest: dict, prompts_left: int, examples: list[Example], seconds: float) -> str:
    """One line of the log: totals, this shard's rate, and the time left at that rate."""
    tokens = sum(len(ex.input_ids) - ex.num_prompt_tokens for ex in examples)
    rate = tokens / seconds if seconds > 0 else float("nan")
    mean = manifest["response_tokens"] / max(1, manifest["examples"])
    eta_h = prompts_left * mean / rate / 3600 if rate > 0 else float("nan")
    return (f"{time.strftime('%Y-%m-%d %H:%M:%S')} shard {len(manifest['shards']) - 1}: "
            f"{manifest['examples']} examples, {manifest['response_tokens']} response tokens; "
            f"this shard {tokens} tokens in {seconds:.0f} s = {rate:.0f} tok/s; "
            f"{prompts_left} prompts left, ETA {eta_h:.1f} h")


# --- the job ---------------------------------------------------------------------------------------


def open_engine(target: str, dtype: str, seed: int, batch_size: int):
    """A vLLM engine for plain decoding, at most batch_size sequences at a time (continuous batching)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "3")  # GiB: 256 sequences of ~350 tokens need ~2 GiB in bf16
    # vLLM gives a model step 300 s (and a start 600 s) of wall time; a job paused with SIGSTOP for longer
    # wakes up past that deadline and its engine dies. Paused is not stuck: allow a week.
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(7 * 24 * 3600))
    os.environ.setdefault("VLLM_ENGINE_READY_TIMEOUT_S", str(7 * 24 * 3600))
    from ..vllm_backend import VllmEngine

    return VllmEngine(target, method="ar", dtype=dtype, seed=seed, max_num_seqs=batch_size)


def vllm_generate(engine, max_new_tokens: int, temperature: float):
    """[prompt ids] -> [response ids] through the engine (greedy, or sampled from its seeded stream)."""
    from ..sampling import Sampling

    def generate(prompt_ids: list[list[int]]) -> list[list[int]]:
        generations, _ = engine.generate_batch(prompt_ids, max_new_tokens, Sampling(temperature=temperature), None)
        return [g.tokens for g in generations]

    return generate


def log(line: str) -> None:
    print(line, flush=True)  # the job's stdout is its log file


def build(args) -> int:
    """The whole job: Magpie prompts until there are enough, then every prompt's answer. Resumable."""
    lock = job.hold_lock("corpus")  # held until this process ends
    if lock is None:
        print("corpus: another build holds the lock (see `status`); not starting a second one.", flush=True)
        return 1
    settings = Settings(args.target, args.max_new_tokens, args.temperature, args.seed, f"vllm-{args.dtype}")
    path = target_dir(args.target, args.root) / "prompts" / "magpie.jsonl"
    # Magpie samples come from the engine's seeded stream, which restarts with the engine: a rerun seeded as
    # the last one would sample the requests it already kept, find nothing new and stop as "saturated".
    # Offsetting the seed by the requests kept so far continues the stream instead. Greedy
    # answers do not depend on it.
    stream_seed = args.seed + len(magpie.read_prompts(path))
    engine = open_engine(args.target, args.dtype, stream_seed, args.batch_size)
    try:
        templated = freeze_templated(args.target, args.root)
        generate = vllm_generate(engine, args.max_new_tokens, args.temperature)
        held_out = bench_texts()
        requests, saturated = magpie.read_prompts(path), False
        while True:  # prompts and answers grow together: a stop at any point leaves both
            prompts = corpus_prompts(args.target, args.root, seed=args.seed)
            log(f"corpus: {len(prompts)} prompts ({len(templated)} templated, {len(requests)} Magpie)")
            manifest = fill(store_dir(settings, args.root), settings, prompts, engine.encode, generate,
                            vocab_size=len(engine.tokenizer), shard_size=args.shard_size,
                            goal=len(templated) + args.magpie, log=log)
            if len(requests) >= args.magpie or saturated:
                break
            requests, saturated = magpie.grow_prompt_file(engine, path, args.magpie, templated, held_out,
                                                          args.magpie_round, args.rounds_per_cycle, log)
        log(f"corpus: done, {manifest['examples']} examples, {manifest['response_tokens']} response tokens")
    finally:
        engine.close()
    return 0


def start(args, argv: list[str]) -> int:
    """Start `build` in the background (job.py: its own session, niced, from a snapshot of the code)."""
    root = ["--root", str(Path(args.root).resolve())]
    return job.start("corpus", "corpus", ["build", *root, *argv],
                     keep=("specdec_learn/train/corpus.py", "specdec_learn/train/magpie.py"))


def status(args) -> int:
    """Where the corpus stands: prompts, examples, tokens, and whether the job is running."""
    settings = Settings(args.target, args.max_new_tokens, args.temperature, args.seed, f"vllm-{args.dtype}")
    folder = store_dir(settings, args.root)
    manifest = read_manifest(folder) or new_manifest(settings, 0)
    prompts = corpus_prompts(args.target, args.root)
    size = sum(p.stat().st_size for p in target_dir(args.target, args.root).rglob("*") if p.is_file())
    pid = job.running_pid("corpus")
    print(f"{folder}: {manifest['examples']} / {len(prompts)} prompts answered, "
          f"{manifest['response_tokens']} response tokens, {len(manifest['shards'])} shards; "
          f"{size / 1e6:.1f} MB under {target_dir(args.target, args.root)}")
    print(f"job: {'running, process group ' + str(pid) if pid else 'not running'}")
    print("last:", job.last_line("corpus", (" shard ", "magpie:")))
    return 0


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and all its children alive now (vLLM's engine and worker)."""
    import psutil

    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def measure(args) -> int:
    """Output tokens/s of greedy vLLM decoding at each batch size (max concurrent sequences).

    Two rates: per second of wall time, and per CPU-second the engine used; on
    a machine shared with other work the second is the steadier measure of
    what a batch size costs.
    """
    from ..sampling import GREEDY

    texts = [p.text for p in training_prompts()]
    print(f"{'batch':>6} {'prompts':>8} {'tokens':>8} {'seconds':>8} {'tok/s':>8} {'CPU-s':>8} {'tok/CPU-s':>10}", flush=True)
    for batch in args.batch_sizes:
        with open_engine(args.target, args.dtype, args.seed, batch) as engine:
            n = batch  # one full batch: every slot busy from the first step to the last
            ids = [engine.encode(t) for t in texts[:n]]
            engine.generate_batch(ids[:4], 8, GREEDY, None)  # warm-up
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            _, call = engine.generate_batch(ids, args.max_new_tokens, GREEDY, None)
            seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
            tokens = call.num_output_tokens
            print(f"{batch:>6} {n:>8} {tokens:>8} {seconds:>8.1f} {tokens / seconds:>8.1f} {cpu:>8.1f} "
                  f"{tokens / cpu:>10.1f}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m specdec_learn.train.corpus", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["start", "build", "status", "measure"],
                        help="start = build in the background; build = in the foreground; status; measure = batch sizes")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--root", default=str(DATASETS), help="the datasets folder (default: the repository's)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256,
                        help="vLLM's max concurrent sequences (256: the most tokens per CPU-second measured on 2 cores)")
    parser.add_argument("--shard-size", type=int, default=512, help="prompts per shard (per vLLM call)")
    parser.add_argument("--magpie", type=int, default=22_000, help="Magpie requests to have before answering")
    parser.add_argument("--magpie-round", type=int, default=2048, help="Magpie samples per round")
    parser.add_argument("--rounds-per-cycle", type=int, default=1, help="Magpie rounds before answering the new prompts")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[16, 32, 64, 128, 256])
    args = parser.parse_args(argv)
    os.environ.setdefault("SPECDEC_CACHE", str(REPO / ".cache"))  # the Makefile's cache, where the model lives
    if args.command == "start":
        return start(args, [a for a in argv if a != "start"])
    return {"build": build, "status": status, "measure": measure}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
