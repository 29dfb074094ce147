"""Classic speculative decoding: a smaller language model drafts.

The original recipe (Leviathan et al. 2023; Chen et al. 2023): a small model
that shares the target's tokenizer runs k cheap autoregressive steps, and the
big model checks all k in one pass. The small model keeps its own KV cache.
Its cache holds only committed tokens plus its own latest drafts, so after
each round we crop it back to the prefix the target accepted.

Two kinds of draft model need more than a crop (kv_cache.py explains both):

* sliding-window layers (a Gemma 3 drafting for a bigger Gemma 3): the cache
  is told to keep its past once the committed tokens are in (`record_past`),
  as transformers' assisted decoding does for its assistant's cache, so that
  the crop still works past the window;
* linear-attention layers (a small Qwen3.5 drafting for a big one): their
  state is snapshotted after the catch-up, when it holds committed tokens
  only, and put back in `observe`; the next catch-up then feeds the accepted
  drafts again, in one batched pass (n+1 tokens instead of one).

Under sampling the drafts are drawn from the draft model's own distribution q
(with the request's temperature / top-k / top-p applied) and q goes to the
rejection sampler; under greedy decoding the drafts are argmaxes and need no q.

A tree (tree.py) is grown as EAGLE-2 grows one: one batched draft-model pass
per depth, the nodes of a depth side by side, each told by a 4D attention
mask to see the committed cache and its own ancestors only. Afterwards the
cache is cropped back to the committed tokens, and the next catch-up runs the
accepted path in one pass. Only a draft model whose every layer keeps every
position (full attention) can do this; others draft chains.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..sampling import draft_token
from ..compat import cache_arg, cached_length
from ..kv_cache import LinearState, crop_cache, is_linear, keeps_every_position, record_past
from ..speedups import pack_single_rows
from ..tree import additive, ancestor_mask, dynamic_tree
from ..vocab import ReducedHead, cut_output_head
from .base import Drafter, Proposal


class DraftModelDrafter(Drafter):
    name = "draft_model"

    def __init__(self, model, target=None):
        """`model`: an HF causal LM sharing the target's vocabulary (checked when `target` is given)."""
        self.model = model.eval()
        self.cache: DynamicCache | None = None
        self.committed: LinearState | None = None  # linear-attention draft models: the state after the catch-up
        self.committed_len = 0  # positions in the cache when that snapshot was taken
        self.tree_base: int | None = None  # after a tree: the committed positions, where the cache is cropped
        self.full_head = None  # the model's own head, once reduce_vocabulary has swapped it
        self.is_target = target is not None and model is target.model  # the target drafting for itself
        pack_single_rows(model.get_output_embeddings())  # speedups.py: bf16 on a CPU, one row at a time
        if target is not None:
            check_same_vocabulary(model, target)

    @classmethod
    def build(cls, target, draft, options) -> DraftModelDrafter:
        """The shipped draft model, a folder, an embedded model's name, or "target": the target drafts for
        itself (every draft accepted: an upper bound on acceptance that costs a full extra model)."""
        if draft == "target":
            return cls(target.model, target)
        from ..checkpoints import find

        return load_draft_model(find("draft_model", target.name, draft), target)

    can_reduce_vocabulary = True

    def reduce_vocabulary(self, ids) -> None:
        """Score only the tokens `ids` (vocab.py): the model's own head is swapped for its cut rows."""
        if self.is_target:
            raise ValueError("The target drafting for itself shares its head with the verifier: cutting it would "
                             "change the target's own output. Drop the draft vocabulary for --draft target.")
        self.full_head = cut_output_head(self.model, ids, self.full_head)  # kept, should this be called again

    def start(self, target, state, hidden) -> None:
        check_same_vocabulary(self.model, target)
        self.cache = DynamicCache(config=self.model.config)
        self.committed = None
        self.tree_base = None

    @torch.inference_mode()
    def _step(self, tokens: list[int]) -> torch.Tensor:
        """Run `tokens` after the draft cache; -> next-token logits [V] of the last one."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.model.device)  # [1, n]
        out = self.model(input_ids=ids, **cache_arg(self.cache), use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def _catch_up(self, state) -> torch.Tensor:
        """Run the committed tokens the draft model has not seen yet -> logits [V] after `last`.

        That is the whole prompt at first, afterwards the target's own token
        (after a chain) or the accepted path and the target's token (after a tree).
        """
        logits = self._step(state.ids[cached_length(self.cache) :])
        # Everything in the cache is committed now; what follows may be rejected.
        record_past(self.cache)
        if any(is_linear(layer) for layer in self.cache.layers):
            self.committed, self.committed_len = LinearState.take(self.cache), cached_length(self.cache)
        return logits

    def propose(self, state, k, sampling, generator) -> Proposal:
        logits = self._catch_up(state)
        tokens, qs = [], []
        for i in range(k):
            tokens.append(draft_token(logits, sampling, generator, qs))
            if i < k - 1:  # the last draft is not fed back: the next round starts from the target's token
                logits = self._step(tokens[-1:])
        return Proposal(tokens, torch.stack(qs) if qs else None)

    # -- trees ------------------------------------------------------------
    can_branch = True

    def check_tree(self, tree) -> None:
        super().check_tree(tree)
        if not keeps_every_position(self.model.config):
            raise ValueError("This draft model has sliding-window or linear-attention layers, which cannot keep "
                             "a tree's scattered positions: draft a chain (k) with it instead.")

    @torch.inference_mode()
    def propose_tree(self, state, tree, sampling, generator) -> Proposal:
        """EAGLE-2's dynamic tree (tree.dynamic_tree), one draft-model pass per depth.

        The drafts are the top candidates, not samples: under sampling the
        verifier treats them as one-hot (verify.py), which keeps it lossless.
        """
        root = self._catch_up(state).float().softmax(-1)  # [V]
        self.tree_base = cached_length(self.cache)  # = len(state.ids): `last` is in the cache
        rows: dict[int, int] = {}  # node -> its row in the draft cache

        def step(run, tokens, parents, depth):
            return self._tree_step(run, tokens, parents, rows, depth).float().softmax(-1)  # [n, V]

        tokens, parents = dynamic_tree(root, step, tree)
        return Proposal(tokens, parents=parents)

    def _tree_step(self, run, tokens, parents, rows, depth) -> torch.Tensor:
        """Run the nodes `run` (all at `depth`) after the cache, side by side -> their next-token logits [n, V]."""
        device, dtype = self.model.device, self.model.dtype
        past = cached_length(self.cache)
        rows.update({c: past + i for i, c in enumerate(run)})
        sees = ancestor_mask(run, parents, rows, past + len(run), device)  # [n, past + n]
        sees[:, : self.tree_base] = True  # every committed token
        mask = additive(sees, dtype)
        ids = torch.tensor([[tokens[c] for c in run]], dtype=torch.long, device=device)  # [1, n]
        positions = torch.full((1, len(run)), self.tree_base + depth - 1, dtype=torch.long, device=device)  # [1, n]
        out = self.model(input_ids=ids, **cache_arg(self.cache), use_cache=True,
                         attention_mask=mask[None, None], position_ids=positions)  # mask [1, 1, n, past + n]
        return out.logits[0]

    def observe(self, state, accepted, hidden) -> None:
        if self.tree_base is not None:  # after a tree: back to the committed tokens; the path runs next round
            crop_cache(self.cache, self.tree_base)
            self.tree_base = None
            return
        # The cache holds committed ids up to `last`, then d1..d(k-1). Keep the
        # accepted drafts; state.ids[-1] (the target's token) is run next round.
        if self.committed is None:
            crop_cache(self.cache, len(state.ids) - 1)
            return
        # Linear-attention layers cannot drop drafts: go back to the state after
        # the catch-up (attention layers cropped to match) and let the next
        # catch-up run the accepted drafts again.
        self.committed.restore(self.cache)
        crop_cache(self.cache, self.committed_len)
        self.committed = None


def check_same_vocabulary(draft_model, target) -> None:
    """A draft model must score the same token ids as the target."""
    head = draft_model.get_output_embeddings()
    v_draft = head.vocab_size if isinstance(head, ReducedHead) else head.weight.shape[0]
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
