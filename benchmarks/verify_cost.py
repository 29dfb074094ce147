"""What a verify pass over n rows costs against one row, with transformers' sdpa and with grouped heads kept grouped.

    python benchmarks/verify_cost.py [--dtypes bf16,fp32] [--rows 1,2,3,4,5,9] [--context 200] [--repeats 40]

The target decodes `--context` tokens of a held-out prompt, so the cache
holds real text, then verifies n rows (its own next tokens as the drafts)
again and again, each time taking the rows back out of the cache, so every
pass sees the same cache. The two attention functions take turns round by
round, so drift of the machine hits both alike:

* "sdpa": transformers' own, which repeats every K/V head for its query heads
  whenever it is handed a mask (a verify pass over a cache always is);
* "sdpa_grouped": `speedups.attend_grouped_heads`, which keeps them grouped.

Decoding one row needs no mask, so the two differ only for n > 1. The medians
are of the verify call alone (the loop's `verify_cost` also counts acceptance).
A benchmark, not a test: it prints ratios and writes a JSON file; the README
records the figures with the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import specdec_learn as sd
from specdec_learn.bench import machine_info
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.kv_cache import crop_cache
from specdec_learn.speedups import GROUPED
from specdec_learn.workloads import load_workload

IMPLEMENTATIONS = ("sdpa", GROUPED)


def decoded_state(target, context: int, drafts: int):
    """A DecodeState holding a held-out prompt and the first `context` tokens of its greedy answer; the next tokens.

    The first chat or HumanEval prompt whose answer runs `context + drafts` tokens.
    """
    for prompt in load_workload("chat") + load_workload("humaneval"):
        ids = target.encode(prompt.text)
        answer = sd.generate(target, ids, max_new_tokens=context + drafts).tokens
        if len(answer) == context + drafts:
            state, _ = target.prefill(ids + answer[:context])
            return state, answer[context:]
    raise SystemExit(f"no held-out answer runs {context + drafts} tokens: give a smaller --context")


def measure(target, rows: list[int], context: int, repeats: int) -> dict:
    """{implementation: {n: median ms of one verify over n rows}}."""
    times = {impl: {n: [] for n in rows} for impl in IMPLEMENTATIONS}
    state, ahead = decoded_state(target, context, max(rows) - 1)
    for warm_up in (True,) * 2 + (False,) * repeats:
        for impl in IMPLEMENTATIONS:
            target.model.set_attn_implementation(impl)
            for n in rows:
                start = time.perf_counter()
                target.verify(state, ahead[: n - 1])
                seconds = time.perf_counter() - start
                crop_cache(state.cache, state.num_cached)  # the verified rows back out: the next pass sees this cache
                if not warm_up:
                    times[impl][n].append(seconds)
    target.model.set_attn_implementation(GROUPED)
    return {impl: {n: 1000 * statistics.median(ts) for n, ts in per_n.items()} for impl, per_n in times.items()}


def run(dtype: str, rows: list[int], context: int, repeats: int) -> dict:
    target = sd.load("smollm2-135m", dtype=dtype, device="cpu", invariant=False)  # torch's kernels, our attention
    if target.model.config._attn_implementation != GROUPED:
        raise SystemExit(f"the target's attention is {target.model.config._attn_implementation}, not {GROUPED}: "
                         "run this on a CPU")
    ms = measure(target, rows, context, repeats)
    ratios = {impl: {n: ms[impl][n] / ms[impl][1] for n in rows} for impl in IMPLEMENTATIONS}
    return {"dtype": dtype, "context": context, "repeats": repeats, "ms": ms, "over_one_row": ratios,
            "grouped_over_sdpa": {n: ms[GROUPED][n] / ms["sdpa"][n] for n in rows}, "machine": machine_info(target)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--rows", default="1,2,3,4,5,9")
    ap.add_argument("--context", type=int, default=200, help="tokens decoded before measuring")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json", default="benchmarks/results/verify_cost.json")
    args = ap.parse_args()
    rows = sorted({1, *(int(n) for n in args.rows.split(","))})
    results = []
    for dtype in args.dtypes.split(","):
        r = run(dtype, rows, args.context, args.repeats)
        results.append(r)
        print(f"{dtype}: verify over n rows, median ms (and / one row), {args.context} tokens decoded")
        for impl in IMPLEMENTATIONS:
            cells = "  ".join(f"{n}: {r['ms'][impl][n]:.1f} ({r['over_one_row'][impl][n]:.2f})" for n in rows)
            print(f"  {impl:13s} {cells}")
        print("  grouped / sdpa " + "  ".join(f"{n}: {v:.2f}" for n, v in r["grouped_over_sdpa"].items()))
    write_text_atomic(Path(args.json), json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
