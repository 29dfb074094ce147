"""Graft a native-MTP head (Qwen3.5 shape) onto a target trained without one.

SmolLM2-135M has no MTP layers, so we bolt on the Qwen3.5 ones and train only
them, with the target frozen. That is a *graft*: the target's hidden states
were never shaped to help a next-next-token predictor, while a natively
trained MTP model (DeepSeek-V3, Qwen3.5) learns its main stack and MTP layers
together, and its last hidden state carries what the MTP layer needs.

The recipe (FastMTP, as speculators fine-tunes MTP):

* one MTP layer applied recursively K times (steps k = 0..K-1);
* teacher forcing: step k at position t reads the TRUE token x_{t+k+1} and
  the previous step's output (step 0: the target's post-norm hidden state
  h_t), and predicts x_{t+k+2} with cross-entropy;
* step weights beta^k / sum (beta = 0.6): the first prediction matters most,
  since a rejection there ends the round;
* loss only on response tokens (the target's own answers, `train/data.py`).

Each step is the drafter's own `MTPStep` (drafters/mtp.py), so training and
drafting run the same code, fed-back state included. The drafter then runs
with depth=K (`MTPDrafter`), each step with its own cache over the committed
positions, exactly as in training.

    specdec train mtp --target smollm2-135m --steps 2000 --budget-min 30

Resumable (train/loop.py: the state lives under ``$SPECDEC_CACHE/train/mtp-<target>/``);
the head goes to ``specdec_learn/checkpoints/mtp-<target>/`` in bf16.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoints import shipped_folder
from ..drafters.mtp import MTPHead, save_mtp
from ..tree import causal_mask
from .features import training_data
from .loop import Budget, Run, export as export_folder, recipe, train_loop, work_dir_for
from .sources import add_share_argument, example_picker, source_weights


def graft_head(target) -> MTPHead:
    """A Qwen3.5-shape head whose layer starts as a copy of the target's last layer.

    ``fc`` starts as [0 | I]: the head first passes the target's state through,
    so training starts from "the last layer once more" rather than from noise.
    """
    head = MTPHead(target, num_layers=1, layout="qwen3_next")
    head.layers[0].load_state_dict(target.decoder.layers[-1].state_dict())
    H = target.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, H:] = torch.eye(H)
        head.fc.weight[:, :H].normal_(std=0.02)
    return head.to(device=target.device, dtype=torch.float32)


# --- the loss -------------------------------------------------------------------------------


def mtp_loss(head: MTPHead, target, ids: torch.Tensor, mask: torch.Tensor, h: torch.Tensor,
             depth: int, beta: float, max_rows: int | None, generator=None):
    """Teacher-forced loss over one example. ids, mask: [T]; h: [T, H] post-norm target states.

    Returns (weighted loss, or None when no row carries a loss; per-step accuracy list).
    """
    T = ids.shape[0]
    weights = [beta**k for k in range(depth)]
    prev = h[:-1][None]  # [1, T-1, H]: h_t for t = 0..T-2
    loss, accs = None, []
    for k in range(depth):
        n = T - 1 - k  # positions t = 0..n-1 read x_{t+k+1}
        if n < 2:
            break
        step = head.step(k % head.num_layers)  # layer k % n at step k, as the drafter runs it
        e = head.embed(ids[k + 1 : k + 1 + n][None])  # [1, n, H]
        positions = torch.arange(n, device=ids.device)[None]
        out, prev = step.hidden(e, prev[:, :n], target.rotary(e, positions),
                                causal_mask(0, n, e.dtype, e.device), None)  # [1, n, H] each
        # position t predicts x_{t+k+2}: rows 0..n-2, on response tokens only
        labels = ids[k + 2 : k + 1 + n]  # [n-1]
        rows = mask[k + 2 : k + 1 + n].nonzero().squeeze(1)
        if max_rows is not None and rows.numel() > max_rows:
            rows = rows[torch.randperm(rows.numel(), generator=generator, device="cpu")[:max_rows].to(rows.device)]
        if rows.numel():
            logits = step.head(out[0, rows])  # [r, V]: the LM head on the sampled rows only
            term = weights[k] * F.cross_entropy(logits.float(), labels[rows])
            loss = term if loss is None else loss + term
            accs.append(float((logits.argmax(-1) == labels[rows]).float().mean()))
    return (None if loss is None else loss / sum(weights)), accs


@torch.no_grad()
def evaluate(head, target, feats, depth: int) -> list[float]:
    """Teacher-forced top-1 accuracy of each chained step over `feats` (mean over examples)."""
    totals = []
    for f in feats:
        totals.append(mtp_loss(head, target, f.ids.to(target.device), f.loss_mask.to(target.device),
                               f.last.float().to(target.device), depth, 0.6, None)[1])
    return [round(sum(a[k] for a in totals if len(a) > k) / max(1, sum(len(a) > k for a in totals)), 3)
            for k in range(depth)]


# --- training: data -> loss -> the loop ------------------------------------------------------


def train(target, steps: int = 2000, depth: int = 3, beta: float = 0.6, lr: float = 1e-3, max_rows: int | None = 64,
          budget_min: float | None = None, save_every: int = 50, work_dir=None, data_dir=None, seed: int = 0,
          progress: bool = True, log=print, eval_every: int | None = None,
          templated_share: float | None = None) -> tuple[MTPHead, Run]:
    """Graft, then train the head on the target's answers; resumes from the work dir. -> (head, Run).

    templated_share: the fraction of steps that read a templated example (sources.source_weights; default: each
    example once per epoch, in a seeded order).
    """
    data = training_data(target, data_dir=data_dir, progress=progress)  # h = features.last, post-norm
    target.model.requires_grad_(False)
    head = graft_head(target)
    order = list(range(len(data.train)))
    random.Random(seed).shuffle(order)
    pick = example_picker(order, None if templated_share is None else source_weights(data.examples, templated_share))

    def loss(step, generator):
        f = data.train[pick(step, generator)]  # one example per step
        ids, mask = f.ids.to(target.device), f.loss_mask.to(target.device)
        value, accs = mtp_loss(head, target, ids, mask, f.last.float().to(target.device), depth, beta, max_rows,
                               generator)
        return value, {"acc": accs, "tokens": len(ids)}

    run = train_loop(head, loss, Budget(steps, budget_min), work_dir_for(target.name, "mtp", work_dir), lr=lr,
                     evaluate=lambda: {"acc": evaluate(head, target, data.eval[:20], depth)}, save_every=save_every,
                     eval_every=eval_every, log_every=10, seed=seed, data=data.record, progress=progress, log=log,
                     config={"depth": depth, "beta": beta, "max_rows": max_rows, "templated_share": templated_share})
    return head, run


# --- export ------------------------------------------------------------------------------------


def export(head, target, out_dir, run, command: str | None = None) -> Path:
    """The shipped graft: mtp.safetensors (Qwen3.5 names, bf16) + config.json, and recipe.json beside them."""
    depth = run.config["depth"]
    extra = {"model_type": "mtp_graft", "target": Path(str(target.name)).name, "mtp_chain_depth": depth,
             "hidden_size": target.hidden_size}
    return export_folder(out_dir, lambda tmp: save_mtp(head, tmp, target, config_extra=extra, dtype=torch.bfloat16),
                         recipe(run, "mtp", target, command))


# --- the command line: specdec train mtp ---------------------------------------------------------

DEFAULTS = {"steps": 2000, "lr": 1e-3}


def add_arguments(p) -> None:
    p.add_argument("--depth", type=int, default=3, help="recursive MTP steps trained (K)")
    p.add_argument("--beta", type=float, default=0.6, help="step k's loss weight is beta**k")
    p.add_argument("--max-rows", type=int, default=64, help="loss positions sampled per example and step")
    add_share_argument(p)


def cli(args, command: str) -> Path:
    from ..target import load

    target = load(args.target, dtype="fp32", device=args.device, invariant=False)  # trains through its fp32 layers
    head, run = train(target, args.steps, args.depth, args.beta, args.lr, args.max_rows, args.budget_min,
                      work_dir=args.work_dir, data_dir=args.data_dir, seed=args.seed, progress=not args.no_progress,
                      eval_every=args.eval_every, templated_share=args.templated_share)
    return export(head, target, args.out or shipped_folder("mtp", target.name), run, command)
