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

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import DynamicCache

from ..models import materialize, without_table
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


# --- the shipped draft model ---------------------------------------------------------
#
# No smaller SmolLM2 ships offline, so this package ships one it distilled
# (`train/draft_model.py`): a narrow Llama whose embedding is the target's,
# projected, E_draft = E_target · P. The checkpoint folder holds the layers and
# P ("embed_projection" [H_target, d]) but not the 49,152-row table, which
# `models.materialize` rebuilds from the target's own weights into an ordinary
# HF folder (what our loop, HF `assistant_model` and vLLM's `draft_model` load).

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


def save_draft_delta(llama, proj: torch.Tensor, out_dir, target_name: str, info: dict) -> Path:
    """Write a draft model without its embedding: config.json + model.safetensors (layers, norm, P), bf16."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(without_table(llama.state_dict(), proj), out / "model.safetensors", metadata={"format": "pt"})
    config = llama.config.to_dict()
    config.update(architectures=["LlamaForCausalLM"], dtype="bfloat16")
    config["specdec_draft"] = {"target": Path(str(target_name)).name,
                               "embedding": "model.embed_tokens.weight = target embedding @ embed_projection",
                               "training": info}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def shipped_draft_model(target_name: str) -> Path:
    """The HF folder of the draft model this package ships for `target_name`, or a clear error."""
    name = Path(str(target_name)).name
    folder = CHECKPOINTS / f"draft-{name}"
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"No draft model is shipped for {name!r}: pass draft=<an HF model sharing its tokenizer> "
            "(CLI: --draft), draft='target' for the upper bound, or distil one with "
            "`python -m specdec_learn.train.draft_model`."
        )
    return materialize(folder, target_name)
