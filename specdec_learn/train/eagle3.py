"""Training an EAGLE-3 drafter on a laptop CPU: training-time test, AdamW, resumable.

    data = training_data(target, taps)                   # the target's answers, their taps and distributions
    draft_ids = choose_draft_vocab(data.examples, V_d)   # most frequent response tokens
    run = fit(target, model, data.train, data.eval, cfg, work_dir)   # the TTT loss through train/loop.py
    export(model, target, out_dir, run)                  # speculators format + recipe.json

Training-time test (TTT). At inference the drafter's step i > 0 reads its OWN
previous output instead of a target state. Training unrolls the same thing:
step 0 reads the fused target states g_t; step i reads the drafter's output of
step i-1 at the same row and the true token x_{t+1+i}, and predicts x_{t+2+i}.
Row t at step i sits at position t + i, so it attends to the step-0 keys of
rows <= t (causal) and to its OWN keys of steps 1..i (a diagonal): exactly the
keys it would see while drafting. The loss of step i is the cross-entropy
against the target's distribution over the draft vocabulary, weighted 0.8^i.

    specdec train eagle3 --target smollm2-135m --draft-vocab 4096 --ttt-steps 4 --steps 2000 --budget-min 38

Resumable (train/loop.py: the state and the draft vocabulary live under
``$SPECDEC_CACHE/train/eagle3-<target>/``); the drafter goes to
``specdec_learn/checkpoints/eagle3-<target>/`` in the speculators format.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoints import shipped_folder
from ..drafters.eagle3 import Eagle3Model, default_taps, new_eagle3, save_eagle3
from ..limits import cpu_has_bf16
from ..vocab import choose_draft_vocab  # the draft vocabulary (vocab.py); chapter 11 calls it from here
from .examples import Example
from .features import Features, lengths, training_data
from .loop import Budget, Run, export as export_folder, read_saved, recipe, save_state, train_loop, work_dir_for
from .sources import add_share_argument, draw_one, source_weights


@dataclass
class TrainConfig:
    ttt_steps: int = 3  # unrolled drafting steps per position
    decay: float = 0.8  # weight of step i is decay**i
    lr: float = 1e-3
    weight_decay: float = 0.01
    tokens_per_batch: int = 1024  # rows packed into one optimiser step
    steps: int = 2000  # the step budget (and the schedule's horizon)
    budget_min: float | None = None  # stop (and save) after this much training time
    eval_every: int = 150  # a held-out pass costs about a tenth of 150 steps
    save_every: int = 50
    seed: int = 0
    # bf16 matmuls (weights and AdamW stay fp32): faster on a CPU with AMX, several times slower on one without
    # bf16 instructions, where torch emulates them; None: on where the device has them (`bf16_is_native`)
    autocast_bf16: bool | None = None


# --- draft vocabulary ---------------------------------------------------------------


def draft_vocabulary(examples: list[Example], size: int, target, work_dir) -> torch.Tensor:
    """The run's draft vocabulary, chosen once and kept in the work dir: a resumed run keeps it even on grown data."""
    file = Path(work_dir) / "draft_ids.pt"
    if file.exists() and len(kept := read_saved(file)) == size:
        return kept
    draft_ids = choose_draft_vocab(examples, size, target.vocab_size, always=sorted(target.eos_ids))
    save_state(file, draft_ids)
    return draft_ids


# --- the TTT forward and loss -----------------------------------------------------------


def pack(sizes: list[int], tokens_per_batch: int, generator: torch.Generator) -> list[list[int]]:
    """Shuffle, then group example indices into batches of about `tokens_per_batch` rows (sizes[i]: example i's tokens)."""
    order = torch.randperm(len(sizes), generator=generator, device="cpu").tolist()
    batches, batch, n = [], [], 0
    for i in order:
        if batch and n + sizes[i] > tokens_per_batch:
            batches.append(batch)
            batch, n = [], 0
        batch.append(i)
        n += sizes[i]
    return batches + ([batch] if batch else [])


