"""Training a DFlash drafter on the target's own text.

One training example is one target response (examples.py): its token ids, the
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

Training is data -> loss -> the shared loop (train/loop.py): the taps come
from the same pipeline and disk cache as EAGLE-3's (`features.training_data`
with the same taps: the target runs once per example for every learned
drafter), each step draws one example and its anchors, and the block
drafter's checkpoint is written once, at the end, with its recipe.json.

    specdec train dflash --layers 1 --block-size 16 --steps 3000 --budget-min 40 --threads 1
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoints import shipped_folder
from ..drafters.dflash import DFlashModel, draft_config, save_dflash
from .features import training_data
from .loop import Budget, Run, export as export_folder, recipe, train_loop, work_dir_for
from .sources import add_share_argument, draw_one, prompt_source, source_weights

# --- the blocks of one example --------------------------------------------------


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to `num_anchors` random positions p with p and p+1 in the response -> sorted [A]."""
    ok = loss_mask[:-1] & loss_mask[1:]  # [T-1]: the anchor and its first label are response tokens
    candidates = ok.nonzero().squeeze(-1)  # [C]
    order = torch.randperm(len(candidates), generator=generator, device="cpu")[:num_anchors]  # draws on the CPU
    return candidates[order.to(candidates.device)].sort().values


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


# --- the target's taps: the ones EAGLE-3 reads ------------------------------------------


def shared_taps(target) -> tuple[int, ...]:
    """EAGLE-3's taps (2, 15, 27 for SmolLM2): using them too lets one tap cache serve EAGLE-3, DFlash and DSpark.

    As DFlash layer ids (output of layer i = tap i + 1) these are 1, 14, 26,
    close to z-lab's default spread (1, 14, 27).
    """
    from ..drafters.eagle3 import default_taps

    return tuple(default_taps(target.num_layers))


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


def frozen_parts(target):
    """The target's embedding and LM head as frozen fp32 functions (the draft trains in fp32)."""
    w_embed = target.embed_tokens.weight.detach().float()  # [V, H]
    w_head = target.lm_head.weight.detach().float()  # [V, H]
    return (lambda ids: F.embedding(ids, w_embed)), (lambda h: h @ w_head.T)



# --- training: data -> loss -> the loop (shared with DSpark) -----------------------------------


def block_step(train_feats, num_anchors: int, example_loss, weights: torch.Tensor | None = None):
    """The loop's loss for a block drafter: one random example per step, up to `num_anchors` random anchors in it.

    example_loss(features, anchors) -> (loss, {"acc": [B], ...}).
    weights: [N] sampling weights of the examples (sources.source_weights); None draws them uniformly.
    """
    def loss(step, generator):
        if weights is None:
            i = int(torch.randint(len(train_feats), (1,), generator=generator, device="cpu"))
        else:
            i = draw_one(weights, generator)
        f = train_feats[i]
        anchors = sample_anchors(f.loss_mask, num_anchors, generator)
        if len(anchors) == 0:
            return None, {"tokens": len(f.ids)}
        value, metrics = example_loss(f, anchors)
        return value, {**metrics, "tokens": len(f.ids)}

    return loss


EVAL_ANCHORS = 16  # held-out blocks per example: fixed, so runs trained with different --anchors compare


@torch.no_grad()
def evaluate(example_loss, feats, block_size: int, seed: int = 0, sources: list[str] | None = None,
             num_anchors: int = EVAL_ANCHORS) -> dict:
    """Mean per-slot top-1 accuracy over held-out examples (fixed anchors) -> {"acc": [B], "acc_<source>": [B]}.

    sources: each example's prompt source (sources.prompt_source); the mean over
    each source's examples is reported beside the overall one, because held-out
    accuracy over a mixed corpus says little about the text a drafter is served.
    EVAL_ANCHORS, not the training --anchors: with 64 anchors one evaluation of
    the corpus's 774 held-out examples took four minutes here.
    """
    gen = torch.Generator().manual_seed(seed)
    accs, kept = [], []
    for i, f in enumerate(feats):
        anchors = sample_anchors(f.loss_mask, num_anchors, gen)
        if len(anchors):
            accs.append(example_loss(f, anchors)[1]["acc"])
            kept.append(sources[i] if sources else None)
    if not accs:
        return {"acc": torch.full((block_size,), float("nan"))}
    accs = torch.stack(accs)  # [N, B]
    out = {"acc": torch.nanmean(accs, dim=0)}
    for source in sorted({s for s in kept if s is not None}):
        rows = torch.tensor([s == source for s in kept])
        out[f"acc_{source}"] = torch.nanmean(accs[rows], dim=0)
    return out


