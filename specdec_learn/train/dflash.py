"""Training a DFlash drafter on the target's own text.

One training example is one target response (data.py): its token ids, the
loss mask (True on response tokens) and the target's taps over it, from ONE
target forward. From it we cut many practice rounds at once:

1. **Random anchors.** Pick up to `num_anchors` positions p inside the
   response (p and p + 1 both loss-masked). Each anchor is one round the
   drafter might face at decode time: everything before p committed, x_p
   just chosen.
2. **Blocks.** Each anchor gets a block ``[x_p, MASK x (B-1)]`` at positions
   p..p+B-1. All blocks go through the draft in ONE forward, as extra query
   rows over the same context K/V.
3. **The block mask.** A block row may see the context strictly before its
   anchor (what the target had committed) and its own block (not causal),
   never another block and never the future text.
4. **Labels and weights.** Slot k learns x_{p+k} (k = 1..B-1; slot 0 is the
   anchor and gets no loss), and only while the labels stay inside the
   response. Early slots matter most (a late slot counts only when every
   slot before it was accepted), so slot k is weighted exp(-(k-1)/γ).

The same helpers serve DSpark (train/dspark.py), whose slots are shifted by
one: slot k learns x_{p+k+1}.

The loop (`train_loop`) is deliberately plain: one example per step, AdamW,
warm-up then cosine, a resumable state file, a time budget. The taps come
from the same pipeline and disk cache as EAGLE-3's (`load_features`): the
target runs once per example for every learned drafter.

    python -m specdec_learn.train.dflash --out specdec_learn/checkpoints/dflash-smollm2-135m \
        --layers 1 --block-size 16 --steps 3000 --budget-min 40 --threads 1
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafters.dflash import DFlashModel, draft_config, save_dflash
from .data import default_dir, load_examples, split_examples
from .schedule import load_state, save_state

# --- the blocks of one example --------------------------------------------------


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to `num_anchors` random positions p with p and p+1 in the response -> sorted [A]."""
    ok = loss_mask[:-1] & loss_mask[1:]  # [T-1]: the anchor and its first label are response tokens
    candidates = ok.nonzero().squeeze(-1)  # [C]
    order = torch.randperm(len(candidates), generator=generator)[:num_anchors]
    return candidates[order].sort().values


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int):
    """Token ids and positions of every block, flattened: ([A*B], [A*B])."""
    offsets = torch.arange(block_size)
    positions = (anchors[:, None] + offsets).reshape(-1)  # [A*B]
    ids = torch.full((len(anchors), block_size), mask_token_id, dtype=torch.long)
    ids[:, 0] = input_ids[anchors]
    return ids.reshape(-1), positions


def block_mask(anchors: torch.Tensor, block_size: int, context_len: int) -> torch.Tensor:
    """[A*B, T + A*B] bool: a block row sees context positions < its anchor, and its own block."""
    A = len(anchors)
    row_anchor = anchors.repeat_interleave(block_size)  # [A*B]
    sees_context = torch.arange(context_len)[None, :] < row_anchor[:, None]  # [A*B, T]
    row_block = torch.arange(A).repeat_interleave(block_size)  # [A*B]
    sees_block = row_block[:, None] == row_block[None, :]  # [A*B, A*B]
    return torch.cat([sees_context, sees_block], dim=1)


def block_labels(input_ids, loss_mask, anchors, block_size: int, shift: int):
    """Slot k's label x_{p+k+shift} and whether it counts: ([A, B] ids, [A, B] bool).

    A label counts while it stays inside the sequence AND the response, and
    only as a contiguous prefix (a later slot is never judged past a gap).
    """
    T = len(input_ids)
    idx = anchors[:, None] + torch.arange(block_size)[None, :] + shift  # [A, B]
    inside = idx < T
    safe = idx.clamp(max=T - 1)
    valid = inside & loss_mask[safe]
    return input_ids[safe], valid.int().cumprod(dim=1).bool()


