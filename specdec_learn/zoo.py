"""Named recipes: a method name (as vLLM spells it) -> a ready drafter.

`specdec bench --methods ar,ngram,draft_model` and the book go through
`make_drafter`, so a new method becomes available everywhere by adding one
entry to `METHODS`.
"""

from __future__ import annotations

from .drafters import DraftModelDrafter, Drafter, NgramDrafter
from .target import Target

METHODS = ("ar", "ngram", "draft_model")


def make_drafter(method: str, target: Target, draft: str | None = None, ngram=(1, 4)) -> Drafter | None:
    """The drafter for `method` (None for "ar", plain decoding).

    draft: for "draft_model", a model name/path sharing the target's tokenizer,
    or "target" to let the target draft for itself (every draft accepted: an
    upper bound on acceptance that costs a full extra model).
    """
    if method == "ar":
        return None
    if method == "ngram":
        return NgramDrafter(*ngram)
    if method == "draft_model":
        if draft is None:
            raise ValueError(
                "draft_model needs a draft model: pass draft=<name or path> (CLI: --draft). "
                "It must share the target's tokenizer; draft='target' uses the target itself."
            )
        if draft == "target":
            return DraftModelDrafter(target.model, target)
        from .models import load_hf

        model, _ = load_hf(draft, dtype=target.dtype, device=str(target.device))
        return DraftModelDrafter(model, target)
    raise ValueError(f"Unknown method {method!r}: choose from {', '.join(METHODS)}.")