def ttt_forward(model: Eagle3Model, embed, batch: list[Features], steps: int) -> list[torch.Tensor]:
    """Draft logits [N, V_d] of each TTT step over a packed batch (rows = all tokens of all examples).

    Row t at step i reads token x_{t+1+i} (the truth) and, for i > 0, the
    drafter's own output of step i-1 at row t; it predicts x_{t+2+i}.
    """
    layer = model.layers[0]
    dtype = model.fc.weight.dtype
    ids = torch.cat([f.ids for f in batch])  # [N]
    lengths = torch.tensor([len(f.ids) for f in batch])
    doc = torch.repeat_interleave(torch.arange(len(batch)), lengths)  # [N] which example each row is in
    pos = torch.cat([torch.arange(n) for n in lengths])  # [N] row position within its example
    step0_mask = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])  # [N, N] causal within example
    N = ids.shape[0]

    x = model.fuse(torch.cat([f.taps for f in batch]))  # [N, H] step 0 reads the fused target states
    keys, values, logits = [], [], []
    for i in range(steps):
        inside = pos + 1 + i < lengths[doc]  # x_{t+1+i} exists in this example
        src = torch.where(inside, torch.arange(N) + 1 + i, torch.zeros_like(pos))  # [N] row of x_{t+1+i}
        with torch.no_grad():
            emb = embed(ids[src]).to(dtype)  # [N, H]
        cos, sin = model.rope(pos + i)  # row t at step i sits at position t + i
        q, k, v = layer.qkv(emb, x, cos, sin)
        keys.append(k)
        values.append(v)
        x = layer.finish(x, ttt_attention(layer, q, keys, values, step0_mask))  # [N, H]
        logits.append(model.logits(x))
    return logits


def ttt_loss(model: Eagle3Model, embed, target_head: torch.Tensor, batch: list[Features], cfg: TrainConfig):
    """Σ_i decay^i · CE(target, draft) at TTT step i over a packed batch -> (loss, [accuracy of each step]).

    target_head: [V_d, H] the target's lm_head rows for the draft vocabulary, so
    p_target = softmax over the draft vocabulary of the target's own logits.
    Positions count when the predicted token is a response token and the
    target's top-1 (over its full vocabulary) is in the draft vocabulary.
    """
    lengths = torch.tensor([len(f.ids) for f in batch])
    doc = torch.repeat_interleave(torch.arange(len(batch)), lengths)
    pos = torch.cat([torch.arange(n) for n in lengths])
    N = lengths.sum().item()
    loss_mask = torch.cat([f.loss_mask for f in batch])  # [N]
    with torch.no_grad():
        last = torch.cat([f.last for f in batch]).to(target_head.dtype)
        p_target = F.softmax(last @ target_head.T, dim=-1)  # [N, V_d]
        in_draft = model.t2d[torch.cat([f.top1 for f in batch])]  # [N]
    total, accs = 0.0, []
    for i, logits in enumerate(ttt_forward(model, embed, batch, cfg.ttt_steps)):
        # Step i at row t predicts x_{t+2+i}: the target's distribution for it sits at row t+1+i.
        at = torch.clamp(torch.arange(N) + 1 + i, max=N - 1)
        mask = (pos + 2 + i < lengths[doc]) & loss_mask[torch.clamp(at + 1, max=N - 1)] & in_draft[at]
        p = p_target[at]  # [N, V_d]
        ce = -(p * F.log_softmax(logits.float(), dim=-1)).sum(-1)  # [N]
        m = mask.float()
        total = total + cfg.decay**i * (ce * m).sum() / m.sum().clamp(min=1)
        with torch.no_grad():
            accs.append(((logits.argmax(-1) == p.argmax(-1)).float() * m).sum().item() / max(m.sum().item(), 1))
    return total, accs


def ttt_attention(layer, q, keys, values, step0_mask):
    """Attention at TTT step i = len(keys) - 1: the causal step-0 keys + this row's own keys of steps 1..i."""
    groups = layer.num_heads // layer.num_kv_heads
    expand = lambda t: t.repeat_interleave(groups, 0)  # [kv_heads, N, d] -> [heads, N, d]
    scale = 1.0 / math.sqrt(layer.head_dim)
    s0 = (q @ expand(keys[0]).transpose(1, 2)) * scale  # [heads, N, N]
    s0 = s0.masked_fill(~step0_mask, float("-inf"))
    diag = [(q * expand(k)).sum(-1, keepdim=True) * scale for k in keys[1:]]  # each [heads, N, 1]
    w = torch.softmax(torch.cat([s0, *diag], dim=-1), dim=-1)  # [heads, N, N + i]
    N = s0.shape[-1]
    a = w[..., :N] @ expand(values[0])  # [heads, N, d]
    for j, v in enumerate(values[1:]):
        a = a + w[..., N + j : N + j + 1] * expand(v)
    return layer.self_attn.o_proj(a.transpose(0, 1).reshape(q.shape[1], -1))  # [N, H]


