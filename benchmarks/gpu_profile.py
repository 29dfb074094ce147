"""The GPU profile, measured: the published pairs' real shapes on a GPU, in one prepared script (issue 46).

    python benchmarks/gpu_profile.py                  # on a CUDA or ROCm GPU: published sizes, inside --budget-s
    python benchmarks/gpu_profile.py --tiny           # anywhere: the same code on miniatures (CI runs it on a CPU)
    make gpu-profile                                  # the first line, through the Makefile

Three sections, one JSON file:

1. **Costs at published sizes.** Each target in ``benchmarks/gpu_configs/`` (the published configuration's
   shape fields, with its source) is built with random weights on the GPU (on the meta device, then
   materialized and initialised there: no 16 GB of weights ever cross the PCIe bus), in bf16. Then: the
   target's step time (``Target.verify``) over 1, 2, 4, ..., 64 rows after a context, as a chain and as a
   token tree (its tree attention mask); and each drafter's round at its published size, timed in the
   loop's own pieces (``decode.propose``, ``Target.verify``, ``verify.accept``, ``Target.commit``,
   ``Drafter.observe``), as ``generate`` runs them. CUDA events, warm-up, medians.
2. **Lossless on the device.** Tiny random targets of each family (Llama, Qwen3, Gemma 3 and Gemma 4 with
   sliding windows, hybrid Qwen3.5), every drafter written in its published format by the library's
   writers and read back by its loaders, greedy output equal to plain decoding in fp32, chains and trees.
3. **The cost model.** The measured costs in plain decoding steps, the acceptance length each drafter
   needs to break even, and, where a published acceptance length exists
   (``benchmarks/gpu_configs/published.json``, each with its source), the speedup
   ``limits.round_speedup`` predicts from it.

Random weights give timings, not acceptance: a random drafter's drafts are almost never accepted, so
nothing here measures how good a drafter is; the JSON says so beside every figure that could be
mistaken for it.

The script needs only torch, transformers (>= 5.19, the library's floor) and this repository: it imports
``specdec_learn`` from the repository root when the package is not installed, and reads nothing from the
network. Without a GPU it runs the tiny version (``--tiny`` forces it on a GPU too), which is what
``tests/test_gpu_profile.py`` runs in CI so that this script cannot rot.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "benchmarks" / "gpu_configs"
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`: the package is the repo's
    sys.path.insert(0, str(ROOT))

if __name__ == "__main__":  # nothing from the network: a GPU machine may have none (set before the hub is imported)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402

MIN_TRANSFORMERS = (5, 19)  # pyproject.toml's floor
ROWS = (1, 2, 4, 8, 16, 32, 64)  # verify rows: 1 is a plain decoding step
TREE_BRANCH = 4  # the tree timed at n rows: the root's 4 children, then 4 children each, breadth first
SCHEMA = 1
RANDOM_WEIGHTS = ("Random weights: every figure here is a TIMING (what a step or a round costs at the published "
                  "shapes), not an acceptance measurement. A random drafter's drafts are almost never accepted; "
                  "how many tokens a round yields must come from a published run of the real checkpoints "
                  "(cost_model.published).")


class InputError(Exception):
    """A bad input: the message is one line naming the input and what to do."""


# -- arguments -------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpu_profile.py",
        description="Step and round costs of the published pairs at their real shapes (random weights), "
                    "lossless checks of every drafter in its published format, and the cost model's predictions.")
    p.add_argument("--tiny", action="store_true",
                   help="miniatures of every model instead of the published sizes (the default without a GPU)")
    p.add_argument("--device", default=None, help="cuda (CUDA and ROCm alike) or cpu; default: cuda when there is one")
    p.add_argument("--out", default=None, help="the JSON file to write (default: benchmarks/results/"
                   "gpu_profile_<device>.json, or results/gpu_profile_tiny_<device>.json for a tiny run)")
    p.add_argument("--configs", default=str(CONFIGS), help="folder of model configs (default: benchmarks/gpu_configs)")
    p.add_argument("--models", default=None,
                   help="comma-separated config names to run (file names without .json), default: all of them")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="wall-clock budget in seconds; measurements that would start past it are skipped and "
                        "recorded as skipped (default 420: an H100 run must end inside 8 minutes)")
    p.add_argument("--context", type=int, default=None,
                   help="tokens in the cache before each timed step (default 1024; tiny: 32)")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="verify rows to time (default 1,2,4,8,16,32,64)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before each measurement (default 3)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (default 10; tiny: 3)")
    p.add_argument("--skip-lossless", action="store_true", help="leave out section 2 (the lossless checks)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def check_args(args) -> None:
    """Refuse bad inputs with one line that names the input and says what to do."""
    if not (isinstance(args.budget_s, float) and math.isfinite(args.budget_s) and args.budget_s > 0):
        raise InputError(f"--budget-s must be a positive number of seconds, got {args.budget_s!r}: "
                         "e.g. --budget-s 420.")
    for name in ("context", "repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name} must be a whole number >= 1, got {value}: e.g. --{name} "
                             f"{1024 if name == 'context' else 10}.")
    if args.warmup < 0:
        raise InputError(f"--warmup must be a whole number >= 0, got {args.warmup}: e.g. --warmup 3.")
    try:
        rows = tuple(int(r) for r in args.rows.split(","))
    except ValueError:
        rows = ()
    if not rows or min(rows) < 1 or max(rows) > 256:
        raise InputError(f"--rows takes whole numbers from 1 to 256 separated by commas, got {args.rows!r}: "
                         "e.g. --rows 1,2,4,8,16,32,64.")
    args.rows = rows
    if args.device is not None and args.device.split(":")[0] not in ("cpu", "cuda"):
        raise InputError(f"--device must be cpu or cuda (ROCm GPUs are 'cuda' in PyTorch too), got {args.device!r}.")
    if args.device is not None and args.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {args.device}: torch {torch.__version__} sees no GPU here "
                         "(torch.cuda.is_available() is False): drop --device to run the tiny version on the CPU.")
    folder = Path(args.configs)
    if not folder.is_dir():
        raise InputError(f"--configs {args.configs}: no such folder; point it at benchmarks/gpu_configs.")
    if args.out is not None:
        out = Path(args.out)
        if out.is_dir():
            raise InputError(f"--out {args.out} is a folder: give a file name, e.g. --out {out / 'gpu_profile.json'}.")
        if not out.parent.is_dir():
            raise InputError(f"--out {args.out}: the folder {out.parent} does not exist; create it or pick another.")


def check_transformers() -> None:
    """The library's floor, and the classes this script builds; refused in one line with what to do."""
    found = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    if found < MIN_TRANSFORMERS:
        raise InputError(
            f"transformers {transformers.__version__} is installed; specdec_learn needs >= "
            f"{'.'.join(map(str, MIN_TRANSFORMERS))}: install the wheel carried with the repository "
            "(docs/GPU.md, 'The GPU profile'), e.g. pip install --no-deps wheels/transformers-*.whl.")


