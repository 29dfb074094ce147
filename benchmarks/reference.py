"""The book's reference run: every method, side by side with plain decoding, in full mode, on an idle machine.

    .venv/bin/python benchmarks/reference.py        # or: make reference
    .venv/bin/python benchmarks/reference.py --prompts 2 --max-new-tokens 16 --out /tmp/ref.json   # a dry run

One `bench` per (workload, sampling) in RUNS: plain decoding and every method
at its chapter's draft length, taking turns prompt by prompt, on held-out
HumanEval and chat prompts greedy, and on HumanEval at temperature 1; in the
first, n-gram and EAGLE-3 also sweep k (chapter 9). The chapters' live runs are quick and
small; this is the run their reference tables and sentences come from.

The run is refused as a reference when other processes took more than
quiet.OTHERS_LIMIT of the CPUs during any of its benches (quiet.py): it then
writes nothing and says so. A reference must also be full size (at least
10 prompts x 128 tokens). It writes benchmarks/results/reference_<cpu>.json,
named after the machine, with every bench's rows, conditions and settings.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import specdec_learn as sd
from specdec_learn import quiet
from specdec_learn.bench import FULL_RUN as FULL, bench, format_table, machine_info
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.sampling import Sampling
from specdec_learn.workloads import load_workload

RESULTS = Path(__file__).parent / "results"
# Each method at the draft length its chapter runs it at.
KS = {"ngram": [3], "suffix": [5], "draft_model": [2], "mtp": [2], "gemma4_mtp": [3], "eagle3": [3],
      "dflash": [7], "dspark": [7]}
SWEEP = {"ngram": [1, 2, 3, 4, 6, 8], "eagle3": [1, 2, 3, 4, 6, 8]}  # chapter 9's sweeps (HumanEval, greedy)
SAMPLINGS = {"greedy": Sampling(), "temperature 1": Sampling(temperature=1.0)}
RUNS = [("humaneval", "greedy"), ("chat", "greedy"), ("humaneval", "temperature 1")]  # (workload, sampling)


def slug(cpu: str) -> str:
    """A file-name part for the machine: 'AMD EPYC' -> 'amd_epyc'."""
    return re.sub(r"[^a-z0-9]+", "_", re.sub(r"\(r\)|\(tm\)|processor|cpu", "", cpu.lower())).strip("_")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=FULL[0])
    ap.add_argument("--max-new-tokens", type=int, default=FULL[1])
    ap.add_argument("--out", type=Path, help="where to write (default: benchmarks/results/reference_<cpu>.json)")
    args = ap.parse_args(argv)
    small = args.prompts < FULL[0] or args.max_new_tokens < FULL[1]
    if small and args.out is None:
        sys.exit(f"A reference run is at least {FULL[0]} prompts x {FULL[1]} tokens; for a smaller dry run, "
                 "name its --out.")
    target = sd.load("smollm2-135m")
    machine = machine_info(target)
    out = args.out or RESULTS / f"reference_{slug(machine['cpu'])}.json"
    runs, t0 = [], time.monotonic()
    for workload, mode in RUNS:
        prompts = load_workload(workload, n=args.prompts)
        sweep = RUNS.index((workload, mode)) == 0
        ks = {m: sorted(set(k) | set(SWEEP.get(m, []) if sweep else k)) for m, k in KS.items()}
        records = bench(target, list(KS), ks, prompts, args.max_new_tokens, SAMPLINGS[mode], progress=False)
        print(f"\n{workload}, {mode}, {len(prompts)} prompts x {args.max_new_tokens} tokens "
              f"({records.conditions['seconds']:.0f} s)\n{format_table(records)}", flush=True)
        disturbed = quiet.warning(records.conditions)
        if disturbed:
            print(disturbed, file=sys.stderr)
        runs.append({"workload": workload, "sampling": mode, "num_prompts": len(prompts),
                     "max_new_tokens": args.max_new_tokens, "prompt_ids": [p.id for p in prompts],
                     "conditions": records.conditions, "results": [r.to_json() for r in records]})
    flagged = [f"{r['workload']}, {r['sampling']}" for r in runs if r["conditions"]["disturbed"]]
    if flagged:
        sys.exit(f"Not written: other processes disturbed {'; '.join(flagged)} (quiet.py). A reference comes from "
                 "an otherwise idle machine: stop what else runs and run this again.")
    data = {"machine": machine, "full": not small, "minutes": round((time.monotonic() - t0) / 60, 1), "runs": runs}
    write_text_atomic(out, json.dumps(data, indent=2))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
