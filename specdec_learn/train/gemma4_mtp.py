"""Train a Gemma-4-style assistant for a target that ships without one (SmolLM2-135M).

Why SmolLM2 and not the Gemma 3 270M GGUF: the assistant reads the target's
K/V, so target and assistant must be trained as a pair, and the whole book's
measurements run on SmolLM2 already; a second embedded target would double
the CPU cost of every comparison without teaching anything new about the
shared-KV mechanism.

Google has not published the assistant's training objective (methods.md §9,
open question 6). We train it the way it drafts, teacher-forced:

* anchor p (the position of ``last``): step 0 reads ``Emb(x_p)·sqrt(H_b)``
  and the target's post-norm hidden state h_{p-1}; step s > 0 reads the TRUE
  token x_{p+s} and ``post_projection`` of step s-1's output;
* every step queries at the constant position p and attends to the target's
  K/V of positions 0..p-1 (the last target layer, SmolLM2 is all full attention);
* step s predicts x_{p+s+1}; cross-entropy with step weights beta^s / sum
  (beta = 0.6, as for MTP), on response tokens only.

Many anchors of one example run as one batch of queries, each with its own
mask over the target's K/V: that is what "Q-only attention over a shared
cache" buys at training time too.

    python -m specdec_learn.train.gemma4_mtp --target smollm2-135m --budget-min 25

Resumable (state under ``$SPECDEC_CACHE/train/gemma4-assistant-<target>/``);
the shipped assistant goes to ``specdec_learn/checkpoints/gemma4-assistant-<target>/``
in the HF ``gemma4_assistant`` format, bf16.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..drafters.gemma4_mtp import random_assistant, shared_kv_layers
from ..checkpoints import shipped_folder, strip_table
from ..target import DecodeState
from .data import training_split, work_dir_for
from .projected import ProjectedTable
from .schedule import load_state, save_state, set_lr, warmup_cosine



@torch.no_grad()
def target_features(target, example):
    """One target forward: post-norm hidden [T, H_b] and the shared layer's K, V [1, kv, T, d] (bf16)."""
    ids = example.input_ids
    state = DecodeState(ids=list(ids), prompt_len=len(ids), cache=DynamicCache(config=target.model.config))
    L = target.num_layers
    h = target.final_norm(target.forward(state, ids, (L,), logits=False).hidden[L])
    layer = state.cache.layers[shared_kv_layers(target)["full_attention"]]
    return h.to(torch.bfloat16), layer.keys.to(torch.bfloat16), layer.values.to(torch.bfloat16)


def init_from_target(assistant, target, seed: int = 0) -> torch.Tensor:
    """Start the tied embedding / lm_head as the target's, projected to H_d by a random orthonormal R; -> R.

    Then logits = (E R)(R^T x) ~ the target's own scores seen through a
    rank-H_d window: a far better start than noise for a 49k-token vocabulary.
    Training keeps the table of that form, E·P with P learned from R on
    (`train/projected.py`), so the checkpoint ships P, not 49,152 rows.
    """
    H_b, H_d = target.hidden_size, assistant.config.get_text_config().hidden_size
    g = torch.Generator().manual_seed(seed)
    R, _ = torch.linalg.qr(torch.randn(H_b, H_d, generator=g))  # [H_b, H_d], orthonormal columns
    with torch.no_grad():
        assistant.model.embed_tokens.weight.copy_(target.embed_tokens.weight.float() @ R)
        w = assistant.pre_projection.weight  # [H_d, 2*H_b]: [embedding half | hidden half]
        w.normal_(std=0.02 / math.sqrt(H_b))
        w[:, H_b:] += R.T
        assistant.post_projection.weight.copy_(R)  # [H_b, H_d]
    return R


def assistant_loss(assistant, target, ids, mask, h, K, V, depth: int, beta: float, anchors: int, generator=None,
                   table: torch.Tensor | None = None):
    """Teacher-forced loss at up to `anchors` random anchor positions of one example.

    table: the tied LM head [V, H_d] as E·P while training (default: the assistant's own).
    """
    T = ids.shape[0]
    H_b = target.hidden_size
    ok = [p for p in range(1, T - 1) if mask[p + 1]]  # step 0 at p predicts x_{p+1}, a response token
    if not ok:
        return None, []
    pick = torch.randperm(len(ok), generator=generator)[:anchors]
    p = torch.tensor(ok, device=ids.device)[pick].sort().values  # [P]
    P = p.numel()
    allowed = torch.arange(T, device=ids.device)[None] < p[:, None]  # [P, T]: K/V of positions < p
    bias = torch.zeros(P, T, device=ids.device).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    masks = {"full_attention": bias, "sliding_attention": bias}
    shared = {"full_attention": (K, V), "sliding_attention": (K, V)}
    scale = math.sqrt(H_b)
    state = h[p - 1][None]  # [1, P, H_b]
    weights = [beta**s for s in range(depth)]
    loss, accs = 0.0, []
    for s in range(depth):
        tok = (p + s).clamp(max=T - 1)
        label_pos = p + s + 1
        valid = label_pos <= T - 1
        label_pos = label_pos.clamp(max=T - 1)
        valid = valid & mask[label_pos]
        e = target.embed_tokens(ids[tok])[None].float() * scale  # [1, P, H_b]
        x = assistant.pre_projection(torch.cat([e, state], dim=-1))  # [1, P, H_d]
        d = assistant.model(inputs_embeds=x, attention_mask=masks, position_ids=p[None],
                            shared_kv_states=shared, use_cache=False).last_hidden_state  # [1, P, H_d], normed
        if valid.any():
            logits = assistant.lm_head(d[0, valid]) if table is None else d[0, valid] @ table.T  # [r, V]
            labels = ids[label_pos[valid]]
            loss = loss + weights[s] * F.cross_entropy(logits, labels)
            accs.append(float((logits.argmax(-1) == labels).float().mean()))
        state = assistant.post_projection(d)  # [1, P, H_b]
    return loss / sum(weights), accs