# -- configs -----------------------------------------------------------------------------------------


REQUIRED = ("name", "source", "model_class", "config_class", "config")


def read_json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{file}: cannot be read ({err.__class__.__name__}): check the file exists and is UTF-8.")
    except json.JSONDecodeError as err:
        raise InputError(f"{file}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}): fix the file.")
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected a JSON object at the top level, got {type(data).__name__}.")
    return data


def load_model_configs(folder: Path, names: str | None) -> list[tuple[Path, dict]]:
    """The target configs in `folder` (every *.json with a model_class and drafters or a family), checked."""
    folder = Path(folder)
    files = sorted(f for f in folder.glob("*.json") if f.name != "published.json")
    configs = []
    for file in files:
        spec = read_json(file)
        if "family" not in spec:  # a drafter's own config (the Gemma 4 assistant), read through its target
            continue
        missing = [k for k in REQUIRED if k not in spec]
        if missing:
            raise InputError(f"{file}: missing {', '.join(missing)}: every model config names its source and "
                             "its transformers classes (see benchmarks/gpu_configs/qwen3-8b.json).")
        for d in spec.get("drafters", []):
            if "method" not in d or "published" not in d:
                raise InputError(f"{file}: a drafter entry lacks 'method' or 'published': {json.dumps(d)[:80]}.")
            if "config_file" in d and not (folder / d["config_file"]).is_file():
                raise InputError(f"{file}: drafter config_file {d['config_file']} is not in {folder}.")
        configs.append((file, spec))
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        known = {f.stem: (f, s) for f, s in configs}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise InputError(f"--models {','.join(unknown)}: no such config in {folder}; "
                             f"known: {', '.join(sorted(known))}.")
        configs = [known[n] for n in wanted]
    if not configs:
        raise InputError(f"--configs {folder}: no model config (*.json with a 'family') in it.")
    return configs


def merged(base: dict, overrides: dict | None) -> dict:
    """`base` with `overrides` laid over it, nested dicts merged key by key."""
    out = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "rope_parameters":
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# -- building random-weight models on the device -------------------------------------------------------


def hf_class(name: str):
    """A transformers class by name, or None when the installed release has no such class."""
    return getattr(transformers, name, None)


def build_hf(model_class, config, device: torch.device, dtype: torch.dtype):
    """A transformers model with random weights, built on the meta device and initialised on `device`.

    On the meta device no memory is allocated; `to_empty` then gives every parameter and buffer
    uninitialised storage on the device, and transformers' own `initialize_weights` (the same pass
    `from_pretrained` runs on weights a checkpoint lacks) fills them there: random matrices, unit norms,
    and the buffers computed from the config (RoPE frequencies, embedding scales). Tied weights are tied
    again, since `to_empty` gives each module its own storage.
    """
    with torch.device("meta"):
        model = model_class._from_config(config, dtype=dtype)
    model.to_empty(device=device)
    for module in model.modules():  # nothing counts as initialised: the storage is garbage
        module.__dict__.pop("_is_hf_initialized", None)
    model.initialize_weights()
    model.tie_weights()
    return model.eval()


def count_params(*modules) -> tuple[int, int]:
    """(parameters, bytes) of `modules`, each tensor once."""
    unique = {p.data_ptr(): p for m in modules for p in m.parameters()}
    return sum(p.numel() for p in unique.values()), sum(p.numel() * p.element_size() for p in unique.values())


def build_target(spec: dict, tiny: bool, device, dtype):
    """(Target, config fields) for a model config; raises LookupError when transformers lacks its classes."""
    import specdec_learn as sd

    model_class, config_class = hf_class(spec["model_class"]), hf_class(spec["config_class"])
    if model_class is None or config_class is None:
        missing = spec["model_class"] if model_class is None else spec["config_class"]
        raise LookupError(f"transformers {transformers.__version__} has no {missing}")
    fields = merged(spec["config"], spec.get("tiny") if tiny else None)
    model = build_hf(model_class, config_class(**fields), device, dtype)
    target = sd.Target(model, None, name=spec["name"] + (" (tiny)" if tiny else ""))
    target.eos_ids = set()  # random weights: never stop early on a stray end-of-text token
    return target, fields


