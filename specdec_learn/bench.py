"""Benchmarks: methods x k over a workload, side by side in one run.

Everything here is measured in the same process, on the same prompts, and
reported as ratios against the autoregressive (AR) baseline of the same run.
The runs take turns prompt by prompt (AR on prompt 1, then every method on
prompt 1, then prompt 2, ...), so a machine whose speed drifts over minutes
slows them all alike. Absolute tokens/s depend on the machine and on what else
it is doing; the ratio is what carries over.

For each (method, k) the record holds vLLM's acceptance metrics (see
stats.py), the throughput, the speedup over AR, and `greedy_match`: the
fraction of prompts whose output equals AR's token for token. Under greedy
decoding on a row-invariant CPU target (invariant.py, `load`'s default) that
must be 1.0 in fp32 and bf16 alike; with torch's own kernels, on a GPU or
through vLLM a different number of rows in a pass can flip a near-tie in the
logits, so we report the rate rather than hide it.

Two costs, both in units of one AR step of the same run (its seconds per
round: a one-row forward plus acceptance), say where a method's time goes:

* `draft_cost` (c): the drafter's seconds per drafted token (propose and
  observe, over all drafted tokens);
* `verify_cost`: the seconds of one verify round (k+1 rows and acceptance).

With mean acceptance length tau, a round of k drafts costs about
k*c + verify_cost AR steps and yields tau tokens, so the speedup is about
tau / (k*c + verify_cost) (limits.round_speedup): the record shows which of
the three limits it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from . import quiet
from .decode import generate
from .formats.io import write_text_atomic
from .limits import machine_info  # noqa: F401 (the chapters read it from here too)
from .sampling import GREEDY, Sampling
from .stats import Record, Stats, compare_to_ar
from .target import Target
from .tree import TreeSpec
from .workloads import Prompt
from .drafters import branching, reducible
from .zoo import make_drafter


@dataclass(frozen=True)
class Planned:
    """One run of a bench: a method with a chain of k or a tree, its draft vocabulary and its drafter's folder."""

    method: str
    k: int = 0  # a chain's draft length (0: AR, or a tree)
    tree: TreeSpec | None = None
    draft_vocab: int | None = None  # a reduced draft vocabulary (vocab.py); None = the full one
    draft: str | None = None  # the drafter's folder (None: the default one)
    other: bool = False  # from bench's `others`: recorded under its folder (--draft may name the same folder)

    def decode(self, target, drafter, prompt: Prompt, max_new_tokens: int, sampling: Sampling, seed: int):
        """One prompt, decoded as this run decodes it."""
        return generate(target, prompt.text, drafter, k=0 if self.tree else self.k, max_new_tokens=max_new_tokens,
                        sampling=sampling, seed=seed, tree=self.tree)

    def record(self, drafter, stats: Stats, outputs: list) -> Record:
        """Its Record: a tree is filed under its depth, AR (no drafter) under k = 0."""
        k = self.tree.depth if self.tree is not None else self.k
        return Record(self.method, k if drafter is not None else 0, stats, outputs, tree=self.tree,
                      draft_vocab=self.draft_vocab, drafter=self.draft if self.other else None)


def run_method(target, method, drafter, k, prompts, max_new_tokens, sampling, seed, progress=None,
               tree: TreeSpec | None = None, draft_vocab: int | None = None) -> Record:
    """One (method, k) or (method, tree) over every prompt, with a drafter you built; prompt i is sampled with
    seed + i.

    draft_vocab: the reduced vocabulary `drafter` was made with (zoo.make_drafter), for the record.
    """
    run, stats, outputs = Planned(method, k, tree, draft_vocab), Stats(), []
    for i, prompt in enumerate(prompts):
        out = run.decode(target, drafter, prompt, max_new_tokens, sampling, seed + i)
        stats = stats + out.stats
        outputs.append(out.tokens)
        if progress is not None:
            progress.update(1)
    return run.record(drafter, stats, outputs)


