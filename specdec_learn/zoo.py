"""Named recipes: a method name (as vLLM spells it) -> a ready drafter.

`specdec generate`, `specdec bench` and the book go through `make_drafter`
(the vLLM backend finds the same folders through `checkpoints.find`). Which class drafts for a method is declared in
methods.py; how a recipe becomes a drafter is that class's `build` (the
method's own file), which finds its checkpoint through `checkpoints.find`.
"""

from __future__ import annotations

from . import methods
from .drafters import Drafter, branching, drafter_class, reducible
from .methods import Options
from .target import Target

METHODS = methods.names()  # every method, "ar" (plain decoding) first
BRANCHING = branching()  # the methods whose drafter grows token trees
REDUCIBLE = reducible()  # the methods whose drafter can score a cut vocabulary (--draft-vocab)


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
    vocabulary (`reducible()`; EAGLE-3's checkpoint carries its own reduced
    vocabulary, d2t).
    """
    cls = drafter_class(methods.get(method).name)
    drafter = None if cls is None else cls.build(target, draft, Options(tuple(ngram), markov, gate))
    if draft_vocab is not None and drafter is not None:
        if not drafter.can_reduce_vocabulary:
            drafter.reduce_vocabulary(())  # refuses, naming the drafters that can
        if not 1 <= draft_vocab <= target.vocab_size:
            raise ValueError(f"--draft-vocab must lie in 1..{target.vocab_size} (the target's vocabulary); "
                             f"got {draft_vocab}.")
        from .train.corpus import corpus_vocabulary

        eos = tuple(sorted(target.eos_ids))  # always in: the drafter can still propose the end of the answer
        drafter.reduce_vocabulary(corpus_vocabulary(target.name, draft_vocab, target.vocab_size, eos))
    return drafter
