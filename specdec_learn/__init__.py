"""specdec_learn: speculative decoding, one readable loop and many drafters.

    import specdec_learn as sd
    target = sd.load("smollm2-135m")                       # offline, from a PyPI wheel
    ar  = sd.generate(target, "Write a haiku about tea.")  # plain decoding
    out = sd.generate(target, "Write a haiku about tea.", sd.NgramDrafter(), k=3)
    print(out.text, out.stats.mean_acceptance_length)
    tree = sd.generate(target, "Write a haiku about tea.", sd.NgramDrafter(), tree=sd.TreeSpec(nodes=8, depth=4))
"""

from importlib import import_module
from importlib.util import find_spec

# name -> the module that defines it. Each loads on first use (PEP 562), so that `import specdec_learn`
# and `specdec --help` do not pay for torch and transformers before anything needs them.
_EXPORTS = {
    "load": "target", "Target": "target", "DecodeState": "target",
    "generate": "decode", "Generation": "decode",
    "Sampling": "sampling", "GREEDY": "sampling",
    "Stats": "stats",
    "TreeSpec": "tree",
    "Drafter": "drafters", "Proposal": "drafters",
    "NgramDrafter": "drafters", "SuffixDrafter": "drafters", "DraftModelDrafter": "drafters",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    # Nothing is cached here: `sd.load` is always `target.load` as it stands now (a test may patch it); a
    # submodule, once imported, is an attribute of the package and no longer comes here.
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    if not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
        return import_module(f".{name}", __name__)  # a module: sd.sampling.probabilities(...)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