def build_drafter(spec: dict, target, tiny: bool, device, dtype, folder: Path):
    """A random-weight drafter of a published shape, built on `device` -> (drafter, the modules it owns, fields)."""
    from specdec_learn.drafters.dflash import DFlashDrafter, DFlashModel, draft_config
    from specdec_learn.drafters.dspark import DSparkDrafter, DSparkModel, dspark_config
    from specdec_learn.drafters.eagle3 import Eagle3Drafter, Eagle3Model
    from specdec_learn.drafters.gemma4_mtp import Gemma4AssistantDrafter
    from specdec_learn.drafters.mtp import MTPDrafter, random_mtp_head
    from specdec_learn.formats.speculators import eagle3_config_for

    s = merged(spec, spec.get("tiny") if tiny else None)
    s.pop("tiny", None)
    method = s["method"]
    torch.manual_seed(0)
    # The library's drafter networks are plain modules: built under the device, their parameters are
    # created and initialised there (torch's default init), as the meta route does for transformers'.
    with torch.device(device):
        if method == "eagle3":
            cfg = eagle3_config_for(target, s["draft_vocab_size"], tuple(s["taps"]))
            cfg.norm_before_residual = bool(s.get("norm_before_residual", False))
            model = Eagle3Model(cfg)
            model.set_vocab(torch.arange(s["draft_vocab_size"]))  # the first V_d ids: any V_d ids cost the same
            model = model.to(dtype=dtype).eval()
            return Eagle3Drafter(model, target), [model], s  # the drafter borrows the target's embedding
        if method in ("dflash", "dspark"):
            ids = s["target_layer_ids"]
            common = dict(num_layers=s["num_layers"], block_size=s["block_size"], num_taps=len(ids),
                          mask_token_id=s["mask_token_id"], target_layer_ids=ids)
            if method == "dflash":
                model = DFlashModel(draft_config(target, **common)).to(dtype=dtype)
                return DFlashDrafter(model), [model], s
            model = DSparkModel(dspark_config(target, markov_rank=s["markov_rank"], **common),
                                own_embeddings=bool(s.get("own_embeddings", False))).to(dtype=dtype)
            return DSparkDrafter(model), [model], s
        if method == "mtp":
            head = random_mtp_head(target, num_layers=s.get("num_layers", 1))
            return MTPDrafter(head, target), [head], s
    if method == "gemma4_mtp":
        cspec = read_json(folder / s["config_file"])
        model_class, config_class = hf_class(cspec["model_class"]), hf_class(cspec["config_class"])
        if model_class is None or config_class is None:
            raise LookupError(f"transformers {transformers.__version__} has no {cspec['model_class']}")
        fields = merged(cspec["config"], cspec.get("tiny") if tiny else None)
        assistant = build_hf(model_class, config_class(**fields), device, dtype)
        if assistant.config.use_ordered_embeddings:  # a real checkpoint ships a permutation of the vocabulary
            vocab = assistant.masked_embedding.token_ordering.numel()
            assistant.masked_embedding.token_ordering.copy_(torch.randperm(vocab, device=device))
        s["config_source"] = cspec["source"]
        return Gemma4AssistantDrafter(assistant, target), [assistant], s
    raise InputError(f"drafter method {method!r} in a model config is not one this script builds "
                     "(eagle3, dflash, dspark, mtp, gemma4_mtp).")


# -- timing -----------------------------------------------------------------------------------------------


class Clock:
    """Marks on the device's timeline (CUDA events) or, on a CPU, the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.name = "CUDA events" if self.cuda else "time.perf_counter"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end)
        return (end - start) * 1e3


def summary(times: list[float], warmup: int) -> dict:
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "repeats": len(times), "warmup": warmup}


def timed(clock: Clock, run, reset, warmup: int, repeats: int) -> dict:
    """Median of `repeats` runs after `warmup` untimed ones; `reset` (untimed) undoes each run."""
    for _ in range(warmup):
        run()
        reset()
    times = []
    for _ in range(repeats):
        start = clock.mark()
        run()
        end = clock.mark()
        times.append(clock.ms(start, end))
        reset()
    return summary(times, warmup)


def undo(state, keep: int) -> None:
    """Take a timed verify back out of the cache: the linear layers' snapshot restored, attention layers cropped."""
    from specdec_learn.kv_cache import crop_cache

    if state.rollback is not None:  # a hybrid target snapshots its linear state in verify (target.py)
        state.rollback.before.restore(state.cache)
        state.rollback = None
    crop_cache(state.cache, keep)


