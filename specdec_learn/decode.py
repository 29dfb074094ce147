"""The one loop: draft, verify, accept, commit. Every method runs through it.

    state   = target.prefill(prompt)
    repeat until max_new_tokens or EOS:
        drafts, q = drafter.propose(state, k)          # k guesses (+ their probabilities)
        logits    = target.verify(state, drafts)       # ONE forward over [last, d1..dk]
        path, nxt = accept(drafts, q, logits)          # keep n = len(path) drafts, then one target token
        target.commit(state, drafts[:n] + [nxt])       # crop the cache to what was kept
        drafter.observe(state, n, hidden[:n+1])

With `tree=` the drafter proposes a token tree instead of a chain (tree.py):
verify scores every node in the same one forward (a tree attention mask),
accept walks the tree and returns the accepted root-to-node path, and commit
keeps that path's keys and values. A chain is the tree whose nodes each have
one child, and runs through the same verify, accept and commit.

With no drafter (k = 0) each round verifies nothing and emits one token: that
is plain autoregressive decoding, through the same prefill, cache, sampling
and timing code, so a comparison between methods measures only the drafting.

Stopping is exact: an EOS inside an accepted block ends generation right
there, and a round never emits more than the budget left, so a speculative run
stops where the autoregressive run would.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .drafters.base import Drafter, Proposal
from .sampling import GREEDY, Sampling, is_integer
from .stats import Round, Stats
from .target import Target, now
from .tree import TreeSpec
from .verify import accept


@dataclass
class RoundTrace:
    """What happened in one round, for the book's token-level viewer."""

    drafts: list[int]  # a tree's nodes when `parents` is set
    accepted: int
    next_token: int  # the target's own token: recovered (accepted < len(drafts)) or bonus
    parents: list[int] | None = None  # a tree round: node i continues node parents[i] (-1: `last`)
    path: list[int] | None = None  # a tree round: the accepted nodes, root first


@dataclass
class Generation:
    """The result of one generate() call."""

    prompt_ids: list[int]
    tokens: list[int]  # the generated ids (EOS included when it was produced)
    text: str
    stats: Stats
    trace: list[RoundTrace] = field(default_factory=list)


def generate(
    target: Target,
    prompt: str | list[int],
    drafter: Drafter | None = None,
    k: int = 0,
    max_new_tokens: int = 128,
    sampling: Sampling = GREEDY,
    seed: int = 0,
    chat: bool = True,
    keep_trace: bool = False,
    tree: TreeSpec | None = None,
) -> Generation:
    """Generate from `prompt` with `drafter` proposing `k` tokens a round (no drafter: plain decoding).

    `prompt` is text (sent through the chat template unless chat=False) or token ids.
    `seed` fixes the random draws of sampled decoding; greedy decoding uses none.
    `tree` (instead of k): the drafter grows a token tree of that size every round.
    """
    prompt_ids = check_request(target, prompt, drafter, k, max_new_tokens, sampling, seed, chat, tree)
    k = k if drafter is not None else 0
    generator = torch.Generator().manual_seed(seed)
    taps = drafter.taps if drafter is not None else ()
    stats, trace = Stats(), []

    t_start = now(target)
    state, out = target.prefill(prompt_ids, taps)
    if drafter is not None:
        drafter.start(target, state, out.hidden)
    stats.prefill_time = now(target) - t_start

    new: list[int] = []
    while len(new) < max_new_tokens:
        t0 = now(target)
        proposal = propose(drafter, state, k, tree, max_new_tokens - len(new) - 1, sampling, generator)
        t1 = now(target)
        out = target.verify(state, proposal.tokens, taps, proposal.parents)
        path, nxt = accept(proposal.tokens, proposal.q, out.logits, sampling, generator, proposal.parents)
        t2 = now(target)
        block = [proposal.tokens[i] for i in path] + [nxt]
        tree_path = path if proposal.parents is not None else None  # a tree round's accepted nodes
        target.commit(state, block, tree_path)
        if drafter is not None:  # the rows of [last, d1..dn]: on a tree, of `last` and the accepted path
            kept = slice(0, len(path) + 1) if tree_path is None else [0] + [i + 1 for i in path]
            drafter.observe(state, len(path), {tap: h[kept] for tap, h in out.hidden.items()})
        t3 = now(target)

        depth = proposal.depth if tree_path is not None else None
        stats.record(Round(len(proposal.tokens), len(path), (t1 - t0) + (t3 - t2), t2 - t1, depth))
        if keep_trace:
            trace.append(RoundTrace(proposal.tokens, len(path), nxt, proposal.parents, tree_path))
        eos_at = next((i for i, t in enumerate(block) if t in target.eos_ids), None)
        new.extend(block if eos_at is None else block[: eos_at + 1])
        if eos_at is not None:
            break

    stats.total_time = now(target) - t_start
    stats.num_output_tokens = len(new)
    return Generation(prompt_ids, new, target.decode(new), stats, trace)


