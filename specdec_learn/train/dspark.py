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

    python -m specdec_learn.train.dspark --out specdec_learn/checkpoints/dspark-smollm2-135m \
        --layers 1 --block-size 7 --markov-rank 32 --steps 2000 --budget-min 30 --threads 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafters.dspark import DSparkModel, dspark_config, save_dspark
from .dflash import (
    block_hidden,
    block_labels,
    frozen_parts,
    init_from_target,
    load_features,
    position_weights,
    run_from_cli,
    shared_taps,
    slot_accuracy,
    state_file_for,
    train_loop,
)


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


def train_dspark(target, out_dir, data_dir=None, layers=1, block_size=7, markov_rank=32, steps=2000, lr=1e-3,
                 budget_s=None, num_anchors=16, gamma=4.0, seed=0, init=True) -> tuple[DSparkModel, dict]:
    """Train (or resume) a DSpark drafter (speculators format, in out_dir). -> (model, log)."""
    train_feats, eval_feats = load_features(target, data_dir)
    taps = shared_taps(target)
    torch.manual_seed(seed)
    cfg = dspark_config(target, num_layers=layers, block_size=block_size, markov_rank=markov_rank,
                        target_layer_ids=[t - 1 for t in taps])
    model = DSparkModel(cfg).float()
    if model.markov_head is not None:
        torch.nn.init.normal_(model.markov_head.markov_w1.weight, std=0.02)
        torch.nn.init.zeros_(model.markov_head.markov_w2.weight)  # start with no bias: the pure backbone
    if init:
        init_from_target(model, target)
    embed, lm_head = frozen_parts(target)

    def loss_fn(m, f, anchors):
        return dspark_loss(m, embed, lm_head, f.taps.float(), f.last, f.ids, f.loss_mask, anchors, gamma)

    log = train_loop(model, loss_fn, train_feats, eval_feats, Path(out_dir), state_file_for(target, out_dir),
                     save_checkpoint, steps, lr, budget_s, num_anchors, seed)
    return model, log


def save_checkpoint(model, out_dir):
    save_dspark(model, out_dir, format="speculators")


def main(argv=None) -> int:
    from ..target import load

    p = argparse.ArgumentParser(description="Train a DSpark drafter on the target's own responses.")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", default=None, help="dataset folder (default: $SPECDEC_CACHE/data/<model>)")
    p.add_argument("--out", required=True,
                   help="checkpoint folder (speculators format); the resumable state goes under $SPECDEC_CACHE/train/")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=7)
    p.add_argument("--markov-rank", type=int, default=32)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--anchors", type=int, default=16)
    p.add_argument("--target-dtype", default="bf16", help="dtype of the target that computes the taps (cached per dtype)")
    p.add_argument("--gamma", type=float, default=4.0)
    p.add_argument("--budget-min", type=float, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    target = load(a.model, dtype=a.target_dtype, device="cpu")
    train_dspark(target, a.out, a.data, a.layers, a.block_size, a.markov_rank, a.steps, a.lr,
                 a.budget_min * 60 if a.budget_min else None, a.anchors, a.gamma, a.seed)
    return 0


def cli(args) -> int:
    """`specdec train dspark`: the same recipe with the shared `train` arguments (sizes at their defaults)."""
    return run_from_cli(args, "dspark", train_dspark, "speculators-format")


if __name__ == "__main__":
    raise SystemExit(main())
