"""Distil a small draft model for a target that ships without one (SmolLM2-135M).

Classic speculative decoding needs a smaller model with the target's
tokenizer. SmolLM2-135M is already the smallest of its family, so we make
one: a narrow Llama (hidden 256, 4 layers) trained on the target's own
answers (the shared dataset, `train/data.py`; never a benchmark prompt).

Why narrow, and why the embedding is borrowed. At batch 1 a forward pass
costs the bytes it reads. The largest matrix of a small model is its
embedding / LM head, vocabulary x width: for SmolLM2 that is 49,152 x 576,
28 M of its 135 M parameters. A draft model that kept the width would pay
~20 % of a target step per draft token for the table alone; at width 256 a
draft step reads ~12 %. And a 49,152-row table is too big to ship and too
much to learn from a few hundred thousand tokens, so the draft's embedding
is the target's, projected:

    E_draft = E_target · P        E_target [V, 576] frozen, P [576, 256] learned

P starts as E_target's top 256 principal directions (right singular
vectors), so the draft starts with the most of the target's token geometry
a 256-wide table can hold. The LM head is tied to E_draft, as in SmolLM2.

The loss is cross-entropy on the target's answers (sequence-level
distillation: the data *is* what the target said), response tokens only.

    specdec train draft_model --target smollm2-135m --steps 1500 --budget-min 15

Resumable (train/loop.py: the state lives under ``$SPECDEC_CACHE/train/draft-<target>/``).
The shipped checkpoint (``specdec_learn/checkpoints/draft-<target>/``, bf16) holds the
layers and P, not the 49,152-row table; `checkpoints.materialize`
rebuilds a complete HF folder from it and the target's embedding, which our
loop, HF ``generate(assistant_model=...)`` and vLLM's ``draft_model`` load.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ..checkpoints import shipped_folder, write_draft_delta
from .features import training_data
from .loop import RECIPE, Budget, Run, export as export_folder, recipe, train_loop, work_dir_for
from .projected import ProjectedTable, principal_directions
from .sources import add_share_argument, prompt_source, source_weights


def student_config(target_config, hidden: int = 256, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                   intermediate: int = 768) -> LlamaConfig:
    """A narrow Llama with the target's vocabulary, special tokens and rotary settings."""
    keep = ("vocab_size", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id",
            "pad_token_id", "rope_parameters", "rope_theta")
    same = {k: getattr(target_config, k) for k in keep if getattr(target_config, k, None) is not None}
    return LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       tie_word_embeddings=True, **same)