def tree_parents(nodes: int, branch: int = TREE_BRANCH) -> list[int]:
    """A breadth-first tree of `nodes` drafts: the root's `branch` children, then `branch` children each."""
    return [-1 if i < branch else (i - branch) // branch for i in range(nodes)]


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()  # past the usual special ids


def time_target(target, ctx: int, rows, clock, warmup, repeats, budget, seed) -> dict:
    """Target.verify over n rows after `ctx` cached tokens, as a chain and as a tree, for each n in `rows`."""
    state, _ = target.prefill(random_ids(ctx + 1, target.vocab_size, seed))
    keep = state.num_cached
    drafts = random_ids(max(rows), target.vocab_size, seed + 1)
    out = {"context": ctx, "chain": [], "tree": [], "tree_shape": f"breadth first, {TREE_BRANCH} children a node"}
    if target.mixers:
        out["note"] = ("a hybrid target's verify also copies its linear-attention state, for commit to roll back "
                       "(Target.verify): a cost the readable loop pays and vLLM's kernels do not")
    if not target.can_verify_tree:
        out["tree"] = None
        out["tree_skipped"] = ("sliding-window or linear-attention layers verify chains only "
                               "(Target.can_verify_tree is False)")
    for n in rows:
        for shape in ("chain", "tree"):
            if out[shape] is None:
                continue
            if not budget.allows(f"{target.name} verify {shape} {n} rows"):
                continue
            parents = tree_parents(n - 1) if shape == "tree" else None
            result = timed(clock, lambda: target.verify(state, drafts[: n - 1], parents=parents),
                           lambda: undo(state, keep), warmup, repeats)
            out[shape].append({"rows": n, **result})
    return out


def time_rounds(target, drafter, k: int, tree, ctx: int, clock, warmup, repeats, seed) -> dict:
    """The drafter's round in the loop's own pieces, as decode.generate runs them (see its docstring).

    draft = propose + commit + observe (decode.py's draft_time), verify = Target.verify + accept.
    """
    from specdec_learn.decode import propose
    from specdec_learn.sampling import GREEDY
    from specdec_learn.verify import accept

    generator = torch.Generator().manual_seed(seed)
    state, out = target.prefill(random_ids(ctx + 1, target.vocab_size, seed), drafter.taps)
    drafter.start(target, state, out.hidden)
    drafts, verifies, drafted, accepted = [], [], [], []
    for r in range(warmup + repeats):
        t0 = clock.mark()
        proposal = propose(drafter, state, k, tree, 10**9, GREEDY, generator)
        t1 = clock.mark()
        out = target.verify(state, proposal.tokens, drafter.taps, proposal.parents)
        path, nxt = accept(proposal.tokens, proposal.q, out.logits, GREEDY, generator, proposal.parents)
        t2 = clock.mark()
        tree_path = path if proposal.parents is not None else None
        target.commit(state, [proposal.tokens[i] for i in path] + [nxt], tree_path)
        kept = slice(0, len(path) + 1) if tree_path is None else [0] + [i + 1 for i in path]
        drafter.observe(state, len(path), {tap: h[kept] for tap, h in out.hidden.items()})
        t3 = clock.mark()
        if r >= warmup:
            drafts.append(clock.ms(t0, t1) + clock.ms(t2, t3))
            verifies.append(clock.ms(t1, t2))
            drafted.append(len(proposal.tokens))
            accepted.append(len(path))
    draft, verify = summary(drafts, warmup), summary(verifies, warmup)
    return {"k": k, "shape": "chain" if tree is None else "tree",
            "tree": None if tree is None else {"nodes": tree.nodes, "depth": tree.depth, "branch": tree.branch},
            "context": ctx, "draft_median_ms": draft["median_ms"], "draft_min_ms": draft["min_ms"],
            "verify_median_ms": verify["median_ms"], "verify_min_ms": verify["min_ms"],
            "rounds": repeats, "warmup": warmup, "drafted_per_round": statistics.mean(drafted),
            "accepted_per_round": statistics.mean(accepted),
            "accepted_note": "random weights: acceptance here says nothing about the real checkpoint"}


class Budget:
    """The wall-clock budget: a measurement starts only while time is left; what is skipped is recorded."""

    def __init__(self, seconds: float, reserve: float):
        self.start = time.perf_counter()
        self.seconds, self.reserve = seconds, reserve
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, what: str, need: float = 0.0) -> bool:
        if self.elapsed() + need + self.reserve <= self.seconds:
            return True
        self.skipped.append(what)
        return False