# --- the loop: packed batches through train/loop.py -------------------------------------------


def batches(features, cfg: TrainConfig, weights: torch.Tensor | None = None):
    """step, generator -> its packed batch of about `cfg.tokens_per_batch` rows.

    weights None: epoch after epoch, each shuffled by seed + epoch (so any
    step can be found again). weights [N] (sources.source_weights): examples
    drawn by weight with the step's own generator until the next would not
    fit, so each prompt source gets its share of the draws. Batches are kept
    as indices, so on-demand features (features.OnDemand) are computed only for
    the batch a step reads.
    """
    sizes = lengths(features)
    epochs: list[list[list[int]]] = []
    weights = None if weights is None else weights.cpu()

    def drawn(generator: torch.Generator) -> list[int]:
        batch, n = [], 0
        while True:
            i = draw_one(weights, generator)
            if batch and n + sizes[i] > cfg.tokens_per_batch:
                return batch
            batch.append(i)
            n += sizes[i]

    def batch_at(step: int, generator: torch.Generator | None = None) -> list[Features]:
        if weights is not None:
            return [features[i] for i in drawn(generator)]
        epoch, first = 0, 0
        while True:
            if epoch == len(epochs):
                epochs.append(pack(sizes, cfg.tokens_per_batch, torch.Generator().manual_seed(cfg.seed + epoch)))
            if step < first + len(epochs[epoch]):
                return [features[i] for i in epochs[epoch][step - first]]
            first, epoch = first + len(epochs[epoch]), epoch + 1

    return batch_at


def fit(target, model: Eagle3Model, train_feats, eval_feats, cfg: TrainConfig, work_dir, data: dict | None = None,
        config: dict | None = None, progress: bool = True, log=print, weights: torch.Tensor | None = None) -> Run:
    """AdamW on the TTT loss through the shared loop, resuming from work_dir; the target's embedding stays frozen.

    weights: [N] sampling weights of the training examples (sources.source_weights); None reads them in shuffled epochs.
    """
    torch.manual_seed(cfg.seed)
    embed = target.embed_tokens
    with torch.no_grad():
        target_head = target.lm_head.weight[model.draft_to_target].to(model.fc.weight.dtype)  # [V_d, H]
    batch_at = batches(train_feats, cfg, weights)

    def loss(step, generator):
        batch = batch_at(step, generator)
        with autocast(cfg, target_head.device):
            value, accs = ttt_loss(model, embed, target_head, batch, cfg)
        return value, {"acc": accs, "tokens": sum(len(f.ids) for f in batch)}

    def held_out():
        return evaluate(model, embed, target_head, eval_feats, cfg)

    settings = {k: v for k, v in asdict(cfg).items() if k not in ("lr", "weight_decay", "steps", "budget_min", "seed")}
    if cfg.autocast_bf16 is None:  # the recipe records what this machine chose
        settings["autocast_bf16"] = bf16_is_native(target_head.device)
    return train_loop(model, loss, Budget(cfg.steps, cfg.budget_min), work_dir, lr=cfg.lr,
                      weight_decay=cfg.weight_decay, evaluate=held_out if eval_feats else None,
                      eval_every=cfg.eval_every, save_every=cfg.save_every, log_every=25, seed=cfg.seed,
                      config={**settings, **(config or {})}, data=data, progress=progress, log=log)


@torch.no_grad()
def evaluate(model, embed, target_head, feats: list[Features], cfg: TrainConfig) -> dict:
    """Held-out TTT loss and step-i accuracy (the drafter's top-1 = the target's, given steps < i right)."""
    was_training = model.training
    model.eval()
    losses, accs, n = 0.0, [0.0] * cfg.ttt_steps, 0
    for indices in pack(lengths(feats), cfg.tokens_per_batch, torch.Generator().manual_seed(0)):
        batch = [feats[i] for i in indices]
        with autocast(cfg, target_head.device):
            loss, a = ttt_loss(model, embed, target_head, batch, cfg)
        losses += loss.item()
        accs = [x + y for x, y in zip(accs, a)]
        n += 1
    model.train(was_training)
    accs = [a / max(n, 1) for a in accs]
    # Under teacher forcing step i assumes steps < i were right, so E[accepted] ~ Σ_i Π_{j<=i} acc_j.
    expected = sum(math.prod(accs[: i + 1]) for i in range(len(accs)))
    return {"loss": losses / max(n, 1), "acc": accs, "expected_accepted": expected}


