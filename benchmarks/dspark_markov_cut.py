"""DSpark's Markov bias over the draft vocabulary against over the whole vocabulary, side by side.

    python benchmarks/dspark_markov_cut.py [--dtypes fp32,bf16] [--k 4] [--draft-vocab 8192] [--prompts 6]

With a draft vocabulary (vocab.py) the shipped DSpark scores V_d rows of the
LM head, but its Markov bias W2 · W1[prev] was still computed over all V
tokens at every drafted slot, although the base logits are -inf outside the
draft vocabulary. `DSparkDrafter.markov_bias` now cuts it to V_d rows (a
vocab.ReducedHead over W2). This benchmark runs the shipped drafter both
ways, with the same cut LM head, prompt by prompt in turns (AR, then the
cut bias, then the whole one), greedy, on held-out mixed prompts: the drafts
must be the same, and what differs is the draft time. It prints ms per
drafted token and c (that over one AR step, AR measured in the same turns)
and writes a JSON file. A benchmark, not a test; the README records the
figures with the machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import specdec_learn as sd
from specdec_learn.bench import machine_info
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.workloads import load_workload
from specdec_learn.zoo import make_drafter

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def measure(target, k: int, draft_vocab: int, prompts: list[str], max_new: int) -> dict:
    """{"ar_step_ms", "cut": {...}, "whole": {...}}: draft ms per drafted token and c, drafts compared."""
    cut = make_drafter("dspark", target, draft_vocab=draft_vocab)
    whole = make_drafter("dspark", target, draft_vocab=draft_vocab)
    whole.markov_bias = lambda: whole.markov  # the whole W2 over the same cut LM head: the code before the cut
    ar_stats = sd.Stats()
    totals = {"cut": sd.Stats(), "whole": sd.Stats()}
    sd.generate(target, prompts[0], cut, k=k, max_new_tokens=8)  # warm-up
    sd.generate(target, prompts[0], whole, k=k, max_new_tokens=8)
    for prompt in prompts:
        ar_stats = ar_stats + sd.generate(target, prompt, max_new_tokens=max_new).stats
        runs = {name: sd.generate(target, prompt, d, k=k, max_new_tokens=max_new, keep_trace=True)
                for name, d in (("cut", cut), ("whole", whole))}
        if [r.drafts for r in runs["cut"].trace] != [r.drafts for r in runs["whole"].trace]:
            raise SystemExit(f"the cut Markov bias drafted differently on {prompt[:40]!r}")
        for name, run in runs.items():
            totals[name] = totals[name] + run.stats
    step_ms = 1000 * ar_stats.verify_time / ar_stats.num_rounds  # one AR step, as bench.py reckons c
    out = {"ar_step_ms": step_ms}
    for name, s in totals.items():
        per_token = 1000 * s.draft_time / s.num_draft_tokens
        out[name] = {"draft_ms_per_token": per_token, "c": per_token / step_ms, "drafted": s.num_draft_tokens,
                     "mean_acceptance_length": s.mean_acceptance_length, "tok_per_s": s.tok_per_s}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default="benchmarks/results/dspark_markov_cut.json")
    args = ap.parse_args()
    prompts = [p.text for p in load_workload("benchmarks/heldout_mixed.jsonl", n=args.prompts)]
    results = {"config": vars(args), "results": {}}
    for name in args.dtypes.split(","):
        target = sd.load("smollm2-135m", dtype=DTYPES[name])
        results["machine"] = {key: v for key, v in machine_info(target).items() if key != "dtype"}  # dtype: each result's
        r = measure(target, args.k, args.draft_vocab, prompts, args.max_new_tokens)
        results["results"][name] = {"dtype": str(target.dtype).removeprefix("torch."), **r}
        print(f"{name}: AR step {r['ar_step_ms']:.1f} ms; per drafted token "
              f"{r['whole']['draft_ms_per_token']:.2f} ms (c {r['whole']['c']:.3f}) with the whole Markov bias, "
              f"{r['cut']['draft_ms_per_token']:.2f} ms (c {r['cut']['c']:.3f}) cut to {args.draft_vocab} tokens; "
              f"the same {r['cut']['drafted']} drafts, {r['cut']['mean_acceptance_length']:.2f} tokens a round")
    print("measured on:", results["machine"]["cpu"], f"{results['machine']['torch_threads']} threads")
    write_text_atomic(Path(args.json), json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
