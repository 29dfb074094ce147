"""Our loop against HF `generate`, side by side in one run, as ratios.

    python benchmarks/hf_compare.py [--prompts 8] [--max-new-tokens 128] [--k 3,5] [--dtypes bf16,fp32]

For each dtype and each prompt, the four contenders run back to back on the
same token ids, so slow drift of the machine hits them all alike:

* our AR loop                    vs  HF generate (greedy)
* our n-gram drafter, k tokens   vs  HF generate(prompt_lookup_num_tokens=k)

Both n-gram implementations match up to 2 tokens (HF's default
max_matching_ngram_size=2), so they differ in code, not in settings. HF runs
`target.model`, the very model ours runs, so its multi-row passes use the same
attention function and linear layers (on a CPU, `load`'s row-invariant ones,
invariant.py). This is a
benchmark, not a test: it prints ratios and writes a JSON file with the machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import specdec_learn as sd
from specdec_learn.bench import machine_info
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.workloads import load_workload


def hf_generate(target, ids, max_new, **kw):
    t = time.perf_counter()
    out = target.model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, **kw)
    return out[0, len(ids) :].tolist(), time.perf_counter() - t


def ours(target, ids, max_new, drafter=None, k=0):
    out = sd.generate(target, ids, drafter, k=k, max_new_tokens=max_new)
    return out.tokens, out.stats.total_time


def run(dtype, prompts, max_new, ks):
    target = sd.load("smollm2-135m", dtype=dtype, device="cpu")
    ids_list = [target.encode(p.text) for p in prompts]
    ours(target, ids_list[0], 8), hf_generate(target, ids_list[0], 8)  # warm-up
    names = ["ours_ar", "hf_ar"] + [f"{who}_ngram_k{k}" for k in ks for who in ("ours", "hf")]
    tokens = {n: 0 for n in names}
    seconds = {n: 0.0 for n in names}
    same_as_ar = {n: 0 for n in names}
    for ids in ids_list:
        results = {"ours_ar": ours(target, ids, max_new), "hf_ar": hf_generate(target, ids, max_new)}
        for k in ks:
            results[f"ours_ngram_k{k}"] = ours(target, ids, max_new, sd.NgramDrafter(1, 2), k)
            results[f"hf_ngram_k{k}"] = hf_generate(target, ids, max_new, prompt_lookup_num_tokens=k)
        for n, (toks, secs) in results.items():
            tokens[n] += len(toks)
            seconds[n] += secs
            same_as_ar[n] += toks == results["ours_ar"][0]
    tps = {n: tokens[n] / seconds[n] for n in names}
    rows = {
        "ours_ar / hf_ar": tps["ours_ar"] / tps["hf_ar"],
        **{f"ours_ngram_k{k} / hf_ngram_k{k}": tps[f"ours_ngram_k{k}"] / tps[f"hf_ngram_k{k}"] for k in ks},
        **{f"ours_ngram_k{k} / ours_ar": tps[f"ours_ngram_k{k}"] / tps["ours_ar"] for k in ks},
        **{f"hf_ngram_k{k} / hf_ar": tps[f"hf_ngram_k{k}"] / tps["hf_ar"] for k in ks},
    }
    return {
        "dtype": dtype, "tok_per_s": tps, "ratios": rows,
        "match_ours_ar": {n: same_as_ar[n] / len(prompts) for n in names},
        "machine": machine_info(target),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", default="3,5")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--json", default="results/hf_compare.json")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    per = max(1, args.prompts // 3)
    prompts = (load_workload("humaneval", n=per) + load_workload("math", n=per)
               + load_workload("chat", n=args.prompts - 2 * per))
    report = {"prompts": [p.id for p in prompts], "max_new_tokens": args.max_new_tokens, "runs": []}
    for dtype in args.dtypes.split(","):
        r = run(dtype, prompts, args.max_new_tokens, ks)
        report["runs"].append(r)
        print(f"\n== {dtype} · {r['machine']['cpu']} · {r['machine']['torch_threads']} threads · "
              f"{len(prompts)} prompts x {args.max_new_tokens} tokens")
        for name, tps in r["tok_per_s"].items():
            print(f"  {name:<16} {tps:6.1f} tok/s   same tokens as our AR: {r['match_ours_ar'][name]:.2f}")
        for name, ratio in r["ratios"].items():
            print(f"  {name:<32} {ratio:5.2f}x")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.json, json.dumps(report, indent=2))
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
