"""The one loop: draft, verify, accept, commit. Every method runs through it.

    state   = target.prefill(prompt)
    repeat until max_new_tokens or EOS:
        drafts, q = drafter.propose(state, k)          # k guesses (+ their probabilities)
        logits    = target.verify(state, drafts)       # ONE forward over [last, d1..dk]
        n, nxt    = accept(drafts, q, logits)          # keep n drafts, then one target token
        target.commit(state, drafts[:n] + [nxt])       # crop the cache to what was kept
        drafter.observe(state, n, hidden[:n+1])

With no drafter (k = 0) each round verifies nothing and emits one token: that
is plain autoregressive decoding, through the same prefill, cache, sampling
and timing code, so a comparison between methods measures only the drafting.

Stopping is exact: an EOS inside an accepted block ends generation right
there, and a round never emits more than the budget left, so a speculative run
stops where the autoregressive run would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .drafters.base import Drafter, Proposal
from .sampling import GREEDY, Sampling, is_integer
from .stats import Round, Stats
from .target import Target, now
from .verify import accept


@dataclass
class RoundTrace:
    """What happened in one round, for the book's token-level viewer."""

    drafts: list[int]
    accepted: int
    next_token: int  # the target's own token: recovered (accepted < len(drafts)) or bonus


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
) -> Generation:
    """Generate from `prompt` with `drafter` proposing `k` tokens a round (no drafter: plain decoding).

    `prompt` is text (sent through the chat template unless chat=False) or token ids.
    `seed` fixes the random draws of sampled decoding; greedy decoding uses none.
    """
    prompt_ids = check_request(target, prompt, drafter, k, max_new_tokens, sampling, seed, chat)
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
        budget = min(k, max_new_tokens - len(new) - 1)  # never draft past the budget
        t0 = now(target)
        proposal = drafter.propose(state, budget, sampling, generator) if budget > 0 else Proposal([])
        if len(proposal.tokens) > budget:
            raise RuntimeError(f"{drafter.name} proposed {len(proposal.tokens)} tokens when asked for {budget}.")
        t1 = now(target)
        out = target.verify(state, proposal.tokens, taps)
        n, nxt = accept(proposal.tokens, proposal.q, out.logits, sampling, generator)
        t2 = now(target)
        block = proposal.tokens[:n] + [nxt]
        target.commit(state, block)
        if drafter is not None:
            drafter.observe(state, n, {tap: h[: n + 1] for tap, h in out.hidden.items()})
        t3 = now(target)

        stats.record(Round(len(proposal.tokens), n, draft_time=(t1 - t0) + (t3 - t2), verify_time=t2 - t1))
        if keep_trace:
            trace.append(RoundTrace(proposal.tokens, n, nxt))
        eos_at = next((i for i, t in enumerate(block) if t in target.eos_ids), None)
        new.extend(block if eos_at is None else block[: eos_at + 1])
        if eos_at is not None:
            break

    stats.total_time = now(target) - t_start
    stats.num_output_tokens = len(new)
    return Generation(prompt_ids, new, target.decode(new), stats, trace)


def check_request(target: Target, prompt, drafter, k, max_new_tokens, sampling, seed, chat) -> list[int]:
    """The prompt's token ids, after refusing (with a message that says what to do) any argument the loop cannot run."""
    for name, value, low in (("k", k, 0), ("max_new_tokens", max_new_tokens, 1), ("seed", seed, 0)):
        if not is_integer(value) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}.")
    if not isinstance(sampling, Sampling):
        raise ValueError(f"sampling must be a Sampling(temperature, top_k, top_p), got {sampling!r}.")
    if drafter is not None:
        drafter.check_k(k)
        if not target.can_roll_back:
            raise ValueError(
                f"{target.name} has linear-attention layers, whose recurrent state cannot drop rejected drafts: "
                "the readable loop runs it without a drafter only. Speculate on it with vLLM (backend='vllm')."
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
