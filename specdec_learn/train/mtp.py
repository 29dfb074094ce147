"""Graft a native-MTP head (Qwen3.5 shape) onto a target trained without one.

SmolLM2-135M has no MTP layers, so we bolt on the Qwen3.5 ones and train only
them, with the target frozen. That is a *graft*: the target's hidden states
were never shaped to help a next-next-token predictor, while a natively
trained MTP model (DeepSeek-V3, Qwen3.5) learns its main stack and MTP layers
together, and its last hidden state carries what the MTP layer needs.

The recipe (FastMTP, as speculators fine-tunes MTP; methods.md §2):

* one MTP layer applied recursively K times (steps k = 0..K-1);
* teacher forcing: step k at position t reads the TRUE token x_{t+k+1} and
  the previous step's output (step 0: the target's post-norm hidden state
  h_t), and predicts x_{t+k+2} with cross-entropy;
* step weights beta^k / sum (beta = 0.6): the first prediction matters most,
  since a rejection there ends the round;
* loss only on response tokens (the target's own answers, `train/data.py`).

The drafter then runs with depth=K (`MTPDrafter`), each step with its own
cache over the committed positions, exactly as in training.

    python -m specdec_learn.train.mtp --target smollm2-135m --budget-min 30

Resumable: the state is saved every `--save-every` steps under
``$SPECDEC_CACHE/train/mtp-<target>/``; running the command again continues.
The shipped head goes to ``specdec_learn/checkpoints/mtp-<target>/`` in bf16.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoints import shipped_folder
from ..drafters.mtp import MTPHead, causal_mask, rotary, save_mtp
from .data import capture_taps, training_split, work_dir_for
from .schedule import load_state, save_state, set_lr, warmup_cosine



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


def mtp_loss(head: MTPHead, target, ids: torch.Tensor, mask: torch.Tensor, h: torch.Tensor,
             depth: int, beta: float, max_rows: int | None, generator=None):
    """Teacher-forced loss over one example. ids, mask: [T]; h: [T, H] post-norm target states.

    Returns (weighted loss, per-step accuracy list).
    """
    T = ids.shape[0]
    weights = [beta**k for k in range(depth)]
    prev = h[:-1][None]  # [1, T-1, H]: h_t for t = 0..T-2
    loss, accs = 0.0, []
    for k in range(depth):
        n = T - 1 - k  # positions t = 0..n-1 read x_{t+k+1}
        if n < 2:
            break
        e = head.embed(ids[k + 1 : k + 1 + n][None])  # [1, n, H]
        positions = torch.arange(n, device=ids.device)[None]
        step = head.step(0)
        logits_fn = step.head
        x = step.proj(torch.cat([step.enorm(e), step.hnorm(prev[:, :n])], dim=-1))  # [1, n, H]
        x = step.layer(x, position_embeddings=rotary(target, e, positions),
                       attention_mask=causal_mask(0, n, x.dtype, x.device), past_key_values=None)
        out = step.out_norm(x)  # [1, n, H], fed back
        # position t predicts x_{t+k+2}: rows 0..n-2, on response tokens only
        labels = ids[k + 2 : k + 1 + n]  # [n-1]
        rows = mask[k + 2 : k + 1 + n].nonzero().squeeze(1)
        if max_rows is not None and rows.numel() > max_rows:
            rows = rows[torch.randperm(rows.numel(), generator=generator)[:max_rows]]
        if rows.numel():
            logits = logits_fn(out[0, rows])  # [r, V]
            loss = loss + weights[k] * F.cross_entropy(logits.float(), labels[rows])
            accs.append(float((logits.argmax(-1) == labels[rows]).float().mean()))
        prev = out
    return loss / sum(weights), accs


def train(target, steps: int, depth: int = 3, beta: float = 0.6, lr: float = 1e-3, max_rows: int = 64,
          budget_s: float | None = None, save_every: int = 50, work_dir=None, data_dir=None, seed: int = 0,
          log=print) -> MTPHead:
    name = Path(str(target.name)).name
    work_dir = work_dir_for(name, "mtp", work_dir)
    examples, held_out = training_split(name, data_dir)
    target.model.requires_grad_(False)
    head = graft_head(target)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    state_file, step = work_dir / "state.pt", 0
    if saved := load_state(state_file, log):
        head.load_state_dict(saved["head"]), opt.load_state_dict(saved["opt"])
        step = saved["step"]
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    gen = torch.Generator().manual_seed(seed + step)
    L, t0, features = target.num_layers, time.perf_counter(), {}
    head.train()
    while step < steps and (budget_s is None or time.perf_counter() - t0 < budget_s):
        i = order[step % len(order)]
        ex = examples[i]
        ids = torch.tensor(ex.input_ids, device=target.device)
        mask = torch.tensor(ex.loss_mask, device=target.device)
        if i not in features:  # one target forward per example, kept for the next epochs (bf16)
            with torch.no_grad():
                features[i] = target.final_norm(capture_taps(target, ex, (L,))[L]).to(torch.bfloat16)
        h = features[i].float()  # [T, H]
        set_lr(opt, warmup_cosine(step, steps, lr))
        loss, accs = mtp_loss(head, target, ids, mask, h, depth, beta, max_rows, gen)
        if torch.is_tensor(loss):
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
        step += 1
        if step % 10 == 0 and torch.is_tensor(loss):
            log(f"{time.perf_counter() - t0:.0f}s step {step} loss {float(loss.detach()):.3f} "
                f"acc/step {[round(a, 2) for a in accs]}")
        if step % save_every == 0:
            save_state(state_file, head=head.state_dict(), opt=opt.state_dict(), step=step)
    save_state(state_file, head=head.state_dict(), opt=opt.state_dict(), step=step)
    head.eval()
    log(f"held-out teacher-forced accuracy per step: {evaluate(head, target, held_out[:20], depth)}")
    return head, step


@torch.no_grad()
def evaluate(head, target, examples, depth: int) -> list[float]:
    L, totals = target.num_layers, []
    for ex in examples:
        ids = torch.tensor(ex.input_ids, device=target.device)
        mask = torch.tensor(ex.loss_mask, device=target.device)
        h = target.final_norm(capture_taps(target, ex, (L,))[L]).float()
        totals.append(mtp_loss(head, target, ids, mask, h, depth, 0.6, None)[1])
    return [round(sum(a[k] for a in totals if len(a) > k) / max(1, sum(len(a) > k for a in totals)), 3)
            for k in range(depth)]


def export(head, target, out_dir, depth: int, info: dict) -> Path:
    """The shipped graft: mtp.safetensors (Qwen3.5 names, bf16) + config.json."""
    out_dir = Path(out_dir)
    extra = {"model_type": "mtp_graft", "target": Path(str(target.name)).name, "mtp_chain_depth": depth,
             "hidden_size": target.hidden_size, "training": info}
    return save_mtp(head, out_dir, target, config_extra=extra, dtype=torch.bfloat16)


def main(argv=None):
    from ..target import load

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--depth", type=int, default=3, help="recursive MTP steps trained (K)")
    p.add_argument("--beta", type=float, default=0.6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-rows", type=int, default=64, help="loss positions sampled per example and step")
    p.add_argument("--budget-min", type=float, default=None, help="stop after this many minutes (resumable)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="export folder (default: checkpoints/mtp-<target>)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load(args.target, dtype="fp32", device="cpu")
    head, step = train(target, args.steps, args.depth, args.beta, args.lr, args.max_rows,
                       budget_s=args.budget_min * 60 if args.budget_min else None)
    name = Path(args.target).name
    info = {"steps": step, "depth": args.depth, "beta": args.beta, "lr": args.lr, "max_rows": args.max_rows,
            "command": f"python -m specdec_learn.train.mtp --target {args.target} --steps {args.steps} "
                       f"--depth {args.depth} --budget-min {args.budget_min} --threads {args.threads}"}
    out = export(head, target, args.out or shipped_folder("mtp", name), args.depth, info)
    print(json.dumps({"exported": str(out), "steps": step}))


if __name__ == "__main__":
    main()
