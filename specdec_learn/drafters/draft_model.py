"""Classic speculative decoding: a smaller language model drafts.

The original recipe (Leviathan et al. 2023; Chen et al. 2023): a small model
that shares the target's tokenizer runs k cheap autoregressive steps, and the
big model checks all k in one pass. The small model keeps its own KV cache.
Its cache holds only committed tokens plus its own latest drafts, so after
each round we crop it back to the prefix the target accepted.

Under sampling the drafts are drawn from the draft model's own distribution q
(with the request's temperature / top-k / top-p applied) and q goes to the
rejection sampler; under greedy decoding the drafts are argmaxes and need no q.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..sampling import draft_token
from ..target import crop_cache
from .base import Drafter, Proposal


class DraftModelDrafter(Drafter):
    name = "draft_model"

    def __init__(self, model, target=None):
        """`model`: an HF causal LM sharing the target's vocabulary (checked when `target` is given)."""
        self.model = model.eval()
        self.cache: DynamicCache | None = None
        if target is not None:
            check_same_vocabulary(model, target)

    def start(self, target, state, hidden) -> None:
        check_same_vocabulary(self.model, target)
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def _step(self, tokens: list[int]) -> torch.Tensor:
        """Run `tokens` after the draft cache; -> next-token logits [V] of the last one."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.model.device)  # [1, n]
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def propose(self, state, k, sampling, generator) -> Proposal:
        # Catch up on committed tokens the draft model has not seen yet
        # (the whole prompt at first, afterwards the target's own token(s)).
        logits = self._step(state.ids[self.cache.get_seq_length() :])
        tokens, qs = [], []
        for i in range(k):
            tokens.append(draft_token(logits, sampling, generator, qs))
            if i < k - 1:  # the last draft is not fed back: the next round starts from the target's token
                logits = self._step(tokens[-1:])
        return Proposal(tokens, torch.stack(qs) if qs else None)

    def observe(self, state, accepted, hidden) -> None:
        # The cache holds committed ids up to `last`, then d1..d(k-1). Keep the
        # accepted drafts; state.ids[-1] (the target's token) is run next round.
        crop_cache(self.cache, len(state.ids) - 1)


def check_same_vocabulary(draft_model, target) -> None:
    """A draft model must score the same token ids as the target."""
    v_draft = draft_model.get_output_embeddings().weight.shape[0]
    if v_draft != target.vocab_size:
        raise ValueError(
            f"The draft model's vocabulary has {v_draft} tokens but the target's has "
            f"{target.vocab_size}: a draft model must share the target's tokenizer. "
            "Pick a draft model from the same family as the target."
        )


def load_draft_model(path, target) -> DraftModelDrafter:
    """A draft model from an HF folder (complete: see checkpoints.complete), in the target's dtype and device."""
    from ..models import load_hf

    model, _ = load_hf(str(path), dtype=target.dtype, device=str(target.device))
    return DraftModelDrafter(model, target)
