"""Train a Gemma-4-style assistant for a target that ships without one (SmolLM2-135M).

Why SmolLM2 and not the Gemma 3 270M GGUF: the assistant reads the target's
K/V, so target and assistant must be trained as a pair, and the whole book's
measurements run on SmolLM2 already; a second embedded target would double
the CPU cost of every comparison without teaching anything new about the
shared-KV mechanism.

Google has not published the assistant's training objective. We train it
the way it drafts, teacher-forced:

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

The vocabulary table is learned as E_target·P (train/projected.py), so the
checkpoint ships P instead of 49,152 rows.

    specdec train gemma4_mtp --target smollm2-135m --steps 1200 --budget-min 25

Resumable (train/loop.py: the state lives under
``$SPECDEC_CACHE/train/gemma4-assistant-<target>/``); the assistant goes to
``specdec_learn/checkpoints/gemma4-assistant-<target>/`` in the HF
``gemma4_assistant`` format, bf16.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checkpoints import shipped_folder, strip_table
from ..drafters.gemma4_mtp import random_assistant, shared_kv_layers
from ..tree import additive
from .features import training_data
from .loop import Budget, Run, export as export_folder, recipe, train_loop, work_dir_for
from .projected import ProjectedTable
from .sources import add_share_argument, example_picker, source_weights


class Student(torch.nn.Module):
    """The assistant being trained and its table E_target·P (tied embedding and LM head)."""

    def __init__(self, assistant, table: ProjectedTable):
        super().__init__()
        self.assistant, self.table = assistant, table


def kv_layer(target) -> int:
    """The target layer whose K/V the assistant reads (SmolLM2: the last; all its layers are full attention)."""
    return shared_kv_layers(target)["full_attention"]


def init_from_target(assistant, target, seed: int = 0) -> torch.Tensor:
    """Start the tied embedding / lm_head as the target's, projected to H_d by a random orthonormal R; -> R.

    Then logits = (E R)(R^T x) ~ the target's own scores seen through a
    rank-H_d window: a far better start than noise for a 49k-token vocabulary.
    Training keeps the table of that form, E·P with P learned from R on
    (`train/projected.py`), so the checkpoint ships P, not 49,152 rows.
    """
    H_b, H_d = target.hidden_size, assistant.config.get_text_config().hidden_size
    g = torch.Generator().manual_seed(seed)
    R, _ = torch.linalg.qr(torch.randn(H_b, H_d, generator=g, device="cpu"))  # [H_b, H_d], orthonormal columns
    R = R.to(target.embed_tokens.weight.device)
    with torch.no_grad():
        assistant.model.embed_tokens.weight.copy_(target.embed_tokens.weight.float() @ R)
        w = assistant.pre_projection.weight  # [H_d, 2*H_b]: [embedding half | hidden half]
        w.normal_(std=0.02 / math.sqrt(H_b))
        w[:, H_b:] += R.T
        assistant.post_projection.weight.copy_(R)  # [H_b, H_d]
    return R


# --- the loss -------------------------------------------------------------------------------


def assistant_loss(assistant, target, ids, mask, h, K, V, depth: int, beta: float, anchors: int, generator=None,
                   table: torch.Tensor | None = None):
    """Teacher-forced loss at up to `anchors` random anchor positions of one example.

    h [T, H_b] post-norm target states; K, V [1, kv, T, d] the target layer's.
    table: the tied LM head [V, H_d] as E·P while training (default: the assistant's own).
    """
    T = ids.shape[0]
    H_b = target.hidden_size
    ok = [p for p in range(1, T - 1) if mask[p + 1]]  # step 0 at p predicts x_{p+1}, a response token
    if not ok:
        return None, []
    pick = torch.randperm(len(ok), generator=generator, device="cpu")[:anchors]
    p = torch.tensor(ok, device=ids.device)[pick.to(ids.device)].sort().values  # [P]
    P = p.numel()
    allowed = torch.arange(T, device=ids.device)[None] < p[:, None]  # [P, T]: K/V of positions < p
    bias = additive(allowed, torch.float32)[None, None]
    masks = {"full_attention": bias, "sliding_attention": bias}
    shared = {"full_attention": (K, V), "sliding_attention": (K, V)}
    scale = math.sqrt(H_b)
    state = h[p - 1][None]  # [1, P, H_b]
    weights = [beta**s for s in range(depth)]
    loss, accs = None, []
    for s in range(depth):
        tok = (p + s).clamp(max=T - 1)
        label_pos = p + s + 1
        valid = label_pos <= T - 1
        label_pos = label_pos.clamp(max=T - 1)
        valid = valid & mask[label_pos]
        e = target.embed_tokens(ids[tok])[None].float() * scale  # [1, P, H_b]
        x = assistant.pre_projection(torch.cat([e, state], dim=-1))  # [1, P, H_d]
        # output_hidden_states: transformers 5.24 otherwise takes a shortcut for KV-shared layers that
        # slices per-layer inputs, which an assistant does not have (a TypeError); 5.19-5.22 have no shortcut
        d = assistant.model(inputs_embeds=x, attention_mask=masks, position_ids=p[None], shared_kv_states=shared,
                            use_cache=False, output_hidden_states=True).last_hidden_state  # [1, P, H_d], normed
        if valid.any():
            logits = assistant.lm_head(d[0, valid]) if table is None else d[0, valid] @ table.T  # [r, V]
            labels = ids[label_pos[valid]]
            term = weights[s] * F.cross_entropy(logits, labels)
            loss = term if loss is None else loss + term
            accs.append(float((logits.argmax(-1) == labels).float().mean()))
        state = assistant.post_projection(d)  # [1, P, H_b]
    return (None if loss is None else loss / sum(weights)), accs


def example_loss(assistant, target, f, depth, beta, anchors, generator=None, table=None):
    """`assistant_loss` over one example's Features (the target's states and K/V, captured once)."""
    return assistant_loss(assistant, target, f.ids, f.loss_mask, f.last.float(), f.keys.float(), f.values.float(),
                          depth, beta, anchors, generator, table)


@torch.no_grad()
def evaluate(assistant, target, feats, depth: int) -> list[float]:
    """Teacher-forced top-1 accuracy of each draft step over `feats`, at every anchor (mean over examples)."""
    totals = [example_loss(assistant, target, f, depth, 0.6, 10_000)[1] for f in feats]
    return [round(sum(a[k] for a in totals if len(a) > k) / max(1, sum(len(a) > k for a in totals)), 3)
            for k in range(depth)]


# --- training: data -> loss -> the loop ------------------------------------------------------


def train(target, steps: int = 1200, depth: int = 3, beta: float = 0.6, lr: float = 1e-3, anchors: int = 48,
          hidden_size: int = 128, num_layers: int = 4, budget_min: float | None = None, save_every: int = 50,
          work_dir=None, data_dir=None, seed: int = 0, progress: bool = True, log=print,
          eval_every: int | None = None, templated_share: float | None = None) -> tuple[Student, Run]:
    """A fresh assistant (table = E·P), trained on the target's answers; resumes from the work dir.

    -> (Student, Run); the student's assistant holds the table E·P in its tied
    embedding, and student.table.proj is P, what the checkpoint ships.
    templated_share: the fraction of steps that read a templated example (sources.source_weights; default: each
    example once per epoch, in a seeded order).
    """
    data = training_data(target, kv_layer=kv_layer(target), data_dir=data_dir, progress=progress)
    target.model.requires_grad_(False)
    assistant = random_assistant(target, seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                                 num_heads=2 * target.config.num_key_value_heads).float()
    E = target.embed_tokens.weight.detach().float()  # [V, H_b]
    student = Student(assistant, ProjectedTable(E, init_from_target(assistant, target, seed)))
    assistant.model.embed_tokens.weight.requires_grad_(False)  # tied to lm_head; E·P stands in for both
    order = list(range(len(data.train)))
    random.Random(seed).shuffle(order)
    pick = example_picker(order, None if templated_share is None else source_weights(data.examples, templated_share))

    def loss(step, generator):
        f = data.train[pick(step, generator)]  # one example per step
        value, accs = example_loss(assistant, target, f, depth, beta, anchors, generator, student.table())
        return value, {"acc": accs, "tokens": len(f.ids)}

    def held_out():
        with torch.no_grad():
            assistant.model.embed_tokens.weight.copy_(student.table())  # evaluate with the table as trained
        return {"acc": evaluate(assistant, target, data.eval[:20], depth)}

    config = {"depth": depth, "beta": beta, "anchors": anchors, "hidden_size": hidden_size, "layers": num_layers,
              "templated_share": templated_share}
    run = train_loop(student, loss, Budget(steps, budget_min), work_dir_for(target.name, "gemma4_mtp", work_dir),
                     lr=lr, evaluate=held_out, eval_every=eval_every, save_every=save_every, log_every=10, seed=seed,
                     config=config,
                     data=data.record, progress=progress, log=log)
    with torch.no_grad():  # the tied embedding / lm_head becomes the table it was trained as
        assistant.model.embed_tokens.weight.copy_(student.table())
    return student, run


# --- export ------------------------------------------------------------------------------------


def export(student: Student, target, out_dir, run: Run, command: str | None = None) -> Path:
    """The HF gemma4_assistant folder in bf16, its table replaced by P (`checkpoints.materialize` rebuilds it)."""
    proj = student.table.proj.detach()

    def write(folder):
        student.assistant.to(torch.bfloat16).save_pretrained(folder)
        strip_table(folder, proj)

    out = export_folder(out_dir, write, recipe(run, "gemma4_mtp", target, command))
    student.assistant.float()
    return out


# --- the command line: specdec train gemma4_mtp ----------------------------------------------------

DEFAULTS = {"steps": 1200, "lr": 1e-3}


def add_arguments(p) -> None:
    p.add_argument("--depth", type=int, default=3, help="draft steps trained per anchor")
    p.add_argument("--beta", type=float, default=0.6, help="step s's loss weight is beta**s")
    p.add_argument("--anchors", type=int, default=48, help="anchor positions per example and step")
    p.add_argument("--hidden-size", type=int, default=128, help="the assistant's width")
    p.add_argument("--layers", type=int, default=4, help="the assistant's decoder layers")
    add_share_argument(p)


def cli(args, command: str) -> Path:
    from ..target import load

    target = load(args.target, dtype="fp32", device=args.device, invariant=False)  # the loss reads its embedding
    student, run = train(target, args.steps, args.depth, args.beta, args.lr, args.anchors, args.hidden_size,
                         args.layers, args.budget_min, work_dir=args.work_dir, data_dir=args.data_dir, seed=args.seed,
                         progress=not args.no_progress, eval_every=args.eval_every,
                         templated_share=args.templated_share)
    return export(student, target, args.out or shipped_folder("gemma4_mtp", target.name), run, command)
