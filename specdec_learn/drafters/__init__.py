"""Drafters: one file per method. See base.py for the interface, methods.py for which class is which method."""

from importlib import import_module

from ..methods import METHODS, get, names
from .base import Drafter, Proposal

# each method's drafter class by its name ("Eagle3Drafter": "eagle3"), read off methods.py
_CLASSES = {m.drafter.rpartition(".")[2]: m.name for m in METHODS.values() if m.drafter and ":" not in m.drafter}
__all__ = ["Drafter", "Proposal", *_CLASSES, "drafter_class", "branching", "reducible"]


def __getattr__(name: str):
    """`drafters.Eagle3Drafter` and the like: a drafter's file loads on first use (PEP 562), so that importing
    the loop does not import every network (DFlash's alone brings transformers' Qwen3 classes)."""
    if name not in _CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return drafter_class(_CLASSES[name])


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