def bench(
    target: Target,
    methods: list[str],
    ks: list[int] | dict[str, list[int]],
    prompts: list[Prompt],
    max_new_tokens: int = 128,
    sampling: Sampling = GREEDY,
    seed: int = 0,
    draft: str | None = None,
    progress: bool = True,
    trees: list[TreeSpec] = (),
    draft_vocabs: list[int] = (),
    others: list[tuple[str, str]] = (),
) -> list[Record]:
    """Run AR and every other method at every k (and every tree), taking turns prompt by prompt; fill in
    speedup and greedy match.

    ks: the same draft lengths for every method, or {method: its draft lengths}.
    trees: token trees to run too, after each method's chains, for the methods whose drafter branches
    (`drafters.branching()`; the others run their chains only).
    draft_vocabs: reduced draft vocabulary sizes (vocab.py) to run each reducible method's chains with
    too, beside its full-vocabulary runs (`drafters.reducible()`; other methods run once).
    others: (method, folder) pairs: also run that method's chains with the drafter in the folder (a
    retrained export, say) beside the default one, so the two are measured in the same run.
    """
    if not prompts:
        raise ValueError("No prompts to benchmark on.")
    methods = [m for m in methods if m != "ar"]
    ks_of = ks if isinstance(ks, dict) else {m: ks for m in methods}
    missing = [m for m in methods if m not in ks_of]
    if missing:
        raise ValueError(f"No draft lengths given for {', '.join(missing)}: add them to ks.")
    empty = [m for m in methods if not ks_of[m]]
    if empty:
        raise ValueError(f"No draft lengths given for {', '.join(empty)} (ks is empty): give e.g. ks=[1, 3, 5].")
    if any(k < 1 for m in methods for k in ks_of[m]):
        raise ValueError(f"Every k must be >= 1 (k = 0 is the AR baseline, always included); got {ks}.")
    strays = [m for m, _ in others if m not in methods]
    if strays:
        raise ValueError(f"A drafter was given for {', '.join(strays)}, which is not among the methods run: "
                         "add it to --methods.")
    runs = [Planned("ar", draft=draft)] + [Planned(m, k, draft=draft) for m in methods for k in ks_of[m]]
    runs += [Planned(m, tree=tree, draft=draft) for m in methods if m in branching() for tree in trees]
    runs += [Planned(m, k, draft_vocab=v, draft=draft) for v in draft_vocabs for m in methods if m in reducible()
             for k in ks_of[m]]
    runs += [Planned(m, k, draft=folder, other=True) for m, folder in others for k in ks_of[m]]
    # Build every drafter before timing anything: a bad name, a missing draft or a tree it cannot grow fails fast.
    # One drafter per run, as the runs take turns below: no run may learn from another's outputs (suffix
    # decoding remembers every answer its drafter has seen).
    cached = {}
    for run in runs:  # a failing build fails once, before anything is loaded twice
        key = (run.method, run.draft_vocab, run.draft)
        if key not in cached:
            cached[key] = make_drafter(run.method, target, draft=run.draft, draft_vocab=run.draft_vocab)
    drafters = []
    for run in runs:
        key = (run.method, run.draft_vocab, run.draft)
        drafters.append(cached.pop(key) if key in cached
                        else make_drafter(run.method, target, draft=run.draft, draft_vocab=run.draft_vocab))
    for run, drafter in zip(runs, drafters):
        if run.tree is not None:
            drafter.check_tree(run.tree)
    generate(target, prompts[0].text, max_new_tokens=8)  # warm-up: first calls pay one-off costs
    start = quiet.snapshot()  # how much of the CPUs other processes take from here on (quiet.py)
    bar = tqdm(total=len(runs) * len(prompts), desc="bench", disable=not progress, unit="gen")
    stats, outputs = [Stats() for _ in runs], [[] for _ in runs]
    # Prompt by prompt, every run in turn. A shared machine's speed drifts by tens of percent over minutes;
    # had AR run first and each method after it, the drift would be credited to whichever runs met a fast
    # minute. Taking turns spreads every run, AR included, over the whole time.
    for i, prompt in enumerate(prompts):
        for j, (run, drafter) in enumerate(zip(runs, drafters)):
            bar.set_postfix_str(f"prompt {i + 1}, {run.method} " + (f"k={run.k}" if run.tree is None
                                                                    else f"tree={run.tree}"))
            out = run.decode(target, drafter, prompt, max_new_tokens, sampling, seed + i)
            stats[j] = stats[j] + out.stats
            outputs[j].append(out.tokens)
            bar.update(1)
    bar.close()
    records = [run.record(drafter, s, outs) for run, drafter, s, outs in zip(runs, drafters, stats, outputs)]
    return Run(compare_to_ar(records), quiet.conditions(start, quiet.snapshot()))


