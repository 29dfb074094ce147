"""What every drafter is: the verbs the loop calls, and the contract they keep.

    start(target, state, hidden)   once per request, after the target prefilled the prompt
    propose(state, k, ...)         up to k draft tokens (+ their probabilities q)
    propose_tree(state, tree, ...) a token tree instead (drafters with can_branch; tree.py)
    observe(state, n, hidden)      after each round's verify and commit: n drafts were accepted
    forget()                       drop anything kept across requests (a benchmark run starts clean)
    check_k(k), check_tree(tree)   refuse what it cannot draft, before the request starts
    reduce_vocabulary(ids)         score only these ids (drafters that score the whole vocabulary; vocab.py)
    build(target, draft, options)  (a class method) the drafter a recipe names: methods.py, zoo.py

The lifecycle, as decode.generate drives it (these are promises every
drafter may rely on, and every loop change must keep):

1. ``start`` opens a request. ``hidden[t]`` holds the taps of ``state.ids[:-1]``
   ([prompt_len - 1, H]); on a one-token prompt that is ZERO rows, and the
   first ``propose`` must cope (return no drafts, or draft from nothing).
   Everything a drafter keeps per request is reset here.
2. Each round: ``propose`` (skipped when the budget leaves room for no draft,
   i.e. on the budget's last token), then one target verify and commit, then
   ``observe`` — ALWAYS, even when ``propose`` was skipped (then n = 0). Its
   ``hidden[t]`` has n + 1 rows, for ``[last, d1..dn]``: exactly the tokens the
   round moved into the target cache (after a tree: `last` and its accepted
   path). A drafter that catches up in ``propose`` must therefore queue what
   ``observe`` hands it, not replace it.
3. After ``observe``, ``state.ids`` ends with the target's own token, which is
   not yet in the target cache (the cache invariant, target.py).
4. ``forget`` drops what was learned from EARLIER requests (only suffix
   decoding keeps anything across them); ``start`` never does that.

What a drafter may and may not do: read ``state.ids`` and (the Gemma 4
assistant) ``state.cache``, never change either; return fewer than k tokens
(n-gram without a match, DSpark's gate), never more (the loop refuses); give
``q`` with one row per token, or None when its drafts are deterministic
(greedy: the rejection sampler treats them as one-hot). Its time — propose,
observe, and the commit between them — is the round's draft time.

The drafters in this library read the target in different ways, and the
interface leaves room for all of them:

* n-gram and suffix decoding look only at ``state.ids``;
* a draft model keeps its own KV cache and crops it in `observe`;
* EAGLE-3, MTP, DFlash and DSpark read the target's hidden states. A drafter
  lists the taps it wants in ``taps``; the loop asks the target for them;
* the Gemma 4 assistant reads the target's KV cache itself: ``state.cache``;
* block drafters (DFlash, DSpark) draft all k tokens in one pass and set
  ``max_k`` to what their block allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import Sampling
from ..tree import TreeSpec, depths


@dataclass
class Proposal:
    """Draft tokens and, when the drafter sampled them, their distributions; a chain, or a tree."""

    tokens: list[int]  # [k'] with k' <= k
    q: torch.Tensor | None = None  # [k', V] draft probabilities, None = one-hot (greedy drafts)
    parents: list[int] | None = None  # a tree (tree.py): node i continues node parents[i], -1 = `last`

    def __post_init__(self):
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError(f"q has {self.q.shape[0]} rows for {len(self.tokens)} draft tokens.")
        if self.parents is not None:
            if len(self.parents) != len(self.tokens):
                raise ValueError(f"{len(self.parents)} parents for {len(self.tokens)} draft tokens.")
            depths(self.parents)  # refuses a node that comes before its parent

    @property
    def depth(self) -> int:
        """The longest root-to-node path: the most drafts a round can accept."""
        return max(depths(self.parents), default=0) if self.parents is not None else len(self.tokens)


class Drafter:
    """Base class: a drafter that proposes nothing (subclasses override)."""

    name = "none"
    taps: tuple[int, ...] = ()  # target hidden states this drafter reads (see target.py)
    max_k: int | None = None  # the most tokens one proposal can hold; None = no limit

    can_branch = False  # grows token trees (propose_tree)
    can_reduce_vocabulary = False  # can score a cut vocabulary (reduce_vocabulary)

    @classmethod
    def build(cls, target, draft: str | None, options) -> Drafter:
        """The drafter for a recipe: `target`, the user's `draft` (None: the one shipped for the target) and the
        method's `options` (methods.Options). Each method's file says how."""
        raise NotImplementedError(f"{cls.__name__} has no recipe: build it directly.")

    def check_k(self, k: int) -> None:
        """Refuse a k this drafter cannot draft, saying why."""
        if self.max_k is not None and k > self.max_k:
            raise ValueError(f"{self.name} drafts at most {self.max_k} tokens per round; got k={k}.")

    def check_tree(self, tree: TreeSpec) -> None:
        """Refuse a tree this drafter cannot grow, saying why."""
        if not self.can_branch:
            from . import branching

            raise ValueError(f"{self.name} drafts one chain and cannot grow a tree: drop the tree (use k), or "
                             f"choose a drafter that branches ({', '.join(branching())}).")
        if self.max_k is not None and tree.depth > self.max_k:
            raise ValueError(f"A tree of depth {tree.depth} is beyond {self.name}'s block: its slots give at most "
                             f"{self.max_k} positions; ask for depth <= {self.max_k}.")

    def start(self, target, state, hidden: dict[int, torch.Tensor]) -> None:
        """A new prompt: `hidden` holds the taps for state.ids[:-1] ([prompt_len-1, H] each)."""

    def propose(self, state, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        raise NotImplementedError

    def propose_tree(self, state, tree: TreeSpec, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        """A token tree of at most tree.nodes nodes and tree.depth levels (drafters with can_branch)."""
        raise NotImplementedError

    def observe(self, state, accepted: int, hidden: dict[int, torch.Tensor]) -> None:
        """The round is committed: `accepted` drafts kept, `hidden` rows for [last, d1..dn]."""

    def reduce_vocabulary(self, ids) -> None:
        """Score only the target ids `ids` from now on (vocab.py), for the drafters with can_reduce_vocabulary."""
        from . import reducible

        raise ValueError(f"{self.name} has no draft vocabulary to reduce (only {', '.join(reducible())} do; "
                         "EAGLE-3's checkpoint carries its own): drop --draft-vocab for it.")

    def forget(self) -> None:
        """Drop what was learned from earlier requests (only suffix decoding keeps anything across them)."""


# --- the pieces of attention the drafters' own networks share (EAGLE-3's layer, DFlash's block) ---


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (HF's rotate-half convention). x [heads, n, d], cos/sin [n, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention of q [heads, n, d] over k, v [kv_heads, m, d] -> [n, heads * d].

    mask [n, m] (True = may attend; None = all). Each K/V head serves
    heads // kv_heads query heads, so it is repeated for them.
    """
    groups = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)  # [heads, m, d]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [heads, n, d]
    return out.transpose(0, 1).reshape(q.shape[1], -1)


def visibility(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor | None:
    """Which keys each query may see ([nq, nk] bool, from their positions [nq] and [nk]), or None for all.

    ``causal``: a query sees no later position; ``window``: only the last
    `window` positions (a ``sliding_attention`` layer).
    """
    if not causal and window is None:
        return None
    distance = q_pos[:, None] - k_pos[None, :]  # [nq, nk]
    seen = distance >= 0 if causal else torch.ones_like(distance, dtype=torch.bool)
    return seen & (distance < window) if window is not None else seen


class Rope:
    """cos, sin [n, d] at integer positions [n]: transformers' rotary embedding for an HF `config`.

    transformers' class brings every scaling (YaRN's attention factor on
    cos/sin included). It is held outside nn.Module, so the drafter's
    ``.to(bf16)`` never rounds its angles and no checkpoint carries them.
    """

    def __init__(self, config):
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        self.rotary = (Qwen3RotaryEmbedding if config.model_type == "qwen3" else LlamaRotaryEmbedding)(config)

    def __call__(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin [n, d] in the dtype and on the device of `like`."""
        cos, sin = self.rotary(like, positions[None])  # [1, n, d] each
        return cos[0], sin[0]
