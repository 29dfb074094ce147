"""Named recipes: a method name (as vLLM spells it) -> a ready drafter.

`specdec bench --methods ar,ngram,draft_model`, the book and the vLLM backend
all go through this table and `checkpoints.find`, so a new method becomes
available everywhere by adding one builder to `BUILDERS` (and, if it ships
weights, one line to `checkpoints.SHIPPED`).

A builder takes the target, the user's ``draft`` (None = the shipped
drafter: see checkpoints.py) and the per-method options, and returns a drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checkpoints import find
from .drafters import DraftModelDrafter, Drafter, NgramDrafter, SuffixDrafter
from .target import Target


@dataclass
class Options:
    """Knobs that only some methods have."""

    ngram: tuple[int, int] = (1, 4)  # ngram: (min_n, max_n) match lengths
    markov: bool = True  # dspark: the Markov head on/off
    gate: float | None = None  # dspark: the confidence gate's survival threshold (None = submit every draft)


def _draft_model(target: Target, draft, options: Options) -> Drafter:
    if draft == "target":  # the target drafts for itself: every draft accepted, an upper bound on acceptance
        return DraftModelDrafter(target.model, target)
    from .drafters.draft_model import load_draft_model

    return load_draft_model(find("draft_model", target.name, draft), target)


def _eagle3(target: Target, draft, options: Options) -> Drafter:
    from .drafters.eagle3 import Eagle3Drafter, load_eagle3

    return Eagle3Drafter(load_eagle3(find("eagle3", target.name, draft), target), target)


def _mtp(target: Target, draft, options: Options) -> Drafter:
    from .drafters.mtp import MTPDrafter, load_mtp

    return MTPDrafter(load_mtp(find("mtp", target.name, draft), target), target)


def _gemma4_mtp(target: Target, draft, options: Options) -> Drafter:
    from .drafters.gemma4_mtp import Gemma4AssistantDrafter, load_gemma4_assistant

    return Gemma4AssistantDrafter(load_gemma4_assistant(find("gemma4_mtp", target.name, draft), target), target)


def _dflash(target: Target, draft, options: Options) -> Drafter:
    from .drafters.dflash import DFlashDrafter, load_dflash

    return DFlashDrafter(load_dflash(find("dflash", target.name, draft), dtype=target.dtype))


def _dspark(target: Target, draft, options: Options) -> Drafter:
    from .drafters.dspark import DSparkDrafter, load_dspark

    model = load_dspark(find("dspark", target.name, draft), dtype=target.dtype)
    return DSparkDrafter(model, markov=options.markov and model.markov_head is not None, gate=options.gate)


BUILDERS = {
    "ar": None,  # plain decoding: no drafter (k = 0)
    "ngram": lambda target, draft, options: NgramDrafter(*options.ngram),
    "suffix": lambda target, draft, options: SuffixDrafter(),  # one per call: its global tree learns per run
    "draft_model": _draft_model,
    "eagle3": _eagle3,
    "mtp": _mtp,
    "gemma4_mtp": _gemma4_mtp,
    "dflash": _dflash,
    "dspark": _dspark,
}
METHODS = tuple(BUILDERS)


def make_drafter(
    method: str, target: Target, draft: str | None = None, ngram=(1, 4), markov: bool = True, gate: float | None = None,
    draft_vocab: int | None = None,
) -> Drafter | None:
    """The drafter for `method` (None for "ar", plain decoding).

    draft: the drafter's folder or hub id; None for the one this package ships
    for the target; for "draft_model" also an embedded model name, or "target"
    to let the target draft for itself (an upper bound on acceptance that
    costs a full extra model).
    markov, gate: for "dspark", the Markov head on/off and the confidence
    gate's survival threshold (None = submit every draft).
    draft_vocab: score only this many tokens, the most frequent answer tokens
    of the committed corpus (vocab.py), for the drafters that score the whole
    vocabulary: draft_model, mtp, gemma4_mtp, dflash, dspark. (EAGLE-3's checkpoint
    carries its own reduced vocabulary, d2t.)
    """
    if method not in BUILDERS:
        raise ValueError(f"Unknown method {method!r}: choose from {', '.join(METHODS)}.")
    builder = BUILDERS[method]
    drafter = None if builder is None else builder(target, draft, Options(tuple(ngram), markov, gate))
    if draft_vocab is not None and drafter is not None:
        if not hasattr(drafter, "reduce_vocabulary"):
            raise ValueError(f"{method} has no draft vocabulary to reduce (only {', '.join(REDUCIBLE)} do; "
                             "EAGLE-3's checkpoint carries its own): drop --draft-vocab for it.")
        if not 1 <= draft_vocab <= target.vocab_size:
            raise ValueError(f"--draft-vocab must lie in 1..{target.vocab_size} (the target's vocabulary); "
                             f"got {draft_vocab}.")
        from .vocab import corpus_vocabulary

        eos = tuple(sorted(target.eos_ids))  # always in: the drafter can still propose the end of the answer
        drafter.reduce_vocabulary(corpus_vocabulary(target.name, draft_vocab, target.vocab_size, eos))
    return drafter


REDUCIBLE = ("draft_model", "mtp", "gemma4_mtp", "dflash", "dspark")  # drafters with reduce_vocabulary