def vllm_bench(
    model: str,
    methods: list[str],
    ks: list[int],
    prompts: list[Prompt],
    max_new_tokens: int = 128,
    sampling: Sampling = GREEDY,
    seed: int = 0,
    draft: str | None = None,
    dtype: str | None = None,
    batch_size: int = 1,
    cache_dir: str | None = None,
    **engine_options,
) -> list[Record]:
    """AR once and every other method at every k through vLLM (vllm_backend.py); one engine per (method, k).

    The same Records as `bench.bench`: speedup over vLLM's own AR, and greedy
    match = the fraction of prompts whose output equals vLLM AR's.
    """
    from .vllm_backend import VllmEngine, resolve_draft, speculative_config

    if not prompts:
        raise ValueError("No prompts to benchmark on.")
    if any(k < 1 for k in ks):
        raise ValueError(f"Every k must be >= 1 (k = 0 is the AR baseline, always included); got {ks}.")
    runs = [("ar", 0)] + [(m, k) for m in methods if m != "ar" for k in ks]
    for method, k in runs:  # a bad name or a missing draft fails before any engine starts
        speculative_config(method, k, resolve_draft(model, method, draft if method != "ngram" else None))
    records = []
    for method, k in runs:
        with VllmEngine(model, method, k, draft, dtype, seed, cache_dir, **engine_options) as engine:
            engine.generate(prompts[0].text, max_new_tokens=8)  # warm-up: first calls pay one-off costs
            records.append(engine.run(prompts, max_new_tokens, sampling, seed, batch_size))
    return compare_to_ar(records)


class Run(list):
    """bench's records (AR first), and `conditions`: how long they took and whether others disturbed them."""

    def __init__(self, records, conditions: dict | None = None):
        super().__init__(records)
        self.conditions = conditions


def format_table(records: list[Record]) -> str:
    """A plain-text table, one line per (method, k)."""
    trees = any(r.tree is not None for r in records)
    lines = table_lines([(r.name, r.label, r.to_json()) for r in records], width=8 if trees else 2)
    if trees:
        lines.append("(a tree: nodes/depth/branch; its per-position acceptance is per depth)")
    return "\n".join(lines)


def table_lines(entries: list[tuple[str, str, dict]], width: int = 2) -> list[str]:
    """The table's lines for (name, k or tree label, a row as Record.to_json writes it); `width`: the k column's."""
    names = max([12] + [len(name) for name, _, _ in entries])
    head = (f"{'method':<{names}} {'k':>{width}} {'tok/s':>7} {'speedup':>7} {'acc.len':>7} {'match':>5}  "
            "per-position acceptance")
    lines = [head, "-" * len(head)]
    for name, label, r in entries:
        pos = " ".join(f"{a:.2f}" for a in r["per_position_acceptance"])
        lines.append(f"{name:<{names}} {label:>{width}} {r['tok_per_s']:>7.1f} {r['speedup']:>6.2f}x "
                     f"{r['mean_acceptance_length']:>7.2f} {r['greedy_match']:>5.2f}  {pos}")
    return lines


def write_json(path: str, records: list[Record], target: Target, config: dict) -> None:
    """Write a run's results: the machine, the run's config and conditions (a Run's; None for others), the rows."""
    data = {
        "machine": machine_info(target),
        "config": config,
        "conditions": getattr(records, "conditions", None),
        "results": [r.to_json() for r in records],
    }
    write_text_atomic(path, json.dumps(data, indent=2))


# --- reading results back -------------------------------------------------------------

# the committed results, in a clone of the repository; $SPECDEC_RESULTS names another folder (an installed wheel has none)
RESULTS = Path(os.environ.get("SPECDEC_RESULTS") or Path(__file__).resolve().parents[1] / "benchmarks" / "results")
FULL_RUN = (10, 128)  # prompts x new tokens: the least a run the book calls full has (benchmarks/reference.py)


def machine_words(m: dict) -> str:
    """A results file's CPU in words, and whether it has bf16 instructions (and AMX) where that is known: two CPUs
    with one name can differ in them, and they decide a bf16 run's costs (limits.cpu_has_bf16, cpu_has_amx)."""
    if m.get("isa_cap"):  # oneDNN, MKL and ATen held to an instruction set: computing as a CPU with only that does
        return f"{m['cpu']} with its kernels capped at {m['isa_cap']}"
    bf16 = {True: " with bf16 instructions", False: " without bf16 instructions"}.get(m.get("cpu_bf16"), "")
    if m.get("cpu_bf16"):  # which ones, where the file says (results from before cpu_amx do not)
        bf16 = {True: " with AMX bf16 instructions", False: " with AVX512-BF16, no AMX"}.get(m.get("cpu_amx"), bf16)
    return f"{m['cpu']}{bf16}"


def kernel_words(m: dict) -> str:
    """', torch's own kernels' for a CPU run whose rows were not computed alike (invariant.py): its rows, and so
    its greedy match, may differ from plain decoding's."""
    return "" if m.get("row_invariant") or m.get("gpu") else ", torch's own kernels"


