"""Parallel block drafters side by side: AR, EAGLE-3, DFlash (k = 3, 7, 11, 15) and DSpark (k = 3, 7)
with its Markov head and confidence gate toggled, in ONE run on held-out prompts of all three workloads.

    SPECDEC_CACHE=.cache python benchmarks/parallel_drafters.py --dtype bf16 --per-workload 3 \
        --max-new-tokens 96 --json benchmarks/results/parallel_drafters.json

Every row is measured in the same process, right after the others, and its
speedup is against the AR row of the same run (bench.py explains why).
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec_learn import bench
from specdec_learn.sampling import GREEDY
from specdec_learn.target import load
from specdec_learn.workloads import WORKLOADS, load_workload
from specdec_learn.zoo import make_drafter


def configurations(target, args):
    """(label, method, k, drafter) for every row; drafters that are not shipped are left out, said so."""
    rows = [("ar", "ar", 0, None)]
    try:
        if not args.eagle_k:
            raise ValueError("no EAGLE-3 rows asked for (--eagle-k '')")
        eagle = make_drafter("eagle3", target)
        rows += [("eagle3", "eagle3", k, eagle) for k in args.eagle_k]
    except (ValueError, FileNotFoundError) as err:
        print(f"skipping EAGLE-3: {err}")
    dflash = make_drafter("dflash", target)
    rows += [("dflash", "dflash", k, dflash) for k in args.dflash_k]
    for markov in (True, False):
        for gate in (None, *args.gates):
            drafter = make_drafter("dspark", target, markov=markov, gate=gate)
            label = f"dspark{'' if markov else '-nomarkov'}{'' if gate is None else f'-gate{gate:g}'}"
            ks = args.dspark_k if (markov and gate is None) or not args.ablate_at else [args.ablate_at]
            rows += [(label, "dspark", k, drafter) for k in ks]
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--per-workload", type=int, default=3, help="held-out prompts from each of humaneval, math, chat")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dflash-k", type=lambda s: [int(x) for x in s.split(",")], default=[3, 7, 11, 15])
    p.add_argument("--dspark-k", type=lambda s: [int(x) for x in s.split(",")], default=[3, 7])
    p.add_argument("--eagle-k", type=lambda s: [int(x) for x in s.split(",") if x], default=[3],
                   help="EAGLE-3 rows for comparison ('' for none)")
    p.add_argument("--gates", type=lambda s: [float(x) for x in s.split(",")], default=[0.5])
    p.add_argument("--ablate-at", type=int, default=None,
                   help="run the Markov/gate ablations only at this k (default: at every DSpark k)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    target = load(args.model, dtype=args.dtype, device="cpu")
    prompts = [q for w in WORKLOADS for q in load_workload(w, n=args.per_workload)]  # bench split only
    rows = configurations(target, args)
    bench.run_method(target, "ar", None, 0, prompts[:1], 8, GREEDY, 0)  # warm-up
    records, start = [], time.perf_counter()
    for label, method, k, drafter in rows:
        r = bench.run_method(target, method, drafter, k, prompts, args.max_new_tokens, GREEDY, 0)
        r.method = label
        records.append(r)
        print(f"{label:<24} k={k:<2} {r.stats.tok_per_s:6.1f} tok/s  acc.len {r.stats.mean_acceptance_length:.2f}"
              f"  ({time.perf_counter() - start:.0f}s)", flush=True)
    ar = records[0]
    for r in records:
        r.speedup = r.stats.tok_per_s / ar.stats.tok_per_s
        r.greedy_match = sum(a == b for a, b in zip(r.outputs, ar.outputs)) / len(prompts)
    info = bench.machine_info(target)
    print(f"\n{args.model} · {info['dtype']} · {info['cpu']} ({info['torch_threads']} threads) · "
          f"{len(prompts)} held-out prompts ({args.per_workload} per workload) · {args.max_new_tokens} new tokens")
    print(bench.format_table(records))
    if args.json:
        config = {**vars(args), "prompt_ids": [q.id for q in prompts]}
        bench.write_json(args.json, records, target, config)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
