"""Drafters: one file per method. See base.py for the interface, methods.py for which class is which method."""

from importlib import import_module

from ..methods import get, names
from .base import Drafter, Proposal
from .dflash import DFlashDrafter
from .draft_model import DraftModelDrafter
from .dspark import DSparkDrafter
from .eagle3 import Eagle3Drafter
from .gemma4_mtp import Gemma4AssistantDrafter
from .mtp import MTPDrafter
from .ngram import NgramDrafter
from .suffix import SuffixDrafter

__all__ = [
    "Drafter", "Proposal", "NgramDrafter", "DraftModelDrafter", "Eagle3Drafter", "MTPDrafter", "Gemma4AssistantDrafter",
    "DFlashDrafter", "DSparkDrafter", "SuffixDrafter", "drafter_class", "branching", "reducible",
]


def drafter_class(method: str) -> type[Drafter] | None:
    """The drafter class of `method` (methods.py names it), None for plain decoding."""
    path = get(method).drafter
    if path is None:
        return None
    if ":" in path:  # "package.module:Class", a drafter kept outside this package
        module, cls = path.split(":")
    else:  # "module.Class" under drafters/
        module, _, cls = path.rpartition(".")
        module = f"{__name__}.{module}"
    return getattr(import_module(module), cls)


def branching() -> tuple[str, ...]:
    """The methods whose drafter grows token trees (its class's `can_branch`)."""
    return names(lambda m: m.drafter is not None and drafter_class(m.name).can_branch)


def reducible() -> tuple[str, ...]:
    """The methods whose drafter can score a cut vocabulary (its class's `can_reduce_vocabulary`)."""
    return names(lambda m: m.drafter is not None and drafter_class(m.name).can_reduce_vocabulary)
