"""Named recipes: a method name (as vLLM spells it) -> a ready drafter.

`specdec bench --methods ar,ngram,draft_model` and the book go through
`make_drafter`, so a new method becomes available everywhere by adding one
entry to `METHODS`.
"""

from __future__ import annotations

from pathlib import Path

from .drafters import DraftModelDrafter, Drafter, NgramDrafter, SuffixDrafter
from .target import Target

METHODS = ("ar", "ngram", "suffix", "draft_model", "eagle3", "mtp", "gemma4_mtp", "dflash", "dspark")


def make_drafter(
    method: str, target: Target, draft: str | None = None, ngram=(1, 4), markov: bool = True, gate: float | None = None
) -> Drafter | None:
    """The drafter for `method` (None for "ar", plain decoding).

    draft: for "draft_model", a model name/path sharing the target's tokenizer,
    None for the draft model this package ships for the target (distilled by
    `train/draft_model.py`), or "target" to let the target draft for itself
    (every draft accepted: an upper bound on acceptance that costs a full extra model).
    markov, gate: for "dspark", the Markov head on/off and the confidence
    gate's survival threshold (None = submit every draft).
    """
    if method == "ar":
        return None
    if method == "ngram":
        return NgramDrafter(*ngram)
    if method == "suffix":  # one drafter per call: its global tree learns from every request it drafts for
        return SuffixDrafter()
    if method == "draft_model":
        if draft == "target":
            return DraftModelDrafter(target.model, target)
        from .drafters.draft_model import shipped_draft_model
        from .models import complete_checkpoint, load_hf

        if draft is None:
            path = shipped_draft_model(target.name)
        else:  # a folder shipped without its vocabulary table is completed from the target's
            path = complete_checkpoint(draft, target.name) if Path(draft).is_dir() else draft
        model, _ = load_hf(str(path), dtype=target.dtype, device=str(target.device))
        return DraftModelDrafter(model, target)
    if method == "eagle3":  # the shipped drafter for the target, or draft=<speculators folder>
        from .drafters.eagle3 import Eagle3Drafter, load_eagle3, shipped_checkpoint

        return Eagle3Drafter(load_eagle3(_local(draft) or shipped_checkpoint(target), target), target)
    if method == "mtp":  # the target checkpoint's own MTP layers, the shipped graft, or draft=<directory>
        from .drafters.mtp import MTPDrafter, load_mtp, mtp_checkpoint

        return MTPDrafter(load_mtp(_local(draft) or mtp_checkpoint(target), target), target)
    if method == "gemma4_mtp":  # draft=<gemma4_assistant directory>, or the shipped assistant
        from .drafters.gemma4_mtp import Gemma4AssistantDrafter, assistant_checkpoint, load_gemma4_assistant

        return Gemma4AssistantDrafter(load_gemma4_assistant(_local(draft) or assistant_checkpoint(target), target), target)
    if method == "dflash":  # the shipped drafter for the target, or draft=<z-lab folder>
        from .drafters.dflash import DFlashDrafter, load_dflash, shipped_checkpoint

        return DFlashDrafter(load_dflash(_local(draft) or shipped_checkpoint(target, "dflash"), dtype=target.dtype))
    if method == "dspark":  # the shipped drafter, or draft=<DeepSpec or speculators folder>
        from .drafters.dflash import shipped_checkpoint
        from .drafters.dspark import DSparkDrafter, load_dspark

        model = load_dspark(_local(draft) or shipped_checkpoint(target, "dspark"), dtype=target.dtype)
        return DSparkDrafter(model, markov=markov and model.markov_head is not None, gate=gate)
    raise ValueError(f"Unknown method {method!r}: choose from {', '.join(METHODS)}.")


def _local(draft: str | None):
    """A drafter checkpoint folder, fetched from the hub when `draft` is a hub id (None stays None)."""
    from .models import drafter_dir

    return None if draft is None else drafter_dir(draft)