def position_weights(block_size: int, gamma: float, first: int, last: int | None = None) -> torch.Tensor:
    """[B]: exp(-(k - first)/γ) for slots first <= k <= last, 0 elsewhere (DFlash: first=1; DSpark: first=0).

    `last` < B-1 spends the LM head (the costly part) on the early slots only,
    which a small, briefly trained drafter can still get right; the anchors
    saved go to more examples of those slots.
    """
    k = torch.arange(block_size, dtype=torch.float32)
    inside = (k >= first) & (k <= (block_size - 1 if last is None else last))
    return torch.where(inside, torch.exp(-(k - first) / gamma), torch.zeros(()))


def block_hidden(model: DFlashModel, embed, taps: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor):
    """Every block through the draft in one forward -> hidden states [A, B, H]."""
    B, T = model.block_size, len(input_ids)
    ids, positions = block_inputs(input_ids, anchors, B, int(model.config.mask_token_id))
    ctx_kv = model.context_kv(taps, torch.arange(T))
    hidden = model(embed(ids), positions, ctx_kv, mask=block_mask(anchors, B, T))  # [A*B, H]
    return hidden.view(len(anchors), B, -1)


def dflash_loss(model, embed, lm_head, taps, input_ids, loss_mask, anchors, gamma: float = 4.0,
                loss_slots: int | None = None):
    """Weighted cross-entropy of slots 1..B-1 -> (loss, {"acc": per-slot top-1 accuracy [B]}).

    The LM head (49,152 x 576 for SmolLM2) is the costly part on a CPU, so it
    runs only on the rows that carry a loss (not slot 0, not past the response).
    """
    B = model.block_size
    hidden = block_hidden(model, embed, taps, input_ids, anchors)  # [A, B, H]
    labels, valid = block_labels(input_ids, loss_mask, anchors, B, shift=0)  # [A, B]
    weights = position_weights(B, gamma, first=1, last=loss_slots)[None, :] * valid  # [A, B]
    keep = weights > 0  # [A, B]
    logits = lm_head(hidden[keep]).float()  # [n, V]
    ce = F.cross_entropy(logits, labels[keep], reduction="none")  # [n]
    loss = (ce * weights[keep]).sum() / weights[keep].sum().clamp(min=1e-6)
    return loss, {"acc": slot_accuracy(logits, labels, keep)}


def slot_accuracy(logits, labels, keep) -> torch.Tensor:
    """Top-1 accuracy per slot: logits [n, V] for the `keep` [A, B] rows -> [B] (nan: no rows)."""
    hit = torch.zeros_like(keep)
    hit[keep] = logits.argmax(-1) == labels[keep]
    return hit.sum(0).float() / keep.sum(0).float()


# --- the target's taps: the pipeline EAGLE-3 uses ---------------------------------------


def shared_taps(target) -> tuple[int, ...]:
    """EAGLE-3's taps (2, 15, 27 for SmolLM2): using them too lets one tap cache serve every drafter.

    As DFlash layer ids (output of layer i = tap i + 1) these are 1, 14, 26,
    close to z-lab's default spread (1, 14, 27).
    """
    from ..drafters.eagle3 import default_taps

    return tuple(default_taps(target.num_layers))


def load_features(target, data_dir=None):
    """(train, held-out) Features of the dataset: taps + the target's last state, cached on disk.

    This is data.capture, the EAGLE-3 recipe's capture, and its cache folder
    (data_dir/taps-<taps>-<dtype>): the target runs once per example for all
    three learned drafters.
    """
    from .data import capture

    data_dir = Path(data_dir or default_dir(target.name))
    examples = load_examples(data_dir)
    if not examples:
        raise FileNotFoundError(
            f"No training examples in {data_dir}: build them first with "
            "specdec_learn.train.data.build_dataset(target, out_dir, training_prompts())."
        )
    train_ex, eval_ex = split_examples(examples)
    taps = shared_taps(target)
    cache = data_dir / f"taps-{'-'.join(map(str, taps))}-{str(target.dtype).removeprefix('torch.')}"
    return capture(target, train_ex, taps, cache), capture(target, eval_ex, taps, cache)


