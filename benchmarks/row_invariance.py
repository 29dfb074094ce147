"""Row invariance, measured: what it costs plain decoding, what verification costs, and greedy match.

    python benchmarks/row_invariance.py [--prompts 12] [--max-new-tokens 128] [--dtypes auto]
    make row-invariance

A target is row-invariant (specdec_learn/invariant.py) when a row's bits do
not depend on how many rows its forward computes; `target.load` makes a CPU
target so unless told `invariant=False`. Per dtype, on held-out prompts of
every workload (HumanEval, math, chat in turn), this measures in one run:

1. **Plain decoding three ways**, taking turns prompt by prompt: the
   invariant target, the same weights with torch's own kernels, and HF
   `generate` on the latter (greedy). Tokens per second, and each one's
   share of prompts whose output equals the invariant target's.
2. **Every method** beside plain decoding (`bench.bench`, the runs taking
   turns prompt by prompt) on the invariant target: each at its book k, and
   token trees for the methods that branch. Greedy match must be 1.00.
3. **Verification's cost against rows**: one verify pass over n rows
   (1..17) divided by one over a single row, on a cache holding real text,
   for both kernels, taking turns.

The machine's quietness is measured throughout (quiet.py) and written with
the results; a disturbed run says so. The JSON goes to
benchmarks/results/row_invariance_<cpu>.json; benchmarks/tables.py makes
benchmarks/README.md's table from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import specdec_learn as sd
from specdec_learn import quiet
from specdec_learn.bench import bench
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.limits import machine_info
from specdec_learn.models import resolve_dtype
from specdec_learn.kv_cache import crop_cache
from specdec_learn.workloads import load_workload

from reference import slug  # benchmarks/reference.py: one file-name part per machine

ROOT = Path(__file__).resolve().parent.parent
BOOK_K = {"ngram": 3, "suffix": 5, "draft_model": 2, "eagle3": 3, "mtp": 2, "gemma4_mtp": 3, "dflash": 7,
          "dspark": 7}  # each method at its chapter's k, as the reference run has it
TREE = sd.TreeSpec(nodes=8, depth=3, branch=2)
ROWS = (1, 2, 3, 4, 5, 8, 9, 16, 17)


def mixed_prompts(n: int):
    """n held-out prompts, HumanEval, math and chat in turn."""
    sets = [load_workload(w, n=n) for w in ("humaneval", "math", "chat")]
    return [sets[i % 3][i // 3] for i in range(n)]


def hf_generate(target, ids, max_new):
    """HF generate, greedy: (tokens, seconds). Stops at EOS as our loop does."""
    start = time.perf_counter()
    out = target.model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                                eos_token_id=sorted(target.eos_ids), pad_token_id=sorted(target.eos_ids)[0])
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def plain_decoding(invariant, plain, prompts, max_new) -> dict:
    """Section 1: AR on both targets and HF generate, taking turns prompt by prompt."""
    runs = {"invariant": lambda ids: timed_ar(invariant, ids, max_new),
            "torch_kernels": lambda ids: timed_ar(plain, ids, max_new),
            "hf_generate": lambda ids: hf_generate(plain, ids, max_new)}
    tokens, seconds, outputs = ({name: 0 for name in runs}, {name: 0.0 for name in runs},
                                {name: [] for name in runs})
    for prompt in prompts:
        ids = invariant.encode(prompt.text)
        for name, run in runs.items():
            out, secs = run(ids)
            tokens[name] += len(out)
            seconds[name] += secs
            outputs[name].append(out)
    reference = outputs["invariant"]
    return {name: {"tok_per_s": tokens[name] / seconds[name],
                   "over_invariant": (tokens[name] / seconds[name]) / (tokens["invariant"] / seconds["invariant"]),
                   "same_output_as_invariant": sum(a == b for a, b in zip(outputs[name], reference)) / len(prompts)}
            for name in runs}


def timed_ar(target, ids, max_new):
    out = sd.generate(target, ids, max_new_tokens=max_new)
    return out.tokens, out.stats.total_time


def verify_cost(targets: dict, prompt, repeats: int) -> dict:
    """Section 3: median seconds of one verify pass over n rows / over one row, each target taking turns."""
    any_target = next(iter(targets.values()))
    ids = any_target.encode(prompt.text)
    answer = sd.generate(any_target, ids, max_new_tokens=200).tokens
    drafts = (answer * 2)[: max(ROWS)]
    states = {name: t.prefill(ids + answer[:100])[0] for name, t in targets.items()}
    times = {name: {n: [] for n in ROWS} for name in targets}
    for repeat in range(repeats + 2):  # two warm-up rounds
        for n in ROWS:
            for name, t in targets.items():
                state = states[name]
                start = time.perf_counter()
                t.verify(state, drafts[: n - 1])
                seconds = time.perf_counter() - start
                crop_cache(state.cache, state.num_cached)  # the rows back out: every pass sees the same cache
                if repeat >= 2:
                    times[name][n].append(seconds)
    return {name: {"ms": {n: 1000 * statistics.median(ts) for n, ts in per.items()},
                   "over_one_row": {n: statistics.median(ts) / statistics.median(per[1]) for n, ts in per.items()}}
            for name, per in times.items()}


def run(dtype: str, prompts, max_new: int, repeats: int) -> dict:
    invariant = sd.load("smollm2-135m", dtype=dtype, device="cpu")
    plain = sd.load("smollm2-135m", dtype=dtype, device="cpu", invariant=False)
    assert invariant.row_invariant and not plain.row_invariant
    name = str(invariant.dtype).replace("torch.", "")
    for t in (invariant, plain):  # warm-up: first calls pay one-off costs
        sd.generate(t, prompts[0].text, max_new_tokens=8)
    start = quiet.snapshot()
    print(f"{name}: plain decoding, three ways ...", flush=True)
    ar = plain_decoding(invariant, plain, prompts, max_new)
    print(f"{name}: verify cost against rows ...", flush=True)
    costs = verify_cost({"invariant": invariant, "torch_kernels": plain}, prompts[0], repeats)
    conditions = quiet.conditions(start, quiet.snapshot())
    print(f"{name}: every method beside plain decoding ...", flush=True)
    methods = list(BOOK_K)
    records = bench(invariant, methods, {m: [BOOK_K[m]] for m in methods}, prompts, max_new, trees=[TREE])
    return {"dtype": name, "machine": machine_info(invariant), "plain_decoding": ar, "verify_cost": costs,
            "conditions": conditions, "methods_conditions": records.conditions,
            "methods": [r.to_json() for r in records]}


def report(r: dict) -> None:
    print(f"\n{r['dtype']} on {r['machine']['cpu']}")
    for name, a in r["plain_decoding"].items():
        print(f"  {name:14s} {a['tok_per_s']:6.1f} tok/s  {a['over_invariant']:.2f}x the invariant loop, "
              f"same output on {a['same_output_as_invariant']:.2f} of prompts")
    for name, c in r["verify_cost"].items():
        print(f"  verify/one row {name:14s} " + " ".join(f"{n}:{v:.2f}" for n, v in c["over_one_row"].items()))
    for m in r["methods"]:
        label = m["k"] if m["tree"] is None else f"tree {m['tree']['nodes']}/{m['tree']['depth']}/{m['tree']['branch']}"
        print(f"  {m['method']:12s} {str(label):>10}  {m['speedup']:.2f}x  match {m['greedy_match']:.2f}")
    for key in ("conditions", "methods_conditions"):
        warning = quiet.warning(r[key])
        if warning:
            print("  " + warning)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtypes", default="auto", help="comma-separated; auto: bf16 where the CPU has bf16 "
                                                     "instructions, and fp32 always")
    ap.add_argument("--repeats", type=int, default=15, help="verify passes per row count and kernel")
    ap.add_argument("--json", default=None, help="default: benchmarks/results/row_invariance_<cpu>.json "
                                                 "(<cpu>_no_bf16 on a CPU without bf16 instructions, "
                                                 "<cpu>_avx2_kernels under make row-invariance-avx2)")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.max_new_tokens < 1:
        raise SystemExit("--prompts and --max-new-tokens must be >= 1")
    dtypes = []
    for d in args.dtypes.split(","):
        dtypes += ["bf16", "fp32"] if d == "auto" and resolve_dtype("auto", "cpu") == torch.bfloat16 else \
            ["fp32"] if d == "auto" else [d]
    prompts = mixed_prompts(args.prompts)
    results = []
    for dtype in dict.fromkeys(dtypes):
        results.append(run(dtype, prompts, args.max_new_tokens, args.repeats))
        report(results[-1])
    machine = results[0]["machine"]
    cpu = slug(machine["cpu"])  # the machine's name as the reference run's file has it
    if machine["isa_cap"]:  # `make row-invariance-avx2`: not this CPU's own kernels, so not its file
        cpu += f"_{machine['isa_cap'].lower()}_kernels"
    elif not machine["cpu_bf16"]:  # a CPU of the same name may or may not have bf16 instructions (AMD EPYC)
        cpu += "_no_bf16"
    out = Path(args.json or ROOT / "benchmarks" / "results" / f"row_invariance_{cpu}.json")
    config = {"num_prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "workload": "mixed",
              "prompt_ids": [p.id for p in prompts], "book_k": BOOK_K, "tree": vars(TREE), "rows": list(ROWS),
              "repeats": args.repeats}
    write_text_atomic(out, json.dumps({"config": config, "runs": results}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