def bf16_is_native(device) -> bool:
    """A GPU, or a CPU with bf16 instructions (AVX512-BF16 or AMX, read from /proc/cpuinfo).

    Elsewhere (AVX2 laptops, Apple silicon, many AMD servers) torch emulates bf16
    matmuls, and autocast makes training several times slower, not faster.
    """
    return device.type != "cpu" or cpu_has_bf16() is True  # None: not known, so not assumed



def autocast(cfg: TrainConfig, device):
    """bf16 autocast for the step's matmuls, where `cfg.autocast_bf16` asks for it (None: where it is native)."""
    enabled = bf16_is_native(device) if cfg.autocast_bf16 is None else cfg.autocast_bf16
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


# --- training: data -> vocabulary -> features -> loss -> the loop ---------------------------------


def train(target, cfg: TrainConfig | None = None, draft_vocab: int = 4096, data_dir=None, work_dir=None,
          progress: bool = True, log=print, templated_share: float | None = None) -> tuple[Eagle3Model, Run]:
    """Data -> draft vocabulary -> captured taps -> TTT training (resumable). -> (model, Run).

    templated_share: the fraction of the examples read that answer a templated prompt (sources.source_weights).
    """
    cfg = cfg or TrainConfig()
    work_dir = work_dir_for(target.name, "eagle3", work_dir)
    taps = default_taps(target.num_layers)
    data = training_data(target, taps, data_dir=data_dir, progress=progress)
    draft_ids = draft_vocabulary(data.examples, draft_vocab, target, work_dir)
    kept = set(draft_ids.tolist())
    response = [t for ex in data.examples for t, m in zip(ex.input_ids, ex.loss_mask) if m]
    coverage = sum(t in kept for t in response) / max(len(response), 1)
    log(f"{len(data.examples)} training / {len(data.held_out)} held-out examples, {len(response)} response tokens; "
        f"draft vocabulary {len(draft_ids)} covers {coverage:.1%} of them")
    model = new_eagle3(target, draft_ids=draft_ids, taps=taps, seed=cfg.seed).float()
    config = {"taps": list(taps), "draft_vocab_size": len(draft_ids), "draft_vocab_coverage": coverage,
              "target_dtype_for_taps": str(target.dtype).removeprefix("torch."), "templated_share": templated_share}
    weights = None if templated_share is None else source_weights(data.examples, templated_share)
    return model, fit(target, model, data.train, data.eval, cfg, work_dir, data.record, config, progress, log,
                      weights)


# --- export ------------------------------------------------------------------------------------


def export(model: Eagle3Model, target, out_dir, run: Run, command: str | None = None, dtype=torch.float16) -> Path:
    """The shippable drafter (speculators format) + recipe.json describing how it was made."""
    return export_folder(out_dir, lambda tmp: save_eagle3(model, tmp, dtype=dtype, verifier=str(target.name)),
                         recipe(run, "eagle3", target, command))


# --- the command line: specdec train eagle3 ---------------------------------------------------------

DEFAULTS = {"steps": 2000, "lr": 1e-3}


def add_arguments(p) -> None:
    p.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default="bf16",
                   help="dtype of the target that computes the taps (cached per dtype)")
    p.add_argument("--draft-vocab", type=int, default=4096, help="tokens the drafter can propose (V_d)")
    p.add_argument("--ttt-steps", type=int, default=3, help="drafting steps unrolled in training")
    p.add_argument("--tokens-per-batch", type=int, default=1024, help="text tokens packed into one step")
    add_share_argument(p)


def cli(args, command: str) -> Path:
    from ..target import load

    target = load(args.target, dtype=args.dtype, device=args.device, invariant=False)  # features.py: whole examples
    cfg = TrainConfig(ttt_steps=args.ttt_steps, lr=args.lr, tokens_per_batch=args.tokens_per_batch, steps=args.steps,
                      budget_min=args.budget_min, seed=args.seed,
                      **({"eval_every": args.eval_every} if args.eval_every else {}))
    model, run = train(target, cfg, args.draft_vocab, args.data_dir, args.work_dir, progress=not args.no_progress,
                       templated_share=args.templated_share)
    return export(model, target, args.out or shipped_folder("eagle3", target.name), run, command)
