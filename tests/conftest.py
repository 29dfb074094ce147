"""Shared fixtures.

`target` is the real embedded model (SmolLM2-135M-Instruct) in fp32, loaded
once per session: exactness is tested in fp32, where a bigger batch of rows
cannot flip an argmax. Tiny random models stand in where a test needs a model
that is cheap or deliberately bad.
"""

import os

import pytest
import torch

import specdec_learn as sd
from specdec_learn.workloads import load_workload


@pytest.fixture(scope="session")
def target():
    torch.manual_seed(0)
    return sd.load("smollm2-135m", dtype="fp32", device="cpu")


# Parity tests decode MAX_NEW tokens of each real prompt and compare with AR token for token.
MAX_NEW = 32


@pytest.fixture(scope="session")
def real_prompts():
    """10 real prompts: 3 held-out ones from each workload, plus one that ends early with EOS."""
    prompts = load_workload("humaneval", n=3) + load_workload("math", n=3) + load_workload("chat", n=3)
    return [p.text for p in prompts] + ["Answer with one word only: what colour is the sky on a clear day?"]


def tiny_llama(vocab_size: int, seed: int = 0, hidden: int = 32, layers: int = 2):
    """A random, tiny Llama: fast, and a terrible guesser."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=2,
        bos_token_id=1, pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


def greedy_equals_ar(target, prompt, max_new_tokens, ar, drafter, ks=(2, 4)):
    """Greedy output equal to AR (`ar`, a Generation of `prompt`) for each k; the summed stats, so that a test
    can check that rejections happened."""
    total = sd.Stats()
    for k in ks:
        out = sd.generate(target, prompt, drafter, k=k, max_new_tokens=max_new_tokens)
        assert out.tokens == ar.tokens, f"{drafter.name} k={k} differs from AR"
        total = total + out.stats
    return total


def learned_drafter(name: str, target):
    """A random-weight drafter of a learned method that reads `target`'s hidden states, shaped for it.

    Untrained, so the verifier alone decides the output: what a losslessness test on a tiny target needs.
    """
    from specdec_learn.drafters.dflash import DFlashDrafter, DFlashModel, draft_config
    from specdec_learn.drafters.dspark import DSparkDrafter, DSparkModel, dspark_config
    from specdec_learn.drafters.eagle3 import Eagle3Drafter, new_eagle3
    from specdec_learn.drafters.mtp import MTPDrafter, random_mtp_head

    torch.manual_seed(0)
    if name == "mtp":
        return MTPDrafter(random_mtp_head(target), target)
    if name == "eagle3":
        return Eagle3Drafter(new_eagle3(target), target)
    if name == "dflash":
        return DFlashDrafter(DFlashModel(draft_config(target, block_size=8)))
    if name == "dspark":
        return DSparkDrafter(DSparkModel(dspark_config(target, block_size=7)))
    raise ValueError(f"no learned drafter {name!r}")


@pytest.fixture(autouse=True, scope="session")
def _threads():
    """OMP_NUM_THREADS where set (`make test` sets each parallel worker's share of the cores), else two at most."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, min(2, os.cpu_count() or 1))))


@pytest.fixture(scope="session")
def ar_greedy(target, real_prompts):
    """Plain greedy decoding of `real_prompts`, MAX_NEW tokens each: the reference for parity tests."""
    return [sd.generate(target, p, max_new_tokens=MAX_NEW) for p in real_prompts]


def tiny_target(vocab_size: int = 128, seed: int = 0, hidden: int = 32, layers: int = 2):
    """A tokenizer-less Target around `tiny_llama` (prompts are token ids)."""
    from specdec_learn.target import Target

    return Target(tiny_llama(vocab_size, seed=seed, hidden=hidden, layers=layers), None, name="tiny-llama")


# A drafter that is almost never right (random weights) or always right (the target itself) takes nearly
# the same path every round, whatever the text, so four of the real prompts cover it: one per workload and
# the one that stops at EOS. Drafters that are right some of the time (n-gram, suffix, the shipped ones)
# get all ten at k = FULL_K, where the text decides how much of each block is kept, and the same four at
# the other k (and in trees): any prompt with partial acceptances exercises a k's rollbacks.
SAME_PATH_PROMPTS = (0, 3, 6, 9)
FULL_K = 3


def same_path(items: list) -> list:
    """The SAME_PATH_PROMPTS of `real_prompts`, or of its AR outputs (`ar_greedy`)."""
    return [items[i] for i in SAME_PATH_PROMPTS]


def prompts_for(k: int, items: list) -> list:
    """All of `items` (real prompts or their AR outputs) at k = FULL_K, the same_path four at any other k."""
    return items if k == FULL_K else same_path(items)


def check_parity(target, prompts, ar_outputs, drafter, k, max_new_tokens=MAX_NEW):
    """Every drafter's greedy output must equal AR's, token for token; returns the summed Stats."""
    total = sd.Stats()
    for prompt, ar in zip(prompts, ar_outputs):
        out = sd.generate(target, prompt, drafter, k=k, max_new_tokens=max_new_tokens)
        assert out.tokens == ar.tokens, f"k={k} differs from AR on {prompt[:40]!r}"
        total = total + out.stats
    return total


def training_ids(prefix: str, n: int) -> list[str]:
    """n example ids outside the benchmark split: every trainer refuses data from benchmark prompts, by id."""
    from itertools import count

    from specdec_learn.workloads import is_benchmark_prompt

    ids = (f"{prefix}/{i}" for i in count())
    return [next(i for i in ids if not is_benchmark_prompt(i)) for _ in range(n)]