def propose(drafter, state, k, tree, room, sampling, generator) -> Proposal:
    """This round's drafts: a chain of up to k, or a tree; never deeper than the `room` the budget leaves."""
    limit = min(k if tree is None else tree.depth, room)
    if drafter is None or limit <= 0:
        return Proposal([])
    if tree is None:
        proposal = drafter.propose(state, limit, sampling, generator)
    else:
        proposal = drafter.propose_tree(state, replace(tree, depth=limit), sampling, generator)
    if proposal.depth > limit or (tree is not None and len(proposal.tokens) > tree.nodes):
        raise RuntimeError(f"{drafter.name} proposed {len(proposal.tokens)} tokens, {proposal.depth} deep, "
                           f"when asked for at most {limit} deep.")
    return proposal


def check_request(target: Target, prompt, drafter, k, max_new_tokens, sampling, seed, chat, tree=None) -> list[int]:
    """The prompt's token ids, after refusing (with a message that says what to do) any argument the loop cannot run."""
    for name, value, low in (("k", k, 0), ("max_new_tokens", max_new_tokens, 1), ("seed", seed, 0)):
        if not is_integer(value) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}.")
    if not isinstance(sampling, Sampling):
        raise ValueError(f"sampling must be a Sampling(temperature, top_k, top_p), got {sampling!r}.")
    if tree is not None:
        if not isinstance(tree, TreeSpec):
            raise ValueError(f"tree must be a TreeSpec(nodes, depth, branch), got {tree!r}.")
        if drafter is None:
            raise ValueError("A tree needs a drafter to grow it: pass one of the drafters that branch.")
        if k:
            raise ValueError(f"Give k (a chain of k drafts) or tree= (a token tree), not both; got k={k} and {tree}.")
        drafter.check_tree(tree)
        if not target.can_verify_tree:
            raise ValueError(f"{target.name} has sliding-window or linear-attention layers, which cannot verify "
                             "a tree in one pass here: run it with a chain (k) instead.")
    if drafter is not None:
        drafter.check_k(k)
        if not target.can_roll_back:
            raise ValueError(
                f"{target.name} has recurrent layers (Mamba, short convolutions, ...) whose state cannot drop "
                "rejected drafts here: the readable loop runs it without a drafter only. Speculate on it with "
                "vLLM (backend='vllm')."
            )
    if isinstance(prompt, str):
        ids = target.encode(prompt, chat=chat)
    elif isinstance(prompt, (list, tuple)) and all(is_integer(t) for t in prompt):
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < target.vocab_size]
        if bad:
            raise ValueError(f"Token id {bad[0]} is outside the vocabulary 0..{target.vocab_size - 1} of {target.name}.")
    else:
        raise ValueError("The prompt must be text or a list of integer token ids.")
    if not ids:
        raise ValueError("The prompt is empty: give the model some text to continue.")
    context = target.max_context
    if context is not None and len(ids) + max_new_tokens > context:
        raise ValueError(
            f"The prompt has {len(ids)} tokens and {max_new_tokens} new ones are asked for, but {target.name} reads "
            f"at most {context}: shorten the prompt or ask for at most {max(context - len(ids), 0)} new tokens."
        )
    return ids