def failure(err: BaseException) -> str:
    """An exception as one line for the JSON: its class, message and the line that raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{err.__class__.__name__}: {str(err).splitlines()[0][:240] if str(err) else ''}{where}"


def log(budget: Budget, message: str) -> None:
    print(f"[{budget.elapsed():6.1f}s] {message}", flush=True)


def free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def profile_model(file: Path, spec: dict, args, device, dtype, clock, budget) -> dict:
    """Section 1 for one model config: its target's steps and its drafters' rounds."""
    entry = {"config_file": str(file.relative_to(ROOT)) if file.is_relative_to(ROOT) else str(file),
             "name": spec["name"], "hub_id": spec.get("hub_id"), "source": spec["source"],
             "model_class": spec["model_class"], "size": "tiny" if args.tiny else "published", "status": "ok"}
    if not budget.allows(f"{spec['name']}: the whole model", need=5.0):
        return {**entry, "status": "skipped", "reason": "the time budget ran out before it started"}
    t0 = time.perf_counter()
    try:
        target, fields = build_target(spec, args.tiny, device, dtype)
    except LookupError as err:
        log(budget, f"{spec['name']}: skipped ({err})")
        return {**entry, "status": "skipped", "reason": f"{err}: install a release that has it (docs/GPU.md)"}
    if device.type == "cuda":
        torch.cuda.synchronize()
    params, nbytes = count_params(target.model)
    entry.update(build_s=time.perf_counter() - t0, params=params, weight_bytes=nbytes, dtype=str(dtype)[6:],
                 num_layers=target.num_layers, hidden_size=target.hidden_size, vocab_size=target.vocab_size,
                 layer_types=sorted(set(fields.get("layer_types") or ["full_attention"])))
    log(budget, f"{spec['name']}: built, {params / 1e9:.2f}B parameters in {entry['build_s']:.1f} s")
    entry["target_steps"] = time_target(target, args.context, args.rows, clock, args.warmup, args.repeats,
                                        budget, args.seed)
    chain = {m["rows"]: m["median_ms"] for m in entry["target_steps"]["chain"]}
    log(budget, f"{spec['name']}: verify " + ", ".join(f"{n} rows {ms:.2f} ms" for n, ms in chain.items()))
    entry["drafters"] = []
    for dspec in spec.get("drafters", []):
        entry["drafters"].append(profile_drafter(dspec, target, file.parent, args, device, dtype, clock, budget))
        free(device)
    if device.type == "cuda":
        entry["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    del target
    free(device)
    return entry


def profile_drafter(dspec, target, folder, args, device, dtype, clock, budget) -> dict:
    from specdec_learn.tree import TreeSpec

    d = {"method": dspec["method"], "published": dspec["published"], "source": dspec.get("source"),
         "status": "ok", "rounds": []}
    if not budget.allows(f"{target.name} + {dspec['method']}: the drafter", need=2.0):
        return {**d, "status": "skipped", "reason": "the time budget ran out before it started"}
    try:
        t0 = time.perf_counter()
        drafter, owned, s = build_drafter(dspec, target, args.tiny, device, dtype, folder)
        d["params"], d["weight_bytes"] = count_params(*owned)
        d["build_s"] = time.perf_counter() - t0
        d["shape"] = {k: v for k, v in s.items() if k not in ("method", "published", "source", "ks", "tree")}
        if "config_source" in s:
            d["source"] = s.pop("config_source")
            d["shape"].pop("config_source", None)
    except (LookupError, ValueError) as err:  # a class missing, or the library refusing this pairing
        log(budget, f"{target.name} + {dspec['method']}: skipped ({err})")
        return {**d, "status": "skipped", "reason": str(err)}
    except Exception as err:  # noqa: BLE001 - recorded, and the other drafters still run
        log(budget, f"{target.name} + {dspec['method']}: error ({failure(err)})")
        return {**d, "status": "error", "reason": failure(err)}
    shapes = [(k, None) for k in dspec.get("ks", [1])]
    if dspec.get("tree") and drafter.can_branch and target.can_verify_tree:
        shapes.append((0, TreeSpec(**dspec["tree"])))
    for k, tree in shapes:
        label = f"{target.name} + {dspec['method']} " + (f"k={k}" if tree is None else f"tree {tree.nodes} nodes")
        if not budget.allows(label):
            continue
        try:
            d["rounds"].append(time_rounds(target, drafter, k, tree, args.context, clock, args.warmup,
                                           args.repeats, args.seed))
        except Exception as err:  # noqa: BLE001 - recorded beside the shapes that ran
            d["rounds"].append({"k": k, "shape": "chain" if tree is None else "tree", "error": failure(err)})
            log(budget, f"{label}: error {failure(err)}")
            free(device)
            continue
        r = d["rounds"][-1]
        log(budget, f"{label}: draft {r['draft_median_ms']:.2f} ms, verify {r['verify_median_ms']:.2f} ms a round")
    d["params_note"] = "the drafter's own weights (a shared embedding or LM head is the target's, not counted)"
    return d


# -- section 2: lossless on the device -----------------------------------------------------------------------

LOSSLESS_PROMPT = [5, 9, 14, 3, 27, 8, 5, 9, 14, 3, 27, 8, 40, 41, 5, 9, 14, 3, 27, 8, 12, 30, 5, 9]  # repeats
LOSSLESS_NEW = 24
WINDOW = 8  # the tiny sliding-window targets' window: the prompt alone is three windows long


def remember(model):
    """Qwen3.5's linear layers made to remember (tests/test_hybrid.py's reason: at random init they forget at once)."""
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.A_log.fill_(math.log(0.05))
                layer.linear_attn.out_proj.weight.mul_(20)
    return model


def tiny_family(family: str):
    """A tiny random target of each family the published pairs use (transformers' own classes), fp32, CPU."""
    T = transformers
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, eos_token_id=None, bos_token_id=1, pad_token_id=0)
    if family == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=4, **common))
    if family == "qwen3":
        return T.Qwen3ForCausalLM(T.Qwen3Config(num_hidden_layers=4, head_dim=8, **common))
    if family == "gemma3":
        return T.Gemma3ForCausalLM(T.Gemma3TextConfig(
            num_hidden_layers=4, head_dim=8, query_pre_attn_scalar=8, sliding_window=WINDOW,
            layer_types=["sliding_attention"] * 3 + ["full_attention"], **common))
    if family == "gemma4":  # sliding and full layers, K/V shared by the top layers, per-layer inputs, soft-capping
        return T.Gemma4ForCausalLM(T.Gemma4TextConfig(
            num_hidden_layers=6, head_dim=8, global_head_dim=16, sliding_window=WINDOW, num_kv_shared_layers=2,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, final_logit_softcapping=30.0, **common))
    if family == "qwen3_5":  # Qwen3.5's 3:1 linear / full attention
        return remember(T.Qwen3_5ForCausalLM(T.Qwen3_5TextConfig(
            num_hidden_layers=4, head_dim=8, layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, **{**common, "bos_token_id": None, "pad_token_id": None})))
    raise ValueError(family)


FAMILIES = {  # family: what it stands for among the published pairs
    "llama": "Llama (the EAGLE-3 / DFlash reference targets)",
    "qwen3": "Qwen3 (Qwen3-8B and its EAGLE-3, DFlash, DSpark)",
    "gemma3": "Gemma 3 (sliding window)",
    "gemma4": "Gemma 4 (sliding window, KV-shared layers, per-layer inputs: Gemma 4 E2B and its assistant)",
    "qwen3_5": "Qwen3.5 (hybrid linear attention: Qwen3.5 and its MTP layer)",
}


