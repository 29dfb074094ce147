"""A draft vocabulary: let the drafter score only the tokens it will ever propose.

A drafter that borrows the target's LM head scores all V tokens at every
drafted slot: for SmolLM2 that is a [576 x 49,152] matrix, 57 MB in bf16,
read at every head call. On a CPU a matmul with a few rows is bound by
reading its weights, so the head costs about what its share of the weights
says. For a small drafter that is most of its own work (chapter 4 counts the
head as 87 % of an MTP step's weights), so it shows in c, the draft cost per
token that `specdec bench` reports.

Most of those 49,152 tokens never appear in an answer. EAGLE-3 keeps only
the V_d most frequent ones (``d2t``/``t2d`` in the speculators format; its
``draft_vocab_size`` is 32,000 for Llama's 128k), and speculators gives its
DFlash and DSpark the same option. The rule (speculators'
``train/vocab_mapping.py``, EAGLE's ``cnets.py``): count the target's own
answer tokens in the training data, keep the V_d most frequent, sorted by id.

`choose_draft_vocab` applies that rule to any examples (EAGLE-3's training
here uses it too; train/corpus.py's `corpus_vocabulary` applies it to the
committed corpus, datasets/: reading the corpus is training's business, a
floor above this one, so it lives there).
`ReducedHead` is the head over that subset: it multiplies by V_d rows of the
target's head only, and puts -inf everywhere else, so every later step
(argmax, sampling, a tree's top candidates) runs unchanged. Still lossless:
the drafter can no longer *propose* a token outside the subset, which only
costs acceptance when the target wanted one; the verifier decides as before
(under sampling, q is zero outside the subset and rejection sampling stays
exact, verify.py). `cut_output_head` puts one in place of an HF model's own
head (the draft model's, the assistant's). DSpark's Markov bias, another
[V x r] product per drafted slot, is cut the same way
(`DSparkDrafter.markov_bias` in drafters/dspark.py, a ReducedHead over W2).

Glossary: *V_d* = draft vocabulary size; *coverage* = the share of answer
tokens that fall inside the subset.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn


def choose_draft_vocab(examples, size: int, vocab_size: int, always=()) -> torch.Tensor:
    """The `size` most frequent answer tokens of `examples` (plus `always`), sorted by id: [size] ids.

    examples: objects with ``input_ids`` and ``loss_mask`` (train.examples.Example);
    only answer (loss-masked) positions count. always: ids kept whatever their
    count (the end-of-sequence tokens, so that the drafter can still propose
    the end of the answer). When the answers use fewer distinct tokens, the
    lowest unused ids fill the rest, so there are always exactly `size`
    (EAGLE-3's d2t has that many rows).
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"A draft vocabulary needs 1..{vocab_size} tokens (the target's); got {size}.")
    counts = Counter(t for ex in examples for t, m in zip(ex.input_ids, ex.loss_mask) if m)
    chosen = list(dict.fromkeys([*always, *(t for t, _ in counts.most_common())]))[:size]
    taken = set(chosen)
    fill = (t for t in range(vocab_size) if t not in taken)
    chosen += [next(fill) for _ in range(size - len(chosen))]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def coverage(examples, ids) -> float:
    """The share of the examples' answer tokens that are in `ids`."""
    inside, total = 0, 0
    ids = set(ids)
    for ex in examples:
        for t, m in zip(ex.input_ids, ex.loss_mask):
            if m:
                total += 1
                inside += t in ids
    return inside / max(total, 1)


class ReducedHead(nn.Module):
    """A linear head [V, H] cut to the rows `ids` [V_d]: logits [.., V] with -inf outside them.

    A drop-in for the target's ``lm_head``: same input, same output shape,
    a sixth of the weights read at V_d = 8,192.
    """

    def __init__(self, head: nn.Linear, ids):
        super().__init__()
        ids = torch.as_tensor(list(ids), dtype=torch.long, device=head.weight.device)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= head.weight.shape[0]:
            raise ValueError(f"Draft vocabulary ids must lie in 0..{head.weight.shape[0] - 1}.")
        self.vocab_size = head.weight.shape[0]
        self.register_buffer("ids", ids, persistent=False)  # [V_d] target ids, sorted
        self.register_buffer("weight", head.weight.detach()[ids].clone(), persistent=False)  # [V_d, H]

    @property
    def draft_vocab_size(self) -> int:
        return self.ids.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [n, H], packed (speedups.pack_single_rows says why)
        scores = rows @ self.weight.to(x.dtype).T  # [n, V_d]
        full = scores.new_full((rows.shape[0], self.vocab_size), float("-inf"))  # [n, V]
        return full.index_copy_(-1, self.ids, scores).view(*x.shape[:-1], self.vocab_size)


def cut_output_head(model, ids, full_head: nn.Linear | None = None) -> nn.Linear:
    """Swap an HF model's output head for its rows `ids` (a ReducedHead); -> the uncut head.

    full_head: the uncut head a previous cut returned, so that cutting again
    starts from all V rows, not from the last cut.
    """
    full_head = full_head or model.get_output_embeddings()
    model.set_output_embeddings(ReducedHead(full_head, sorted(ids)))
    return full_head
