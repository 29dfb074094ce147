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

    python -m specdec_learn.train.draft_model --target smollm2-135m --budget-min 15

Resumable (state under ``$SPECDEC_CACHE/train/draft-<target>/``). The shipped
checkpoint (``specdec_learn/checkpoints/draft-<target>/``, bf16) holds the
layers and P, not the 49,152-row table; `checkpoints.materialize`
rebuilds a complete HF folder from it and the target's embedding, which our
loop, HF ``generate(assistant_model=...)`` and vLLM's ``draft_model`` load.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ..checkpoints import shipped_folder, write_draft_delta
from .data import training_split, work_dir_for
from .projected import ProjectedTable, principal_directions
from .schedule import load_state, save_state, set_lr, warmup_cosine


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

    def loss(self, ids: torch.Tensor, mask: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Cross-entropy of the next token on response positions; -> (loss, top-1 accuracy)."""
        h = self.llama.model(inputs_embeds=F.embedding(ids, table)[None]).last_hidden_state[0]  # [T, d]
        rows = mask[1:].nonzero().squeeze(-1)  # position t predicts ids[t+1], a response token
        logits = h[rows] @ table.T  # [r, V]
        labels = ids[rows + 1]
        return F.cross_entropy(logits, labels), float((logits.argmax(-1) == labels).float().mean())


def train(target, steps: int, batch: int = 8, lr: float = 2e-3, budget_s: float | None = None,
          save_every: int = 25, work_dir=None, data_dir=None, seed: int = 0, log=print, **shape) -> tuple[Student, int]:
    name = Path(str(target.name)).name
    work_dir = work_dir_for(name, "draft", work_dir)
    examples, held_out = training_split(name, data_dir)
    torch.manual_seed(seed)
    student = Student(target.model.get_input_embeddings().weight.detach(), student_config(target.model.config, **shape))
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    state_file, step = work_dir / "state.pt", 0
    if saved := load_state(state_file, log):
        student.load_state_dict(saved["student"]), opt.load_state_dict(saved["opt"])
        step = saved["step"]
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    t0 = time.perf_counter()
    student.train()
    while step < steps and (budget_s is None or time.perf_counter() - t0 < budget_s):
        set_lr(opt, warmup_cosine(step, steps, lr))
        table = student.table()  # once per step: its backward into P is the step's largest matmul
        total, accs = 0.0, []
        for j in range(batch):
            ex = examples[order[(step * batch + j) % len(order)]]
            loss, acc = student.loss(torch.tensor(ex.input_ids), torch.tensor(ex.loss_mask), table)
            total = total + loss / batch
            accs.append(acc)
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            log(f"{time.perf_counter() - t0:.0f}s step {step} loss {float(total.detach()):.3f} acc {sum(accs) / len(accs):.2f}")
        if step % save_every == 0:
            save_state(state_file, student=student.state_dict(), opt=opt.state_dict(), step=step)
    save_state(state_file, student=student.state_dict(), opt=opt.state_dict(), step=step)
    student.eval()
    return student, step


@torch.no_grad()
def evaluate(student: Student, examples) -> float:
    """Held-out teacher-forced top-1 agreement with the target's greedy answers (~ first-draft acceptance)."""
    table, hits, total = student.table(), 0.0, 0
    for ex in examples:
        if ex.variant != "greedy":
            continue
        ids, mask = torch.tensor(ex.input_ids), torch.tensor(ex.loss_mask)
        _, acc = student.loss(ids, mask, table)
        n = int(mask[1:].sum())
        hits, total = hits + acc * n, total + n
    return round(hits / max(total, 1), 3)


def main(argv=None):
    from ..target import load

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=8, help="examples per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--budget-min", type=float, default=None, help="stop after this many minutes (resumable)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="export folder (default: checkpoints/draft-<target>)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load(args.target, dtype="fp32", device="cpu")
    student, step = train(target, args.steps, args.batch, args.lr, args.budget_min * 60 if args.budget_min else None,
                          hidden=args.hidden, layers=args.layers, intermediate=3 * args.hidden)
    _, held_out = training_split(Path(args.target).name)
    accuracy = evaluate(student, held_out)
    print(f"held-out top-1 agreement with the target's greedy answers: {accuracy}")
    info = {"target": Path(args.target).name, "steps": step, "batch": args.batch, "lr": args.lr,
            "held_out_top1": accuracy,
            "command": f"python -m specdec_learn.train.draft_model --target {args.target} --steps {args.steps} "
                       f"--budget-min {args.budget_min} --threads {args.threads}"}
    out = write_draft_delta(student.llama, student.table.proj, args.out or shipped_folder("draft_model", args.target),
                           args.target, info)
    print(json.dumps({"exported": str(out), "steps": step}))


if __name__ == "__main__":
    main()