def published_drafters(target, work: Path, family: str) -> dict:
    """Every drafter, each written in its published format by the library's writer and read back by its loader.

    -> {name: (format, factory)}; a factory returns a fresh drafter (the same weights each time), or is
    ("skipped" | "error", reason) when the drafter could not be built for this target.
    """
    import specdec_learn as sd
    from specdec_learn.drafters.dflash import DFlashDrafter, DFlashModel, draft_config, load_dflash, save_dflash
    from specdec_learn.drafters.draft_model import DraftModelDrafter
    from specdec_learn.drafters.dspark import DSparkDrafter, DSparkModel, dspark_config, load_dspark, save_dspark
    from specdec_learn.drafters.eagle3 import Eagle3Drafter, load_eagle3, new_eagle3, save_eagle3
    from specdec_learn.drafters.gemma4_mtp import Gemma4AssistantDrafter, load_gemma4_assistant, random_assistant
    from specdec_learn.drafters.mtp import MTPDrafter, load_mtp, random_mtp_head, save_mtp
    from specdec_learn.formats.hf_assistant import write_assistant

    fp32, V = torch.float32, target.vocab_size
    out = {"ngram": ("none (no checkpoint)", lambda: sd.NgramDrafter()),
           "suffix": ("none (no checkpoint)", lambda: sd.SuffixDrafter())}

    def folder(name):
        return work / family / name

    def draft_model():
        torch.manual_seed(3)
        draft = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, eos_token_id=None, bos_token_id=1, pad_token_id=0))
        draft.save_pretrained(folder("draft_model"))  # read back as load_draft_model does, less the tokenizer
        return lambda: DraftModelDrafter(transformers.AutoModelForCausalLM.from_pretrained(
            folder("draft_model"), dtype=target.dtype).to(target.device).eval(), target)

    def eagle3():
        torch.manual_seed(0)
        save_eagle3(new_eagle3(target), folder("eagle3"), dtype=fp32)
        return lambda: Eagle3Drafter(load_eagle3(folder("eagle3"), target), target)

    def dflash():
        torch.manual_seed(0)
        save_dflash(DFlashModel(draft_config(target, block_size=16, mask_token_id=V - 1)), folder("dflash"), dtype=fp32)
        return lambda: DFlashDrafter(load_dflash(folder("dflash"), dtype=fp32))

    def dspark():
        torch.manual_seed(0)
        model = DSparkModel(dspark_config(target, block_size=7, markov_rank=16, mask_token_id=V - 1))
        save_dspark(model, folder("dspark"), format="deepspec", target=target, dtype=fp32)
        return lambda: DSparkDrafter(load_dspark(folder("dspark"), dtype=fp32))

    def mtp():  # native MTP lives in the target's own folder: its config.json, then mtp.safetensors beside it
        folder("mtp").mkdir(parents=True)
        target.model.config.to_json_file(str(folder("mtp") / "config.json"))
        save_mtp(random_mtp_head(target, num_layers=1), folder("mtp"), target)
        return lambda: MTPDrafter(load_mtp(folder("mtp"), target), target)

    def assistant():
        if family == "gemma4":  # the published layout: the target's own head sizes, centroid-masked logits
            assistant = gemma4_assistant_for(target)
        else:
            assistant = random_assistant(target, hidden_size=32, num_layers=2)
        write_assistant(assistant, folder("gemma4_mtp"))
        return lambda: Gemma4AssistantDrafter(load_gemma4_assistant(folder("gemma4_mtp"), target), target)

    for name, fmt, make in (("draft_model", "transformers folder", draft_model),
                            ("eagle3", "speculators eagle3", eagle3),
                            ("dflash", "z-lab DFlashDraftModel, block 16", dflash),
                            ("dspark", "DeepSpec Qwen3DSparkModel, block 7", dspark),
                            ("mtp", "Qwen3.5 mtp.* beside the target", mtp),
                            ("gemma4_mtp", "transformers gemma4_assistant", assistant)):
        try:
            out[name] = (fmt, make())
        except ValueError as err:  # the library refusing this pairing, with its reason
            out[name] = (fmt, ("skipped", failure(err)))
        except Exception as err:  # noqa: BLE001 - the library failing to build or write it for this target
            out[name] = (fmt, ("error", failure(err)))
    return out


def gemma4_assistant_for(target):
    """A Gemma 4 assistant in the published layout for a tiny Gemma 4 target (tests/test_gemma4_mtp.py's)."""
    T = transformers
    # its attention meets the target's K/V: tiny_family's 2 K/V heads of 8 (16 on the full-attention layers)
    text = T.Gemma4TextConfig(
        vocab_size=target.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=8, global_head_dim=16, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, final_logit_softcapping=30.0,
        eos_token_id=None, bos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    assistant = T.Gemma4AssistantForCausalLM(T.Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=target.hidden_size, use_ordered_embeddings=True, num_centroids=16,
        centroid_intermediate_top_k=4))
    assistant.masked_embedding.token_ordering.copy_(torch.randperm(target.vocab_size))
    return assistant.eval()


CHAIN_KS = {"dflash": (3, 15), "dspark": (3, 7)}  # block drafters: a short block and the whole block
LOSSLESS_TREE = {"nodes": 8, "depth": 3, "branch": 2}