def train(target, steps: int, depth: int = 3, beta: float = 0.6, lr: float = 1e-3, anchors: int = 48,
          hidden_size: int = 128, num_layers: int = 4, budget_s=None, save_every: int = 50, work_dir=None,
          data_dir=None, seed: int = 0, log=print):
    name = Path(str(target.name)).name
    work_dir = work_dir_for(name, "gemma4-assistant", work_dir)
    examples, held_out = training_split(name, data_dir)
    target.model.requires_grad_(False)
    assistant = random_assistant(target, seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                                 num_heads=2 * target.config.num_key_value_heads).float()
    E = target.embed_tokens.weight.detach().float()  # [V, H_b]
    table = ProjectedTable(E, init_from_target(assistant, target, seed))
    assistant.model.embed_tokens.weight.requires_grad_(False)  # tied to lm_head; E·P stands in for both
    params = [p for p in assistant.parameters() if p.requires_grad] + [table.proj]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    state_file, step = work_dir / "state.pt", 0
    if saved := load_state(state_file, log):
        assistant.load_state_dict(saved["assistant"])
        if "proj" in saved:
            table.proj.data.copy_(saved["proj"])
            opt.load_state_dict(saved["opt"])
        else:  # a state from before the table was E·P: fit P to its table once, fresh optimiser
            table = ProjectedTable.fit(E, assistant.model.embed_tokens.weight)
            params = [p for p in assistant.parameters() if p.requires_grad] + [table.proj]
            opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        step = saved["step"]
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    gen = torch.Generator().manual_seed(seed + step)
    features, t0 = {}, time.perf_counter()
    assistant.train()
    while step < steps and (budget_s is None or time.perf_counter() - t0 < budget_s):
        i = order[step % len(order)]
        if i not in features:  # one target forward per example, kept for the next epochs
            features[i] = target_features(target, examples[i])
        h, K, V = (f.float() for f in features[i])
        ids = torch.tensor(examples[i].input_ids)
        mask = torch.tensor(examples[i].loss_mask)
        set_lr(opt, warmup_cosine(step, steps, lr))
        loss, accs = assistant_loss(assistant, target, ids, mask, h, K, V, depth, beta, anchors, gen, table())
        if loss is not None:
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        step += 1
        if step % 10 == 0 and loss is not None:
            log(f"{time.perf_counter() - t0:.0f}s step {step} loss {float(loss.detach()):.3f} "
                f"acc/step {[round(a, 2) for a in accs]}")
        if step % save_every == 0:
            save_state(state_file, assistant=assistant.state_dict(), proj=table.proj.data, opt=opt.state_dict(), step=step)
    save_state(state_file, assistant=assistant.state_dict(), proj=table.proj.data, opt=opt.state_dict(), step=step)
    with torch.no_grad():  # the tied embedding / lm_head becomes the table it was trained as
        assistant.model.embed_tokens.weight.copy_(table())
    assistant.eval()
    log(f"held-out teacher-forced accuracy per step: {evaluate(assistant, target, held_out[:20], depth)}")
    return assistant, step, table.proj.detach()  # P: what the checkpoint ships instead of the table


@torch.no_grad()
def evaluate(assistant, target, examples, depth: int) -> list[float]:
    totals = []
    for ex in examples:
        h, K, V = (f.float() for f in target_features(target, ex))
        ids, mask = torch.tensor(ex.input_ids), torch.tensor(ex.loss_mask)
        totals.append(assistant_loss(assistant, target, ids, mask, h, K, V, depth, 0.6, 10_000)[1])
    return [round(sum(a[k] for a in totals if len(a) > k) / max(1, sum(len(a) > k for a in totals)), 3)
            for k in range(depth)]


def main(argv=None):
    from ..target import load

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--depth", type=int, default=3, help="draft steps trained per anchor")
    p.add_argument("--beta", type=float, default=0.6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--anchors", type=int, default=48, help="anchor positions per example and step")
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--budget-min", type=float, default=None, help="stop after this many minutes (resumable)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="export folder (default: checkpoints/gemma4-assistant-<target>)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load(args.target, dtype="fp32", device="cpu")
    assistant, step, proj = train(target, args.steps, args.depth, args.beta, args.lr, args.anchors, args.hidden_size,
                            args.layers, budget_s=args.budget_min * 60 if args.budget_min else None)
    name = Path(args.target).name
    out = Path(args.out or shipped_folder("gemma4_mtp", name))
    assistant.to(torch.bfloat16).save_pretrained(out)
    strip_table(out, proj)  # E·P: the target's embedding rebuilds the 49,152 rows (`checkpoints.materialize`)
    info = {  # beside config.json, which transformers checks strictly
        "target": name, "steps": step, "depth": args.depth, "beta": args.beta, "lr": args.lr,
        "anchors": args.anchors, "hidden_size": args.hidden_size, "layers": args.layers,
        "command": f"python -m specdec_learn.train.gemma4_mtp --target {args.target} --steps {args.steps} "
                   f"--budget-min {args.budget_min} --threads {args.threads}",
    }
    (out / "training.json").write_text(json.dumps(info, indent=2))
    print(json.dumps({"exported": str(out), "steps": step}))


if __name__ == "__main__":
    main()
