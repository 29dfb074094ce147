"""Training an EAGLE-3 drafter on a laptop CPU: training-time test, AdamW, resumable.

    examples = data.load_examples(data_dir)              # the target's own answers
    features = capture(target, examples, taps)           # fused-tap inputs + target distributions
    draft_ids = choose_draft_vocab(examples, V_d)        # most frequent response tokens
    train(target, model, features, cfg)                  # TTT loss, AdamW, checkpoints, tqdm

Training-time test (TTT). At inference the drafter's step i > 0 reads its OWN
previous output instead of a target state. Training unrolls the same thing:
step 0 reads the fused target states g_t; step i reads the drafter's output of
step i-1 at the same row and the true token x_{t+1+i}, and predicts x_{t+2+i}.
Row t at step i sits at position t + i, so it attends to the step-0 keys of
rows <= t (causal) and to its OWN keys of steps 1..i (a diagonal): exactly the
keys it would see while drafting. The loss of step i is the cross-entropy
against the target's distribution over the draft vocabulary, weighted 0.8^i.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..drafters.eagle3 import Eagle3Model, save_eagle3
from .data import Example, Features, capture


@dataclass
class TrainConfig:
    ttt_steps: int = 3  # unrolled drafting steps per position
    decay: float = 0.8  # weight of step i is decay**i
    lr: float = 5e-4
    weight_decay: float = 0.01
    warmup_steps: int = 50
    tokens_per_batch: int = 1024  # rows packed into one optimiser step
    max_steps: int | None = None
    budget_minutes: float | None = None  # stop (and save) after this much training time
    max_epochs: int = 100
    eval_every: int = 150  # a held-out pass costs about a tenth of 150 steps
    save_every: int = 50
    seed: int = 0
    autocast_bf16: bool = True  # bf16 matmuls (weights and AdamW stay fp32): ~1.8x faster on a CPU with AMX


# --- draft vocabulary ---------------------------------------------------------------


def choose_draft_vocab(examples: list[Example], size: int, vocab_size: int, always=()) -> torch.Tensor:
    """The `size` most frequent response tokens (plus `always`, e.g. EOS), sorted by id.

    When the responses use fewer distinct tokens, the rest is filled with the
    lowest unused ids, so the draft vocabulary always has exactly `size` ids.
    """
    if size > vocab_size:
        raise ValueError(f"A draft vocabulary of {size} is larger than the target's {vocab_size} tokens.")
    counts = Counter(t for ex in examples for t, m in zip(ex.input_ids, ex.loss_mask) if m)
    chosen = list(dict.fromkeys([*always, *(t for t, _ in counts.most_common())]))[:size]
    fill = (t for t in range(vocab_size) if t not in set(chosen))
    chosen += [next(fill) for _ in range(size - len(chosen))]
    return torch.tensor(sorted(chosen), dtype=torch.long)


# --- features: what the target gives each example ----------------------------------------


# --- the TTT forward and loss -----------------------------------------------------------


def pack(features: list[Features], tokens_per_batch: int, generator: torch.Generator) -> list[list[Features]]:
    """Shuffle, then group examples into batches of about `tokens_per_batch` rows."""
    order = torch.randperm(len(features), generator=generator).tolist()
    batches, batch, n = [], [], 0
    for i in order:
        T = len(features[i].ids)
        if batch and n + T > tokens_per_batch:
            batches.append(batch)
            batch, n = [], 0
        batch.append(features[i])
        n += T
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


# --- the loop ---------------------------------------------------------------------------


def train(target, model: Eagle3Model, train_feats, eval_feats, cfg: TrainConfig, out_dir, progress=True) -> dict:
    """AdamW on the TTT loss until max_steps / budget; checkpoints in out_dir (resumes from them)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model.train()
    params = [p for n, p in model.named_parameters() if not n.startswith("embed_tokens")]  # embedding frozen
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    state_path = out_dir / "train_state.pt"
    step, epoch, history = 0, 0, []
    if state_path.exists():  # resume
        state = torch.load(state_path)
        model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
        step, epoch, history = state["step"], state["epoch"], state["history"]
        print(f"resuming from step {step} (epoch {epoch})")
    embed = target.embed_tokens
    with torch.no_grad():
        target_head = target.lm_head.weight[model.draft_to_target].to(model.fc.weight.dtype)  # [V_d, H]
    generator = torch.Generator().manual_seed(cfg.seed + epoch)
    start = time.perf_counter()
    budget_s = cfg.budget_minutes * 60 if cfg.budget_minutes else None
    bar = tqdm(total=cfg.max_steps, initial=step, desc="training eagle3", disable=not progress)

    def save():
        torch.save({"model": {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens")},
                    "optimizer": opt.state_dict(), "step": step, "epoch": epoch, "history": history}, state_path)

    done = False
    while not done and epoch < cfg.max_epochs:
        for batch in pack(train_feats, cfg.tokens_per_batch, generator):
            elapsed = time.perf_counter() - start
            if (cfg.max_steps is not None and step >= cfg.max_steps) or (budget_s is not None and elapsed > budget_s):
                done = True
                break
            # Linear warmup, then (under a time budget) a linear decay to 10 % as the budget runs out.
            scale = min(1.0, (step + 1) / cfg.warmup_steps)
            if budget_s is not None:
                scale *= max(0.1, 1 - elapsed / budget_s)
            for group in opt.param_groups:
                group["lr"] = cfg.lr * scale
            with autocast(cfg, target_head.device):
                loss, accs = ttt_loss(model, embed, target_head, batch, cfg)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            history.append({"step": step, "loss": loss.item(), "acc": accs})
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", acc0=f"{accs[0]:.2f}")
            if eval_feats and step % cfg.eval_every == 0:
                history[-1]["eval"] = evaluate(model, embed, target_head, eval_feats, cfg)
                bar.write(f"step {step}: held-out step accuracies {fmt(history[-1]['eval']['acc'])}")
            if step % cfg.save_every == 0:
                save()
        else:
            epoch += 1
            generator = torch.Generator().manual_seed(cfg.seed + epoch)
    bar.close()
    result = {"steps": step, "epochs": epoch, "train_minutes": (time.perf_counter() - start) / 60}
    if eval_feats:
        result["eval"] = evaluate(model, embed, target_head, eval_feats, cfg)
        history.append({"step": step, "eval": result["eval"]})
    save()
    model.eval()
    return result


@torch.no_grad()
def evaluate(model, embed, target_head, feats: list[Features], cfg: TrainConfig) -> dict:
    """Held-out TTT loss and step-i accuracy (the drafter's top-1 = the target's, given steps < i right)."""
    was_training = model.training
    model.eval()
    losses, accs, n = 0.0, [0.0] * cfg.ttt_steps, 0
    for batch in pack(feats, cfg.tokens_per_batch, torch.Generator().manual_seed(0)):
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


def autocast(cfg: TrainConfig, device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16)


def fmt(xs) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def write_checkpoint(model, out_dir, target_name: str, recipe: dict, dtype=torch.float16) -> Path:
    """The shippable drafter (speculators format) + recipe.json describing how it was made."""
    path = save_eagle3(model, out_dir, dtype=dtype, verifier=target_name)
    (Path(out_dir) / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    return path


# --- the whole recipe -------------------------------------------------------------------------


def run(
    target,
    data_dir=None,
    out_dir=None,
    draft_vocab: int = 4096,
    generate_minutes: float = 0.0,
    max_new_tokens: int = 160,
    cfg: TrainConfig | None = None,
    progress: bool = True,
) -> dict:
    """Data -> draft vocabulary -> captured taps -> TTT training -> a speculators-format drafter in out_dir.

    Every stage resumes: generation skips answered prompts, capture skips cached
    examples, training continues from out_dir/work/train_state.pt.
    """
    from ..drafters.eagle3 import default_taps, new_eagle3
    from . import data

    cfg = cfg or TrainConfig()
    data_dir = Path(data_dir or data.default_dir(target.name))
    out_dir = Path(out_dir or Path("eagle3-" + Path(str(target.name)).name))
    work = out_dir / "work"
    if generate_minutes > 0:
        data.build_dataset(target, data_dir, data.training_prompts(), max_new_tokens=max_new_tokens,
                           budget_s=generate_minutes * 60, progress=progress)
    examples = data.load_examples(data_dir)
    if not examples:
        raise ValueError(f"No training examples in {data_dir}: run with generate_minutes > 0 (CLI: --generate-minutes).")
    data.check_no_benchmark_prompts_by_id([ex.id for ex in examples])
    train_ex, eval_ex = data.split_examples(examples)

    vocab_path = work / "draft_ids.pt"
    if vocab_path.exists():  # keep the vocabulary of a run being resumed
        draft_ids = torch.load(vocab_path)
    else:
        draft_ids = choose_draft_vocab(train_ex, draft_vocab, target.vocab_size, always=sorted(target.eos_ids))
        work.mkdir(parents=True, exist_ok=True)
        torch.save(draft_ids, vocab_path)
    kept = set(draft_ids.tolist())
    response = [t for ex in train_ex for t, m in zip(ex.input_ids, ex.loss_mask) if m]
    coverage = sum(t in kept for t in response) / max(len(response), 1)
    print(f"{len(train_ex)} training / {len(eval_ex)} held-out examples, {len(response)} response tokens; "
          f"draft vocabulary {len(draft_ids)} covers {coverage:.1%} of them")

    taps = default_taps(target.num_layers)
    tap_dtype = str(target.dtype).removeprefix("torch.")
    cache = data_dir / f"taps-{'-'.join(map(str, taps))}-{str(target.dtype).removeprefix('torch.')}"
    train_feats = capture(target, train_ex, taps, cache, progress)
    eval_feats = capture(target, eval_ex, taps, cache, progress)

    model = new_eagle3(target, draft_ids=draft_ids, taps=taps, seed=cfg.seed).float()
    result = train(target, model, train_feats, eval_feats, cfg, work, progress)
    recipe = {
        "target": str(target.name), "target_dtype_for_taps": tap_dtype, "data_dir": str(data_dir),
        "num_train_examples": len(train_ex), "num_eval_examples": len(eval_ex),
        "num_response_tokens": len(response), "draft_vocab_size": len(draft_ids), "draft_vocab_coverage": coverage,
        "taps": list(taps), "train_config": asdict(cfg), "result": result,
    }
    write_checkpoint(model, out_dir, str(target.name), recipe)
    print(f"drafter written to {out_dir}: {json.dumps(result)}")
    return recipe