def train(target, layers: int = 1, block_size: int = 16, steps: int = 3000, lr: float = 1e-3,
          budget_min: float | None = None, num_anchors: int = 16, gamma: float = 4.0, seed: int = 0, init: bool = True,
          loss_slots: int | None = None, work_dir=None, data_dir=None, progress: bool = True,
          log=print, eval_every: int | None = None,
          templated_share: float | None = None) -> tuple[DFlashModel, Run]:
    """Train (or resume) a DFlash drafter on the target's answers. -> (model, Run).

    loss_slots: train slots 1..loss_slots only (default: the whole block).
    templated_share: the fraction of steps that read a templated example (sources.source_weights; default: uniform).
    """
    taps = shared_taps(target)
    data = training_data(target, taps, data_dir=data_dir, progress=progress)
    torch.manual_seed(seed)
    cfg = draft_config(target, num_layers=layers, block_size=block_size, target_layer_ids=[t - 1 for t in taps])
    model = DFlashModel(cfg).float()
    if init:
        init_from_target(model, target)
    embed, lm_head = frozen_parts(target)

    def example_loss(f, anchors):
        return dflash_loss(model, embed, lm_head, f.taps.float(), f.ids, f.loss_mask, anchors, gamma, loss_slots)

    config = {"layers": layers, "block_size": block_size, "num_anchors": num_anchors, "gamma": gamma,
              "loss_slots": loss_slots, "taps": list(taps), "init_from_target": init,
              "templated_share": templated_share}
    weights = None if templated_share is None else source_weights(data.examples, templated_share)
    sources = [prompt_source(ex.id) for ex in data.held_out]
    run = train_loop(model, block_step(data.train, num_anchors, example_loss, weights), Budget(steps, budget_min),
                     work_dir_for(target.name, "dflash", work_dir), lr=lr, betas=(0.9, 0.95), save_every=100,
                     evaluate=lambda: evaluate(example_loss, data.eval, block_size, seed, sources),
                     eval_every=eval_every, seed=seed, config=config, data=data.record, progress=progress, log=log)
    return model, run


# --- export ------------------------------------------------------------------------------------


def export(model: DFlashModel, target, out_dir, run: Run, command: str | None = None) -> Path:
    """The z-lab-format folder (config.json + model.safetensors, bf16) and recipe.json beside it."""
    return export_folder(out_dir, lambda tmp: save_dflash(model, tmp), recipe(run, "dflash", target, command))


# --- the command line: specdec train dflash --------------------------------------------------------

DEFAULTS = {"steps": 3000, "lr": 1e-3}


def add_arguments(p) -> None:
    p.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default="bf16",
                   help="dtype of the target that computes the taps (cached per dtype)")
    p.add_argument("--layers", type=int, default=1, help="draft decoder layers")
    p.add_argument("--block-size", type=int, default=16, help="B: the block drafts up to B-1 tokens")
    p.add_argument("--anchors", type=int, default=16, help="blocks per example and step")
    p.add_argument("--gamma", type=float, default=4.0, help="slot k's weight is exp(-(k-1)/gamma)")
    p.add_argument("--loss-slots", type=int, default=None, help="train slots 1..N only (default: the whole block)")
    add_share_argument(p)


def cli(args, command: str) -> Path:
    from ..target import load

    target = load(args.target, dtype=args.dtype, device=args.device, invariant=False)  # features.py: whole examples
    model, run = train(target, args.layers, args.block_size, args.steps, args.lr, args.budget_min, args.anchors,
                       args.gamma, args.seed, loss_slots=args.loss_slots, work_dir=args.work_dir,
                       data_dir=args.data_dir, progress=not args.no_progress, eval_every=args.eval_every,
                       templated_share=args.templated_share)
    return export(model, target, args.out or shipped_folder("dflash", target.name), run, command)
