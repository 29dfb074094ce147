"""From logits to the probabilities a token is drawn from.

A request's sampling settings turn the target's logits into the distribution
``p`` that both plain decoding and speculative verification sample from. We
follow vLLM's order: divide by the temperature, keep the top-k logits, keep the
smallest set of tokens whose probability reaches top-p, then softmax.
Temperature 0 means greedy decoding: take the argmax, no randomness at all.

Speculative decoding is lossless only when the verifier samples from exactly
the distribution plain decoding would: so this one function serves both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MIN_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: below it, dividing the logits overflows; 0 means greedy


def is_number(x) -> bool:
    """A real number (int or float, not a bool or a string), NaN excluded."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def is_integer(x) -> bool:
    """A whole number given as an int (not a bool, not 2.0 or 2.5)."""
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of one request (the names vLLM's SamplingParams uses)."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = keep every token
    top_p: float = 1.0  # 1 = keep every token

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if not is_number(t) or not (t == 0 or MIN_TEMPERATURE <= t < math.inf):
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}, got {t!r}.")
        if not is_integer(k) or k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0 turns it off), got {k!r}.")
        if not is_number(p) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {p!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = Sampling()


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (fp32) under `sampling`.

    Greedy requests get a one-hot distribution on the argmax, so that code
    that expects probabilities still works for them.
    """
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1)  # ascending
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum <= 1.0 - sampling.top_p  # the low tail whose mass is <= 1 - top_p
        drop_sorted[..., -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def draft_token(logits: torch.Tensor, sampling: Sampling, generator, qs: list) -> int:
    """A drafter's next token from its logits [V]: the argmax when greedy, else a draw from q.

    A sampled draft appends its q [V] to `qs`: rejection sampling needs the
    probability the drafter gave each token (a greedy draft is one-hot).
    """
    if sampling.greedy:
        return int(logits.argmax())
    qs.append(probabilities(logits, sampling))  # [V]
    return sample(qs[-1], generator)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token id from probs [V] (moved to the generator's device, so a CPU
    generator gives the same draws whether the model runs on a CPU or a GPU)."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))