def lossless(device, budget: Budget) -> dict:
    """Section 2: greedy output equal to plain decoding, in fp32 on `device`, for every family x drafter."""
    import specdec_learn as sd
    from specdec_learn.target import Target

    if device.type == "cuda":  # fp32 means fp32: no TF32 in matmuls or convolutions (Qwen3.5's conv1d)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    results, runs = [], 0
    with tempfile.TemporaryDirectory(prefix="specdec-gpu-profile-") as tmp:
        for family in FAMILIES:
            if not budget.allows(f"lossless: {family}", need=1.0):
                continue
            try:
                target = Target(tiny_family(family).eval().to(device), None, name=f"tiny-{family}")
                ar = sd.generate(target, LOSSLESS_PROMPT, max_new_tokens=LOSSLESS_NEW)
            except Exception as err:  # noqa: BLE001 - a release without the class, or one that breaks it
                results.append({"family": family, "status": "error",
                                "reason": f"transformers {transformers.__version__}: {failure(err)}"})
                continue
            for name, (fmt, factory) in published_drafters(target, Path(tmp), family).items():
                if isinstance(factory, tuple):  # refused or failed when built, written or read: say so
                    results.append({"family": family, "drafter": name, "format": fmt, "status": factory[0],
                                    "reason": factory[1]})
                    continue
                shapes = [("chain", k, None) for k in CHAIN_KS.get(name, (1, 3))]
                if getattr(factory(), "can_branch", False) and target.can_verify_tree:
                    shapes.append(("tree", 0, sd.TreeSpec(**LOSSLESS_TREE)))
                for shape, k, tree in shapes:
                    row = {"family": family, "drafter": name, "format": fmt, "shape": shape,
                           **({"k": k} if tree is None else {"tree": LOSSLESS_TREE})}
                    try:
                        got = sd.generate(target, LOSSLESS_PROMPT, factory(), k=k, tree=tree,
                                          max_new_tokens=LOSSLESS_NEW)
                    except ValueError as err:  # the library refusing a shape for this target: recorded
                        results.append({**row, "status": "skipped", "reason": str(err).splitlines()[0][:300]})
                        continue
                    except Exception as err:  # noqa: BLE001 - a pairing the library does not handle: recorded
                        results.append({**row, "status": "error", "reason": failure(err)})
                        continue
                    runs += 1
                    same = got.tokens == ar.tokens
                    row.update(status="ok", lossless=same, tokens=len(got.tokens),
                               drafted=got.stats.num_draft_tokens, accepted=got.stats.num_accepted_tokens)
                    if not same:
                        row["first_difference"] = next(i for i, (a, b) in enumerate(zip(got.tokens + [-1], ar.tokens))
                                                       if a != b)
                    results.append(row)
            log(budget, f"lossless: {family} done")
            del target
            free(device)
    ran = [r for r in results if r.get("status") == "ok"]
    errors = [r for r in results if r.get("status") == "error"]
    return {"dtype": "float32", "device": str(device), "prompt_tokens": len(LOSSLESS_PROMPT),
            "max_new_tokens": LOSSLESS_NEW, "families": FAMILIES,
            "how": "each drafter written in its published format by the library's writer (formats/) and read back "
                   "by its loader, random weights; greedy sd.generate compared token for token with plain decoding "
                   "of the same target. The prompt repeats a pattern, so n-gram and suffix drafts are partly "
                   "accepted; random learned drafters are rejected nearly always.",
            "results": results, "runs": runs, "errors": len(errors),
            "all_lossless": bool(ran) and all(r["lossless"] for r in ran),
            "all_lossless_means": "every run that ran gave plain decoding's tokens; runs the library refused "
                                  "(status skipped) or could not run (status error) are listed with the reason"}


# -- section 3: the cost model ---------------------------------------------------------------------------------


def cost_model(models: list[dict], published: dict) -> dict:
    """Each drafter's round in plain decoding steps, the acceptance length it needs, and published predictions."""
    from specdec_learn.limits import round_speedup

    pairs = []
    for m in models:
        chain = {s["rows"]: s["median_ms"] for s in (m.get("target_steps") or {}).get("chain", [])}
        if 1 not in chain:
            continue
        step = chain[1]
        for d in m.get("drafters", []):
            for r in d.get("rounds", []):
                if "error" in r or r["shape"] != "chain":
                    continue
                k = r["k"]
                draft, verify = r["draft_median_ms"] / step, r["verify_median_ms"] / step
                row = {"target": m["name"], "method": d["method"], "drafter": d["published"], "k": k,
                       "step_ms": step, "draft_cost_steps": draft, "verify_cost_steps": verify,
                       "round_cost_steps": draft + verify, "break_even_L": draft + verify,
                       "ceiling_speedup": round_speedup(k + 1, k, draft / k, verify), "published": []}
                for p in published.get("acceptance_lengths", []):
                    if p["target"] == m["name"] and p["method"] == d["method"] and p["k"] == k:
                        row["published"].append({
                            "L": p["L"], "predicted_speedup": round_speedup(p["L"], k, draft / k, verify),
                            "checkpoint": p["checkpoint"],
                            "same_checkpoint_as_profiled": p["same_checkpoint_as_profiled"],
                            "source": p["source"], "workload": p.get("workload"), "caveat": p.get("caveat")})
                pairs.append(row)
    return {"formula": "speedup = L / (k c + T(k+1)/T(1)) (specdec_learn.limits.round_speedup): L tokens a round, "
                       "a round of k drafts costing k c plain decoding steps of drafting and T(k+1)/T(1) of verifying",
            "measured": "c and T(k+1)/T(1) are this run's medians (section 1), in units of the target's one-row step; "
                        "break_even_L is the acceptance length at which the round pays for itself (speedup 1), "
                        "ceiling_speedup the speedup if every draft were accepted (L = k + 1)",
            "note": RANDOM_WEIGHTS, "pairs": pairs,
            "published_speedups": published.get("published_speedups"),
            "found_but_not_used": published.get("found_but_not_used", []),
            "no_acceptance_length": published.get("no_acceptance_length", [])}


# -- the machine and the file -------------------------------------------------------------------------------