# --- initialisation --------------------------------------------------------------


@torch.no_grad()
def init_from_target(model: DFlashModel, target) -> None:
    """Start the draft layers as copies of the target's LAST layers, and its norm as the target's.

    A short CPU run cannot train layers from scratch; the target's last
    layers already map a residual stream to "next token" features that its
    LM head reads. Qwen3's q_norm/k_norm (absent in Llama) start as ones.
    fc and hidden_norm stay random: nothing in the target corresponds.
    """
    src_layers = target.decoder.layers[-len(model.layers) :]
    for dst, src in zip(model.layers, src_layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(dst.self_attn, name).weight.copy_(getattr(src.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(dst.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
        dst.input_layernorm.weight.copy_(src.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
    model.norm.weight.copy_(target.final_norm.weight)


# --- the loop (shared with DSpark) -------------------------------------------------


def train_loop(model, loss_fn, train_feats, eval_feats, out_dir: Path, state_file: Path, save, steps: int, lr: float,
               budget_s: float | None, num_anchors: int, seed: int = 0, log_every: int = 25, save_every: int = 100):
    """Resumable AdamW loop, one example per step; `save(model, out_dir)` writes the checkpoint.

    loss_fn(model, features, anchors) -> (loss, {"acc": [B], ...}).
    State (weights, optimiser, step) lives in `state_file` (under
    $SPECDEC_CACHE/train/, out of the shipped folder); a new run with the same
    out_dir continues from it. Returns {"history": [(loss, acc)], "eval_acc": [B]}.
    """
    state_file.parent.mkdir(parents=True, exist_ok=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    step = 0
    if state := load_state(state_file):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    warmup = min(50, steps // 10)

    def lr_at(s):
        if s < warmup:
            return lr * (s + 1) / warmup
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, steps - warmup)))))

    gen = torch.Generator().manual_seed(seed + step)
    start, history = time.perf_counter(), []
    model.train()
    while step < steps:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            print(f"time budget reached at step {step}")
            break
        feats = train_feats[int(torch.randint(len(train_feats), (1,), generator=gen))]
        anchors = sample_anchors(feats.loss_mask, num_anchors, gen)
        if len(anchors) == 0:
            continue
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss, metrics = loss_fn(model, feats, anchors)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        history.append((loss.item(), metrics["acc"]))
        if step % log_every == 0:
            recent = history[-log_every:]
            acc = torch.nanmean(torch.stack([a for _, a in recent]), dim=0)
            print(f"step {step} loss {sum(l for l, _ in recent) / len(recent):.3f} "
                  f"slot acc {' '.join(f'{a:.2f}' for a in acc[:8].tolist())} "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
        if step % save_every == 0:
            _save_state(model, opt, step, state_file, save, out_dir)
    _save_state(model, opt, step, state_file, save, out_dir)
    eval_acc = evaluate(model, loss_fn, eval_feats, num_anchors, seed)
    print(f"held-out slot accuracy {' '.join(f'{a:.2f}' for a in eval_acc[:8].tolist())}")
    return {"history": history, "eval_acc": eval_acc, "steps": step}


@torch.no_grad()
def evaluate(model, loss_fn, feats, num_anchors: int, seed: int = 0) -> torch.Tensor:
    """Mean per-slot top-1 accuracy over held-out examples (fixed anchors) -> [B]."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    accs = []
    for f in feats:
        anchors = sample_anchors(f.loss_mask, num_anchors, gen)
        if len(anchors):
            accs.append(loss_fn(model, f, anchors)[1]["acc"])
    return torch.nanmean(torch.stack(accs), dim=0) if accs else torch.full((model.block_size,), float("nan"))


def _save_state(model, opt, step, state_file, save, out_dir):
    save_state(state_file, model=model.state_dict(), opt=opt.state_dict(), step=step)
    model.eval()
    save(model, out_dir)
    model.train()


def frozen_parts(target):
    """The target's embedding and LM head as frozen fp32 functions (the draft trains in fp32)."""
    w_embed = target.embed_tokens.weight.detach().float()  # [V, H]
    w_head = target.lm_head.weight.detach().float()  # [V, H]
    return (lambda ids: F.embedding(ids, w_embed)), (lambda h: h @ w_head.T)


def state_file_for(target, out_dir) -> Path:
    return default_dir(target.name).parent.parent / "train" / Path(out_dir).name / "train_state.pt"


def train_dflash(target, out_dir, data_dir=None, layers=1, block_size=16, steps=3000, lr=1e-3,
                 budget_s=None, num_anchors=16, gamma=4.0, seed=0, init=True,
                 loss_slots: int | None = None) -> tuple[DFlashModel, dict]:
    """Train (or resume) a DFlash drafter; the z-lab checkpoint goes to out_dir. -> (model, log).

    loss_slots: train slots 1..loss_slots only (default: the whole block).
    """
    train_feats, eval_feats = load_features(target, data_dir)
    taps = shared_taps(target)
    torch.manual_seed(seed)
    cfg = draft_config(target, num_layers=layers, block_size=block_size, target_layer_ids=[t - 1 for t in taps])
    model = DFlashModel(cfg).float()
    if init:
        init_from_target(model, target)
    embed, lm_head = frozen_parts(target)

    def loss_fn(m, f, anchors):
        return dflash_loss(m, embed, lm_head, f.taps.float(), f.ids, f.loss_mask, anchors, gamma, loss_slots)

    log = train_loop(model, loss_fn, train_feats, eval_feats, Path(out_dir), state_file_for(target, out_dir),
                     save_dflash, steps, lr, budget_s, num_anchors, seed)
    return model, log


def main(argv=None) -> int:
    from ..target import load

    p = argparse.ArgumentParser(description="Train a DFlash drafter on the target's own responses.")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", default=None, help="dataset folder (default: $SPECDEC_CACHE/data/<model>)")
    p.add_argument("--out", required=True,
                   help="checkpoint folder (z-lab format); the resumable state goes under $SPECDEC_CACHE/train/")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--anchors", type=int, default=16)
    p.add_argument("--target-dtype", default="bf16", help="dtype of the target that computes the taps (cached per dtype)")
    p.add_argument("--gamma", type=float, default=4.0)
    p.add_argument("--loss-slots", type=int, default=None, help="train slots 1..N only (default: the whole block)")
    p.add_argument("--budget-min", type=float, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    target = load(a.model, dtype=a.target_dtype, device="cpu")
    train_dflash(target, a.out, a.data, a.layers, a.block_size, a.steps, a.lr,
                 a.budget_min * 60 if a.budget_min else None, a.anchors, a.gamma, a.seed, loss_slots=a.loss_slots)
    return 0


def cli(args) -> int:
    """`specdec train dflash`: the same recipe with the shared `train` arguments (sizes at their defaults)."""
    return run_from_cli(args, "dflash", train_dflash, "z-lab-format")


def run_from_cli(args, method: str, train_fn, format_name: str) -> int:
    """`specdec train <method>` for the block drafters: load the target, train until the budget is spent."""
    from ..target import load

    if args.budget_minutes is None and args.steps is None:
        raise ValueError("Give a budget: --budget-minutes N or --steps N (training runs until one is spent).")
    target = load(args.target, dtype=args.dtype, device=args.device)
    out = args.out or f"{method}-{Path(str(args.target)).name}"
    train_fn(target, out, args.data_dir, steps=args.steps or 100_000, lr=args.lr,
             budget_s=args.budget_minutes * 60 if args.budget_minutes else None, seed=args.seed)
    print(f"{format_name} {method} drafter written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
