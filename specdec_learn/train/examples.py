"""A training example: the target's own answer to one prompt, its held-out side, its name, the data's hash.

Every learned drafter trains on examples of one shape (`Example`): a prompt's
chat-templated ids followed by the target's answer, with a mask over the
answer (the tokens a drafter must learn to predict). The corpus (corpus.py)
and a JSONL dataset (data.py) both read back as examples, and everything
after them (features.py, sources.py, the trainers) reads examples only, so
the rules about examples alone live here, below all of them:

* a variant names how an answer was made: "greedy", or "T<temp>s<seed>" for a
  sampled one (several sampled answers to one prompt are different examples);
* the held-out split is by prompt id (`split_examples`), so every variant of a
  prompt lands on the same side and a grown dataset keeps its held-out set;
* an example's key (`example_key`) is its id, variant and very tokens, so
  other text never reads another example's cached features;
* `fingerprint` is what recipe.json records of a run's data: where, how much,
  and a hash of exactly which examples (the retraining job compares it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass
class Example:
    id: str  # the prompt id it came from (a workload train-split id or a generated-prompt id)
    input_ids: list[int]  # chat-templated prompt + the target's own response
    loss_mask: list[bool]  # True on response positions (the tokens a drafter must learn to predict)
    variant: str = "greedy"  # "greedy", or "T<temperature>s<seed>" for a sampled response

    @property
    def num_prompt_tokens(self) -> int:
        return self.loss_mask.index(True) if True in self.loss_mask else len(self.loss_mask)


def variant_name(temperature: float, seed: int) -> str:
    return "greedy" if temperature == 0 else f"T{temperature:g}s{seed}"


def split_examples(examples: list[Example], eval_fraction: float = 0.05) -> tuple[list[Example], list[Example]]:
    """(train, eval) split by prompt id (all variants of a prompt on the same side), stable across runs."""
    def is_eval(ex):
        return int(hashlib.sha256(("eval:" + ex.id).encode()).hexdigest(), 16) % 10_000 < eval_fraction * 10_000

    return [ex for ex in examples if not is_eval(ex)], [ex for ex in examples if is_eval(ex)]


def example_key(ex: Example) -> str:
    """The name of an example's feature file: its id, variant and very tokens (other text, other features)."""
    return hashlib.sha1(f"{ex.id}|{ex.variant}|{ex.input_ids}".encode()).hexdigest()[:16]


def fingerprint(examples: list[Example], held_out: list[Example], data_dir) -> dict:
    """What recipe.json says about the data: where, how much, and a hash of exactly which examples."""
    digest = hashlib.sha256()
    for ex in [*examples, *held_out]:
        digest.update(example_key(ex).encode())
    return {"dir": str(data_dir), "train_examples": len(examples), "held_out_examples": len(held_out),
            "response_tokens": sum(sum(ex.loss_mask) for ex in examples), "sha256": digest.hexdigest()}