def machine(device) -> dict:
    from specdec_learn.limits import machine_info

    info = machine_info()
    info["device"] = str(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=torch.cuda.get_device_name(device), device_memory_bytes=props.total_memory,
                    backend=f"ROCm (HIP {torch.version.hip})" if torch.version.hip else f"CUDA {torch.version.cuda}",
                    device_count=torch.cuda.device_count())
    else:
        info.update(device_name=info["cpu"], backend="cpu")
    import importlib.util  # transformers runs Qwen3.5's linear attention in pure PyTorch without these two

    info["linear_attention_kernels"] = {name: importlib.util.find_spec(name) is not None
                                        for name in ("fla", "causal_conv1d")}
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                            timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None  # a copy of the working tree without .git (the GPU machine's)
    return info


def problems(models: list[dict], checks: dict) -> list[str]:
    """Everything that did not run as planned, one line each (empty: a complete run)."""
    out = []
    for m in models:
        if m.get("status") != "ok":
            out.append(f"{m['name']}: {m.get('status')}: {m.get('reason')}")
        for d in m.get("drafters", []):
            if d.get("status") != "ok":
                out.append(f"{m['name']} + {d['method']}: {d.get('status')}: {d.get('reason')}")
            out += [f"{m['name']} + {d['method']} k={r['k']} {r['shape']}: error: {r['error']}"
                    for r in d.get("rounds", []) if "error" in r]
    for r in checks.get("results", []):
        if r.get("status") == "error":
            out.append(f"lossless {r['family']} + {r.get('drafter')}: error: {r['reason']}")
        elif r.get("status") == "ok" and not r["lossless"]:
            out.append(f"lossless {r['family']} + {r['drafter']} {r['shape']}: NOT lossless")
    return out


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "device"


def default_out(args, info) -> Path:
    if args.tiny:
        where = info["device_name"] if info["backend"] != "cpu" else "cpu"
        return ROOT / "results" / f"gpu_profile_tiny_{slug(where)}.json"  # results/ is git-ignored: never committed
    return RESULTS / f"gpu_profile_{slug(info['device_name'])}.json"


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        check_args(args)
        check_transformers()
        configs = load_model_configs(Path(args.configs), args.models)
        published_file = Path(args.configs) / "published.json"
        published = read_json(published_file) if published_file.is_file() else {}
        args.loaded = configs, published
    except InputError as err:
        print(f"gpu_profile: {err}", file=sys.stderr)
        return 2
    from specdec_learn.formats.io import write_text_atomic

    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # save_pretrained's bars would bury the progress lines
    try:
        return run(args, write_text_atomic)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()


def run(args, write_text_atomic) -> int:
    """Everything after the inputs were checked: sections 1-3 and the JSON file."""
    configs, published = args.loaded
    has_gpu = torch.cuda.is_available()
    device = torch.device(args.device or ("cuda" if has_gpu else "cpu"))
    auto_tiny = device.type != "cuda" and not args.tiny
    args.tiny = args.tiny or device.type != "cuda"  # full size only on a GPU
    args.context = args.context or (32 if args.tiny else 1024)
    args.repeats = args.repeats or (3 if args.tiny else 10)
    dtype = torch.bfloat16
    torch.manual_seed(args.seed)
    info = machine(device)
    out = Path(args.out) if args.out else default_out(args, info)
    out.parent.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s, reserve=0.0 if args.tiny else 20.0)
    log(budget, f"GPU profile on {info['device_name']} ({info['backend']}), torch {torch.__version__}, transformers "
                f"{transformers.__version__}: {'tiny' if args.tiny else 'published'} sizes"
                + (" (no GPU here: the tiny version)" if auto_tiny else ""))

    clock = Clock(device)
    models = []
    for file, spec in configs:
        try:
            models.append(profile_model(file, spec, args, device, dtype, clock, budget))
        except Exception as err:  # noqa: BLE001 - one model's failure (out of memory, a release's quirk) is
            # recorded and the run goes on: a GPU session is too short to lose the other models to it
            log(budget, f"{spec['name']}: error {err.__class__.__name__}: {str(err).splitlines()[0][:200]}")
            models.append({"name": spec["name"], "config_file": file.name, "status": "error",
                           "reason": failure(err)})
            free(device)
    if args.skip_lossless:
        checks = {"skipped": "--skip-lossless"}
    else:
        checks = lossless(device, budget)
        log(budget, f"lossless: {checks['runs']} runs, all lossless: {checks['all_lossless']}")
    result = {
        "schema": SCHEMA, "kind": "gpu_profile", "issue": 46,
        "mode": "tiny" if args.tiny else "published",
        "mode_note": ("miniatures of every model (the same code as the GPU run, at sizes a CPU runs in seconds: "
                      "its timings mean nothing)" if args.tiny else
                      "the published configurations' shapes with random weights"),
        "note": RANDOM_WEIGHTS,
        "machine": info,
        "settings": {"dtype": str(dtype)[6:], "context": args.context, "rows": list(args.rows),
                     "warmup": args.warmup, "repeats": args.repeats, "clock": clock.name, "budget_s": args.budget_s,
                     "seed": args.seed, "attention": "transformers' default (sdpa): the models are wrapped in "
                                                     "Target directly, which changes nothing"},
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "models": models,
        "lossless": checks,
        "cost_model": cost_model(models, published),
        "skipped_for_time": budget.skipped,
        "problems": problems(models, checks),
        "wall_s": budget.elapsed(),
        "command": "python benchmarks/gpu_profile.py " + " ".join(args.argv),
    }
    write_text_atomic(out, json.dumps(result, indent=1, default=str) + "\n")
    log(budget, f"wrote {out}" + (f"; skipped for time: {len(budget.skipped)}" if budget.skipped else ""))
    return 0 if checks.get("all_lossless", True) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # noqa: BLE001 - the whole traceback, then a non-zero exit: the JSON was not written
        traceback.print_exc()
        sys.exit(1)
