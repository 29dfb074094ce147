"""Drafters: one file per method. See base.py for the interface."""

from .base import Drafter, Proposal
from .draft_model import DraftModelDrafter
from .ngram import NgramDrafter

__all__ = ["Drafter", "Proposal", "NgramDrafter", "DraftModelDrafter"]
