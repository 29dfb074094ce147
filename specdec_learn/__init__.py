"""specdec_learn: speculative decoding, one readable loop and many drafters.

    import specdec_learn as sd
    target = sd.load("smollm2-135m")                       # offline, from a PyPI wheel
    ar  = sd.generate(target, "Write a haiku about tea.")  # plain decoding
    out = sd.generate(target, "Write a haiku about tea.", sd.NgramDrafter(), k=3)
    print(out.text, out.stats.mean_acceptance_length)
    tree = sd.generate(target, "Write a haiku about tea.", sd.NgramDrafter(), tree=sd.TreeSpec(nodes=8, depth=4))
"""

from .decode import Generation, generate
from .drafters import DraftModelDrafter, Drafter, NgramDrafter, Proposal, SuffixDrafter
from .sampling import GREEDY, Sampling
from .stats import Stats
from .target import DecodeState, Target, load
from .tree import TreeSpec

__all__ = [
    "load", "generate", "Generation", "Target", "DecodeState", "Sampling", "GREEDY",
    "Stats", "Drafter", "Proposal", "NgramDrafter", "SuffixDrafter", "DraftModelDrafter", "TreeSpec",
]
__version__ = "0.1.0"
