"""Shared fixtures.

`target` is the real embedded model (SmolLM2-135M-Instruct), loaded once per
session in the dtype this CPU runs fastest (`dtype="auto"`: bf16 where it has
bf16 instructions, else fp32). Its rows are computed alike (invariant.py), so
speculation must equal plain decoding to the bit in either dtype.
`target_fp32` is the same model in fp32, for the tests whose reference lies
outside the library (HF generate, a full forward, vLLM): there the two sides
sum in different orders, and only fp32 keeps the difference below a tie.
Tiny random models stand in where a test needs a model that is cheap or
deliberately bad.
"""

import functools
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

import specdec_learn as sd
from specdec_learn.limits import isa_cap
from specdec_learn.models import resolve_dtype
from specdec_learn.workloads import load_workload


@functools.cache
def embedded_target(dtype: torch.dtype):
    """The embedded model in `dtype`, loaded once per worker (so `target` and `target_fp32` are one where the
    fast dtype is fp32)."""
    torch.manual_seed(0)
    return sd.load("smollm2-135m", dtype=dtype, device="cpu")


@pytest.fixture(scope="session")
def target():
    return embedded_target(resolve_dtype("auto", "cpu"))


@pytest.fixture(scope="session")
def target_fp32():
    return embedded_target(torch.float32)


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


def learned_drafter(name: str, target, block_size: int | None = None):
    """A random-weight drafter of a learned method that reads `target`'s hidden states, shaped for it.

    Untrained, so the verifier alone decides the output: what a losslessness test on a tiny target needs.
    block_size: DFlash's or DSpark's block (default 8 and 7).
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
        return DFlashDrafter(DFlashModel(draft_config(target, block_size=block_size or 8)))
    if name == "dspark":
        return DSparkDrafter(DSparkModel(dspark_config(target, block_size=block_size or 7)))
    raise ValueError(f"no learned drafter {name!r}")


@pytest.fixture(autouse=True, scope="session")
def _threads():
    """OMP_NUM_THREADS where set (`make test` sets each parallel worker's share of the cores), else two at most."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, min(2, os.cpu_count() or 1))))


@pytest.fixture(scope="session")
def ar_greedy(target, real_prompts):
    """Plain greedy decoding of `real_prompts`, MAX_NEW tokens each: the reference for parity tests."""
    return cached_ar(target, real_prompts, MAX_NEW)


@pytest.fixture(scope="session")
def ar_greedy_fp32(target_fp32, real_prompts):
    """`ar_greedy` of `target_fp32`."""
    return cached_ar(target_fp32, real_prompts, MAX_NEW)


def library_digest() -> str:
    """SHA-256 over the library's source files: a change anywhere in it makes a new AR reference."""
    digest = hashlib.sha256()
    root = Path(sd.__file__).parent
    for file in sorted(root.rglob("*.py")):
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def cached_ar(target, prompts: list[str], max_new_tokens: int) -> list[sd.Generation]:
    """AR's greedy outputs of `prompts`, computed once per (model, dtype, torch, transformers, library source, the
    instruction set torch's kernels use).

    Kept under the library's cache folder, so that each test worker and each step of `make test` (the vLLM
    venv's tests compare with the same outputs) reads what the first one computed; a lock makes the others
    wait for it. The reference itself is checked against HF generate in test_parity.py. Its Stats are empty.
    """
    import fcntl

    import transformers

    from specdec_learn.formats.io import write_text_atomic
    from specdec_learn.models import cache_dir

    kernels = [torch.backends.cpu.get_cpu_capability(), isa_cap()]  # they decide the bits
    key = json.dumps([target.name, str(target.dtype), torch.__version__, transformers.__version__, library_digest(),
                      kernels, prompts, max_new_tokens])
    file = cache_dir() / "test-ar" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not file.exists():
            outs = [sd.generate(target, p, max_new_tokens=max_new_tokens) for p in prompts]
            write_text_atomic(file, json.dumps([[o.prompt_ids, o.tokens, o.text] for o in outs]))
    return [sd.Generation(prompt_ids, tokens, text, sd.Stats()) for prompt_ids, tokens, text in json.loads(file.read_text())]


def tiny_target(vocab_size: int = 128, seed: int = 0, hidden: int = 32, layers: int = 2):
    """A tokenizer-less Target around `tiny_llama` (prompts are token ids)."""
    from specdec_learn.target import Target

    return Target(tiny_llama(vocab_size, seed=seed, hidden=hidden, layers=layers), None, name="tiny-llama")


# A drafter that is almost never right (random weights) or always right (the target itself) takes nearly
# the same path every round, whatever the text, so four of the real prompts cover it: one per workload and
# the one that stops at EOS. The cheap drafters that are right some of the time (n-gram, suffix) get all ten
# at k = FULL_K, where the text decides how much of each block is kept, and the same four at the other k:
# any prompt with partial acceptances exercises a k's rollbacks. The shipped learned drafters, each a model
# of its own, get the same four at k = FULL_K (test_shipped.py), and tiny targets run the other k.
SAME_PATH_PROMPTS = (0, 3, 6, 9)
FULL_K = 3


def same_path(items: list) -> list:
    """The SAME_PATH_PROMPTS of `real_prompts`, or of its AR outputs (`ar_greedy`)."""
    return [items[i] for i in SAME_PATH_PROMPTS]


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
