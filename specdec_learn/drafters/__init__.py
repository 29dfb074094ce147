"""Drafters: one file per method. See base.py for the interface."""

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
    "DFlashDrafter", "DSparkDrafter", "SuffixDrafter",
]