class Student(torch.nn.Module):
    """The draft model being trained: a Llama whose embedding is E_target · P (P from the principal directions)."""

    def __init__(self, target_embedding: torch.Tensor, config: LlamaConfig):
        super().__init__()
        self.table = ProjectedTable(target_embedding, principal_directions(target_embedding, config.hidden_size))
        self.llama = LlamaForCausalLM(config)
        self.llama.model.embed_tokens = None  # never used: the table is E_target · P, built each step
        self.llama.lm_head = None

    def logits(self, ids: torch.Tensor, rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Next-token logits [r, V] at positions `rows` of `ids` [T] (only those rows meet the table)."""
        h = self.llama.model(inputs_embeds=F.embedding(ids, table)[None]).last_hidden_state[0]  # [T, d]
        return h[rows] @ table.T  # [r, V]

    def loss(self, ids: torch.Tensor, mask: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Cross-entropy of the next token on response positions; -> (loss, top-1 accuracy)."""
        rows = response_rows(mask)
        logits, labels = self.logits(ids, rows, table), ids[rows + 1]  # [r, V], [r]
        return F.cross_entropy(logits, labels), float((logits.argmax(-1) == labels).float().mean())


def response_rows(mask: torch.Tensor) -> torch.Tensor:
    """Positions t [r] whose next token ids[t+1] is a response token: where the loss and the score read."""
    return mask[1:].nonzero().squeeze(-1)


def agreement(next_logits, examples) -> dict:
    """Teacher-forced top-1 agreement with the target's greedy answers, overall and per prompt source.

    next_logits(ids [T], rows [r]) -> logits [r, V] of any model with the
    target's tokenizer: the student in training, a saved folder in
    benchmarks/heldout_accuracy.py, so both are scored alike. Sampled answers
    are skipped (their tokens are often not the target's argmax). Agreement
    weighs every response token once (~ first-draft acceptance).
    -> {"acc": [a], "acc_magpie": [a], "acc_templated": [a]}
    """
    hits: dict[str, int] = {}
    total: dict[str, int] = {}
    for ex in examples:
        if ex.variant != "greedy":
            continue
        ids, mask = torch.tensor(ex.input_ids), torch.tensor(ex.loss_mask)
        rows = response_rows(mask)
        right = int((next_logits(ids, rows).argmax(-1) == ids[rows + 1]).sum())
        for key in ("acc", f"acc_{prompt_source(ex.id)}"):
            hits[key] = hits.get(key, 0) + right
            total[key] = total.get(key, 0) + len(rows)
    return {key: [round(hits[key] / max(total[key], 1), 4)] for key in hits}


@torch.no_grad()
def evaluate(student: Student, examples) -> dict:
    """The student's held-out agreement (`agreement`), what a training run logs at each evaluation."""
    table = student.table()
    return agreement(lambda ids, rows: student.logits(ids, rows, table), examples)


# --- training: data -> loss -> the loop ------------------------------------------------------


def train(target, steps: int = 1500, batch: int = 8, lr: float = 2e-3, budget_min: float | None = None,
          save_every: int = 25, work_dir=None, data_dir=None, seed: int = 0, progress: bool = True, log=print,
          eval_every: int | None = None, templated_share: float | None = None, **shape) -> tuple[Student, Run]:
    """A narrow student (`student_config(**shape)`) distilled on the target's answers; resumes. -> (Student, Run).

    templated_share: the fraction of examples drawn from templated prompts (sources.source_weights), drawn
    with replacement; default: every example once per epoch, in a shuffled order.
    """
    data = training_data(target, data_dir=data_dir, states=False)  # the tokens alone: no target forward
    torch.manual_seed(seed)
    student = Student(target.model.get_input_embeddings().weight.detach(), student_config(target.model.config, **shape))
    order = list(range(len(data.train)))
    random.Random(seed).shuffle(order)
    weights = None if templated_share is None else source_weights(data.examples, templated_share)  # [N]

    def batch_of(step, generator) -> list[int]:
        if weights is None:
            return [order[(step * batch + j) % len(order)] for j in range(batch)]
        return torch.multinomial(weights.cpu(), batch, replacement=True, generator=generator).tolist()

    def loss(step, generator):
        table = student.table()  # once per step: its backward into P is the step's largest matmul
        total, accs, tokens = 0.0, [], 0
        for i in batch_of(step, generator):
            f = data.train[i]
            value, acc = student.loss(f.ids, f.loss_mask, table)
            total, tokens = total + value / batch, tokens + len(f.ids)
            accs.append(acc)
        return total, {"acc": [sum(accs) / len(accs)], "tokens": tokens}

    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    config = {"batch": batch, "templated_share": templated_share,
              **{k: v for k, v in student.llama.config.to_dict().items() if k in sizes}}
    run = train_loop(student, loss, Budget(steps, budget_min), work_dir_for(target.name, "draft_model", work_dir),
                     lr=lr, weight_decay=0.01, evaluate=lambda: evaluate(student, data.held_out),
                     save_every=save_every, eval_every=eval_every, log_every=10, seed=seed, config=config, data=data.record,
                     progress=progress, log=log)
    return student, run


# --- export ------------------------------------------------------------------------------------


def export(student: Student, target, out_dir, run: Run, command: str | None = None) -> Path:
    """Layers, norm and P in bf16, without the table (`checkpoints.materialize` rebuilds it), and recipe.json."""
    return export_folder(out_dir, lambda tmp: write_draft_delta(student.llama, student.table.proj, tmp, target.name,
                                                                {"recipe": RECIPE}),
                         recipe(run, "draft_model", target, command))


# --- the command line: specdec train draft_model ---------------------------------------------------

DEFAULTS = {"steps": 1500, "lr": 2e-3}


def add_arguments(p) -> None:
    p.add_argument("--batch", type=int, default=8, help="examples per step")
    p.add_argument("--hidden", type=int, default=256, help="the student's width (its MLP is 3x that)")
    p.add_argument("--layers", type=int, default=4, help="the student's decoder layers")
    add_share_argument(p)


def cli(args, command: str) -> Path:
    from ..target import load

    target = load(args.target, dtype="fp32", device=args.device, invariant=False)  # only its embedding is read
    student, run = train(target, args.steps, args.batch, args.lr, args.budget_min, work_dir=args.work_dir,
                         data_dir=args.data_dir, seed=args.seed, progress=not args.no_progress, hidden=args.hidden,
                         layers=args.layers, intermediate=3 * args.hidden, eval_every=args.eval_every,
                         templated_share=args.templated_share)
    return export(student, target, args.out or shipped_folder("draft_model", target.name), run, command)