@dataclass
class Results:
    """A benchmark's JSON read back: what the book states its measured figures from."""

    path: Path
    machine: dict
    config: dict
    rows: list[dict]
    conditions: dict | None = None  # quiet.conditions of the run (None: written before runs recorded them)

    def get(self, method: str, k: int | None = None, tree: TreeSpec | None = None,
            draft_vocab: int | None = None, drafter: str | None = None) -> dict:
        """The chain row of (method, k), or its row with `tree`, `draft_vocab` or another `drafter` folder.

        k=None: its only row, or its fastest.
        """
        want = None if tree is None else asdict(tree)
        rows = [r for r in self.rows if r["method"] == method and (k is None or r["k"] == k)
                and r.get("tree") == want and r.get("draft_vocab") == draft_vocab and r.get("drafter") == drafter]
        if not rows:
            have = ", ".join(f"{r['method']} k={r['k']}" for r in self.rows)
            raise KeyError(f"{self.path.name} has no {method}" + (f" at k={k}" if k is not None else "") + f": {have}.")
        return max(rows, key=lambda r: r["speedup"] or 0.0)

    @property
    def label(self) -> str:
        """Where and how it was measured, in words: prompts x tokens (full or small), workload, sampling, machine."""
        m, c = self.machine, self.config
        n, tokens = c.get("num_prompts", c.get("prompts")), c["max_new_tokens"]
        size = "full run" if n >= FULL_RUN[0] and tokens >= FULL_RUN[1] else "small run"
        sampling = c.get("sampling") or ("greedy" if not c.get("temperature") else f"temperature {c['temperature']:g}")
        workload = f"{Path(c['workload']).stem}, " if c.get("workload") else ""
        return (f"{n} prompts x {tokens} new tokens ({size}; {workload}{sampling}), "
                f"{m['dtype']}{kernel_words(m)}, {machine_words(m)}, {m['cores']} cores")

    def table(self, methods: list[str] | dict[str, int] | None = None) -> str:
        """The chain rows as `format_table` prints a live run's, and the label under them.

        `methods`: a list (those methods at every k), a dict (each method at its one k: {"ar": 0, "ngram": 3}),
        or None (every row).
        """
        def shown(r):
            if methods is None:
                return True
            return r["method"] in methods and (not isinstance(methods, dict) or r["k"] == methods[r["method"]])

        rows = [r for r in self.rows if r.get("tree") is None and shown(r)]
        lines = table_lines([(r["method"], str(r["k"]), r) for r in rows])
        return "\n".join(lines + [f"({self.label}; {self.path.name})"])


def read_results(name: str | os.PathLike) -> Results:
    """A JSON written by `write_json`: a path, or the name of one committed in benchmarks/results/."""
    path = Path(name)
    if not path.suffix:
        path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"No benchmark results at {path}: the book reads the results committed in the "
                                "repository's benchmarks/results/: run it from a clone (git clone, then make setup), "
                                "or name the folder with $SPECDEC_RESULTS.")
    data = json.loads(path.read_text())
    return Results(path, data["machine"], data["config"], data["results"], data.get("conditions"))


def read_reference(workload: str = "humaneval", sampling: str = "greedy", name: str | None = None) -> Results:
    """One bench of the book's reference run (benchmarks/reference.py, `make reference`): every method beside
    plain decoding in one run, full size, on an otherwise idle machine.

    `sampling`: 'greedy' or 'temperature 1'. `name`: which reference_*.json, where more than one machine's is
    committed (default: the only one).
    """
    paths = sorted(RESULTS.glob("reference_*.json")) if name is None else [RESULTS / f"{name}.json"]
    if len(paths) != 1 or not paths[0].is_file():
        found = ", ".join(p.stem for p in sorted(RESULTS.glob("reference_*.json"))) or "none"
        raise FileNotFoundError(f"The book reads one reference run from {RESULTS} (found: {found}): name it "
                                "(read_reference(..., name=...)), or make one with `make reference`.")
    data = json.loads(paths[0].read_text())
    runs = {(r["workload"], r["sampling"]): r for r in data["runs"]}
    if (workload, sampling) not in runs:
        raise KeyError(f"{paths[0].name} has no {workload} run at {sampling}: it has {sorted(runs)}.")
    run = runs[workload, sampling]
    config = {key: run[key] for key in ("workload", "sampling", "num_prompts", "max_new_tokens", "prompt_ids")}
    return Results(paths[0], data["machine"], config, run["results"], run["conditions"])
