"""Training a DSpark drafter: DFlash's blocks, shifted by one, and three losses.

The blocks, anchors and block mask are DFlash's (train/dflash.py). What
changes:

* **Slots.** Slot k learns x_{p+k+1} (the anchor's slot already predicts),
  so every slot has a label, weighted exp(-k/γ) from k = 0 (DeepSpec).
* **The Markov head, teacher-forced.** At decode time slot k's bias comes
  from the token drafted at slot k-1; in training we feed the true one:
  prev = [x_p, x_{p+1}, ..., x_{p+B-1}], all slots in parallel.
* **Loss** (DeepSpec's recipe):

      0.1 · CE(q_k, x_{p+k+1})         the right token
    + 0.9 · TV(q_k, p_k)               match the target's whole distribution
    + 1.0 · BCE(c_k, 1 - TV(q_k, p_k)) the confidence head learns the
                                        acceptance rate it will face

  where q_k is the draft's distribution (base logits + Markov bias), p_k the
  target's at the same position, read from the target's last tap through its
  final norm and LM head, and 1 - TV(q, p) = Σ min(p, q) is exactly the
  chance that a draft sampled from q is accepted by the rejection sampler.

Data, anchors, the loop and the export are DFlash's (train/dflash.py,
train/loop.py); this file is the loss.

    specdec train dspark --layers 1 --block-size 7 --markov-rank 32 --steps 2000 --budget-min 30 --threads 1
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoints import shipped_folder
from ..drafters.dspark import DSparkModel, dspark_config, load_dspark, save_dspark
from .dflash import (
    block_hidden,
    block_labels,
    block_step,
    evaluate,
    frozen_parts,
    init_from_target,
    position_weights,
    shared_taps,
    slot_accuracy,
)
from .features import training_data
from .loop import Budget, Run, export as export_folder, recipe, train_loop, warm_start, work_dir_for
from .sources import add_share_argument, prompt_source, source_weights


def dspark_loss(model: DSparkModel, embed, lm_head, taps, last, input_ids, loss_mask, anchors,
                gamma: float = 4.0, weights=(0.1, 0.9, 1.0)):
    """(loss, {"acc", "tv"}) for one example's blocks; see the module docstring.

    last [T, H]: the target's final-normed last state, so lm_head(last[i]) are
    the target's logits for the token after position i.
    """
    B, T = model.block_size, len(input_ids)
    hidden = block_hidden(model, embed, taps, input_ids, anchors)  # [A, B, H]
    labels, valid = block_labels(input_ids, loss_mask, anchors, B, shift=1)  # [A, B]
    at = (anchors[:, None] + torch.arange(B)[None, :]).clamp(max=T - 1)  # [A, B] slot k's own position p+k
    prev = input_ids[at]  # [A, B] teacher-forced previous tokens: x_p, x_{p+1}, ...
    # Only the rows that carry a loss go through the (costly) LM head.
    h, prev_kept, lab = hidden[valid], prev[valid], labels[valid]  # [n, H], [n], [n]
    logits = lm_head(h).float()  # [n, V]
    if model.markov_head is not None:
        logits = logits + model.markov_head(prev_kept).float()
    q = logits.softmax(-1)
    with torch.no_grad():
        p = lm_head(last[at[valid]].float()).softmax(-1)  # [n, V] the target's next-token distribution
    tv = 0.5 * (p - q).abs().sum(-1)  # [n]
    ce = F.cross_entropy(logits, lab, reduction="none")  # [n]
    per_row = weights[0] * ce + weights[1] * tv
    if model.confidence_head is not None:
        c_logits = model.confidence_logits(h, prev_kept).float()  # [n]
        per_row = per_row + weights[2] * F.binary_cross_entropy_with_logits(c_logits, (1.0 - tv).detach(), reduction="none")
    w = (position_weights(B, gamma, first=0)[None, :] * valid)[valid]  # [n]
    loss = (per_row * w).sum() / w.sum().clamp(min=1e-6)
    return loss, {"acc": slot_accuracy(logits, labels, valid), "tv": tv.mean()}


# settings a checkpoint must share with a run that starts from it (no tensor's shape shows them)
STARTS_FROM = ("block_size", "target_layer_ids", "mask_token_id", "markov_head_type", "confidence_head_with_markov")


# --- training: data -> loss -> the loop -------------------------------------------------------


def train(target, layers: int = 1, block_size: int = 7, markov_rank: int = 32, steps: int = 2000, lr: float = 1e-3,
          budget_min: float | None = None, num_anchors: int = 16, gamma: float = 4.0, seed: int = 0, init: bool = True,
          work_dir=None, data_dir=None, progress: bool = True, log=print,
          eval_every: int | None = None, templated_share: float | None = None,
          init_from=None) -> tuple[DSparkModel, Run]:
    """Train (or resume) a DSpark drafter on the target's answers. -> (model, Run).

    templated_share: the fraction of steps that read a templated example (sources.source_weights; default: uniform).
    init_from: a DSpark checkpoint folder of the same shape to start from (loop.warm_start) instead of the
    target's last layer; `init` is then unused.
    """
    taps = shared_taps(target)
    data = training_data(target, taps, data_dir=data_dir, progress=progress)
    torch.manual_seed(seed)
    cfg = dspark_config(target, num_layers=layers, block_size=block_size, markov_rank=markov_rank,
                        target_layer_ids=[t - 1 for t in taps])
    model = DSparkModel(cfg).float()
    if model.markov_head is not None:
        torch.nn.init.normal_(model.markov_head.markov_w1.weight, std=0.02)
        torch.nn.init.zeros_(model.markov_head.markov_w2.weight)  # start with no bias: the pure backbone
    start = None
    if init_from is not None:
        start = warm_start(model, load_dspark(init_from), init_from, "DSpark checkpoint",
                           {key: getattr(cfg, key) for key in STARTS_FROM})
    elif init:
        init_from_target(model, target)
    embed, lm_head = frozen_parts(target)

    def example_loss(f, anchors):
        return dspark_loss(model, embed, lm_head, f.taps.float(), f.last, f.ids, f.loss_mask, anchors, gamma)

    config = {"layers": layers, "block_size": block_size, "markov_rank": markov_rank, "num_anchors": num_anchors,
              "gamma": gamma, "taps": list(taps), "init_from_target": init and start is None,
              "templated_share": templated_share}
    if start is not None:
        config["init_from"] = start
    weights = None if templated_share is None else source_weights(data.examples, templated_share)
    sources = [prompt_source(ex.id) for ex in data.held_out]
    run = train_loop(model, block_step(data.train, num_anchors, example_loss, weights), Budget(steps, budget_min),
                     work_dir_for(target.name, "dspark", work_dir), lr=lr, betas=(0.9, 0.95), save_every=100,
                     evaluate=lambda: evaluate(example_loss, data.eval, block_size, seed, sources),
                     eval_every=eval_every, seed=seed, config=config, data=data.record, progress=progress, log=log)
    return model, run


# --- export ------------------------------------------------------------------------------------


def export(model: DSparkModel, target, out_dir, run: Run, command: str | None = None) -> Path:
    """The speculators-format folder (its config names the target as verifier; bf16) and recipe.json beside it."""
    return export_folder(out_dir, lambda tmp: save_dspark(model, tmp, format="speculators", target=target),
                         recipe(run, "dspark", target, command))


# --- the command line: specdec train dspark --------------------------------------------------------

DEFAULTS = {"steps": 2000, "lr": 1e-3}


def add_arguments(p) -> None:
    p.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default="bf16",
                   help="dtype of the target that computes the taps (cached per dtype)")
    p.add_argument("--layers", type=int, default=1, help="draft decoder layers")
    p.add_argument("--block-size", type=int, default=7, help="B: the block drafts up to B tokens")
    p.add_argument("--markov-rank", type=int, default=32, help="rank of the Markov head's bias (0: none)")
    p.add_argument("--anchors", type=int, default=16, help="blocks per example and step")
    p.add_argument("--gamma", type=float, default=4.0, help="slot k's weight is exp(-k/gamma)")
    p.add_argument("--init-from", default=None, metavar="FOLDER",
                   help="start from this DSpark checkpoint's weights (e.g. the shipped one), with a new optimiser "
                        "and schedule: to train a drafter on when the state of its run is gone")
    add_share_argument(p)


def cli(args, command: str) -> Path:
    from ..target import load

    target = load(args.target, dtype=args.dtype, device=args.device, invariant=False)  # features.py: whole examples
    out = Path(args.out or shipped_folder("dspark", target.name))
    if args.init_from and Path(args.init_from).resolve() == out.resolve():
        raise ValueError(f"--init-from {args.init_from} is where this run would write its drafter: give --out "
                         "another folder, so the checkpoint it starts from stays as its recipe names it.")
    model, run = train(target, args.layers, args.block_size, args.markov_rank, args.steps, args.lr, args.budget_min,
                       args.anchors, args.gamma, args.seed, work_dir=args.work_dir, data_dir=args.data_dir,
                       progress=not args.no_progress, eval_every=args.eval_every,
                       templated_share=args.templated_share, init_from=args.init_from)
    return export(model, target, out, run, command)
