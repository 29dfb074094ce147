"""Held-out accuracy of drafter folders on the corpus's held-out answers, per prompt source.

    SPECDEC_CACHE=.cache python benchmarks/heldout_accuracy.py draft_model \
        specdec_learn/checkpoints/draft-smollm2-135m .cache/retrain/draft-smollm2-135m \
        --json benchmarks/results/retrain/draft_model_heldout_accuracy.json
    SPECDEC_CACHE=.cache python benchmarks/heldout_accuracy.py dflash \
        specdec_learn/checkpoints/dflash-smollm2-135m .cache/retrain/dflash-smollm2-135m --per-source 40

Each folder is scored by its trainer's own evaluation, so a retrained drafter
and the shipped one it might replace are scored alike, on the same examples:

* dflash, dspark: train/dflash.evaluate, teacher-forced top-1 of each block
  slot (every earlier slot given right) at fixed anchors, on taps of the bf16
  target (one target forward per held-out example, the slow part);
* draft_model: train/draft_model.agreement, teacher-forced top-1 agreement
  with the target's greedy answers, what its evaluate logs (no target forward).

The split is by prompt source (sources.prompt_source): the corpus is mostly
Magpie requests, the benchmark's workloads are the templated kinds, and a
drafter is fast on the text it is served. Held-out accuracy is an upper
bound on what a chain accepts and the signal a training run watches; whether
a drafter is faster is `specdec bench`'s question, not this.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec_learn.checkpoints import complete
from specdec_learn.drafters.dflash import load_dflash
from specdec_learn.drafters.dspark import load_dspark
from specdec_learn.formats.io import write_text_atomic
from specdec_learn.models import load_hf
from specdec_learn.target import load
from specdec_learn.train import dflash, draft_model, dspark
from specdec_learn.train.data import training_split
from specdec_learn.train.features import OnDemand, training_data
from specdec_learn.train.sources import prompt_source


def example_loss(method: str, model, embed, lm_head):
    """The trainer's per-example loss for a loaded block drafter (its accuracy is what evaluate reads)."""
    if method == "dflash":
        return lambda f, anchors: dflash.dflash_loss(model, embed, lm_head, f.taps.float(), f.ids, f.loss_mask, anchors)
    return lambda f, anchors: dspark.dspark_loss(model, embed, lm_head, f.taps.float(), f.last, f.ids, f.loss_mask,
                                                 anchors)


def per_source(examples: list, limit: int | None) -> list:
    """The held-out examples, at most `limit` of each prompt source (in the split's order)."""
    if limit is None:
        return examples
    taken: dict[str, int] = {}
    kept = []
    for ex in examples:
        source = prompt_source(ex.id)
        if taken.get(source, 0) < limit:
            taken[source] = taken.get(source, 0) + 1
            kept.append(ex)
    return kept


def score_block_drafters(method: str, folders: list[str], target, limit: int | None) -> tuple[dict, list]:
    """{folder: {"acc": [B], "acc_<source>": [B]}} for DFlash or DSpark folders, and the examples scored."""
    taps = dflash.shared_taps(target)
    if limit is None:  # every held-out example: their features are captured once and cached
        data = training_data(target, taps)
        held_out, feats = data.held_out, data.eval
    else:  # a few: computed here, nothing cached
        held_out = per_source(training_split(Path(str(target.name)).name)[1], limit)
        feats = OnDemand(target, held_out, taps)
    sources = [prompt_source(ex.id) for ex in held_out]
    embed, lm_head = dflash.frozen_parts(target)
    loader = load_dflash if method == "dflash" else load_dspark
    results = {}
    for folder in folders:
        model = loader(folder, dtype=torch.float32).eval()
        scores = dflash.evaluate(example_loss(method, model, embed, lm_head), feats, model.block_size, sources=sources)
        results[folder] = {key: [round(float(a), 4) for a in acc] for key, acc in scores.items()}
    return results, held_out


def score_draft_models(folders: list[str], target_name: str, limit: int | None) -> tuple[dict, list]:
    """{folder: {"acc": [a], "acc_<source>": [a]}} for draft-model folders (fp32), and the examples scored."""
    held_out = per_source(training_split(target_name)[1], limit)
    results = {}
    for folder in folders:
        model, _ = load_hf(str(complete(folder, target_name)), dtype="fp32", device="cpu")
        model.eval()
        with torch.no_grad():
            results[folder] = draft_model.agreement(
                lambda ids, rows: model(input_ids=ids[None]).logits[0, rows], held_out)
    return results, held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("method", choices=["dflash", "dspark", "draft_model"])
    parser.add_argument("folders", nargs="+", help="checkpoint folders to score")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--per-source", type=int, default=None,
                        help="score at most N held-out examples of each prompt source (default: all)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    if args.method == "draft_model":
        results, held_out = score_draft_models(args.folders, args.target, args.per_source)
    else:
        target = load(args.target, dtype="bf16", device="cpu")  # the dtype the trainers tap in
        results, held_out = score_block_drafters(args.method, args.folders, target, args.per_source)
    first = slice(0, 1) if args.method == "draft_model" else slice(1, 4)  # block slot 0 is the anchor
    for folder, scores in results.items():
        print(folder)
        for key, acc in scores.items():
            print(f"  {key:14} " + " ".join(f"{a:.3f}" for a in acc[first]))
    if args.json:
        sources = [prompt_source(ex.id) for ex in held_out]
        record = {"method": args.method, "held_out_examples": len(held_out),
                  "per_source_examples": {s: sources.count(s) for s in sorted(set(sources))},
                  "results": results}
        if args.method != "draft_model":
            record["anchors_per_example"] = dflash.EVAL_ANCHORS
        write_text_atomic(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
