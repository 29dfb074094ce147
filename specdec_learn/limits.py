"""The physical limits: how fast decoding could be on this machine, and how fast speculation could be.

Plain decoding at batch 1 reads every weight of the model once per token, and
does little arithmetic on each (chapter 1). So its speed is bounded by the
memory system, not by the arithmetic units:

    tokens/s  <=  read bandwidth (bytes/s) / bytes of weights read per token

`read_bandwidth` measures the first number the way a forward pass uses memory
(streaming a large tensor once, on all the threads torch uses);
`weight_bytes` counts the second. `ar_ceiling` divides them. Real decoding
also reads the KV cache and runs code between the matrix products, so it
reaches a fraction of the ceiling; how large a fraction tells whether a
faster kernel or less Python is worth looking for.

Speculation cannot beat its own ceiling either. A round that emits L tokens
(the mean acceptance length) costs the drafting plus one wider verify pass.
Measured in plain decoding steps, that cost is c, and the speedup is at most
L / c (`predicted_speedup`). A drafter with perfect acceptance and free
drafting gives L = k + 1 and c = T(k+1)/T(1), the verify pass alone.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from pathlib import Path

import torch


# oneDNN's names for the instruction sets below AVX512_CORE_BF16, the first with bf16 dot products
NO_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def isa_cap() -> str | None:
    """The instruction set oneDNN is capped at by ONEDNN_MAX_CPU_ISA (None: not capped). Capped at AVX2, a bf16 CPU
    computes as an AVX2-only one does: how the suite is checked for those CPUs on a machine that is not one.

    oneDNN reads the variable once, when torch first uses it: set it before the process starts (as `make
    test-avx2` does), not from a running notebook, or this answer and the kernels part ways."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return None if cap in ("", "ALL", "DEFAULT") else cap


def cpu_has_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool | None:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX) that torch may use: read from /proc/cpuinfo, and
    False where oneDNN is capped below them (isa_cap); None where it can't be read.

    Without them torch emulates bf16 matmuls, several times slower, and two
    hosts that both call themselves "AMD EPYC" may differ in exactly this.
    Results files record it (machine_info: None says "not known", on
    macOS for one); EAGLE-3's trainer autocasts only where it is True.
    """
    if isa_cap() in NO_BF16_ISAS:
        return False
    flags = _cpu_flags(str(cpuinfo))
    return None if flags is None else ("avx512_bf16" in flags or "amx_bf16" in flags)


def cpu_has_amx(cpuinfo: str | Path = "/proc/cpuinfo") -> bool | None:
    """Whether this CPU has AMX's bf16 tile instructions that oneDNN may use: read from /proc/cpuinfo (a VM may hide
    them from a CPU that has them), False where oneDNN is capped below them; None where it can't be read.

    With AMX a bf16 matmul over 17 rows costs little more than over 2; with
    AVX512-BF16 alone it costs several times more, so a wide verify pass (a
    tree's) is priced differently on two Xeons of one name.
    """
    cap = isa_cap()
    if cap is not None and "AMX" not in cap:
        return False
    flags = _cpu_flags(str(cpuinfo))
    return None if flags is None else "amx_bf16" in flags


@functools.cache
def _cpu_flags(cpuinfo: str) -> str | None:
    """/proc/cpuinfo's text (read once per path), or None where there is none (not Linux)."""
    try:
        return Path(cpuinfo).read_text()
    except OSError:  # not Linux
        return None


def machine_info(target=None) -> dict:
    """What the numbers were measured on, for a results file: the CPU (and whether it has bf16 instructions), the
    GPU, the versions, and the target's device and dtype when one is given."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cpu_bf16": cpu_has_bf16(),  # bf16 instructions: without them a CPU's bf16 matmuls are emulated
        "cpu_amx": cpu_has_amx(),  # AMX: with it a bf16 pass over many rows costs little more than over one
        "isa_cap": isa_cap(),  # oneDNN capped below what the CPU has (ONEDNN_MAX_CPU_ISA), e.g. "AVX2"; None: not
        "aten_isa": torch.backends.cpu.get_cpu_capability(),  # the instruction set torch's own kernels use
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if target is not None:
        info.update(device=str(target.device), dtype=str(target.dtype).replace("torch.", ""),
                    row_invariant=target.row_invariant)
    return info


def read_bandwidth(mbytes: int = 512, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes per second when a tensor much larger than the caches is read once (best of `repeats`)."""
    x = torch.ones(mbytes * 2**20 // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up (page faults, thread pool)
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        x.sum()
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return x.numel() * x.element_size() / best


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every parameter once (tied embeddings count once)."""
    unique = {p.data_ptr(): p for p in model.parameters()}
    return sum(p.numel() * p.element_size() for p in unique.values())


def matmul_weights(*modules: torch.nn.Module) -> int:
    """Parameters of the matrices a token is multiplied by in `modules` (embedding lookups and norms excluded).

    A count, not bytes: the ratio of two such counts is what a step of one network
    costs against another's when both are memory-bound (chapters 4 and 5). A
    tied embedding counts where it multiplies (as an output head), not where it
    is looked up, so pass the head's module, not the embedding's.
    """
    return sum(p.numel() for m in modules for p in m.parameters() if p.ndim == 2)


def ar_ceiling(target, bandwidth: float) -> float:
    """The most tokens/s plain decoding can reach: bandwidth / bytes of weights per token."""
    return bandwidth / weight_bytes(target.model)


def round_speedup(tokens_per_round: float, k: int, c: float, verify: float) -> float:
    """The cost model of chapter 3 (and bench.py's two costs): L / (k c + T(k+1)/T(1)).

    A round drafts k tokens at c plain decoding steps each, verifies them in
    one pass worth `verify` steps, and yields `tokens_per_round` tokens.
    """
    return tokens_per_round / (k * c + verify)


def predicted_speedup(stats, ar_stats) -> tuple[float, float]:
    """(L, L / c): tokens per round, and the speedup the measured round cost allows.

    c = (draft + verify time per round) / (time per plain decoding step), both
    taken from the same benchmark run. The measured speedup falls below L / c
    by what the loop spends outside drafting and verifying (prefill, Python).
    """
    rounds = max(stats.num_rounds, 1)
    step = ar_stats.verify_time / max(ar_stats.num_rounds, 1)  # one plain decoding step
    cost = (stats.draft_time + stats.verify_time) / rounds / step
    tokens_per_round = stats.num_output_tokens / rounds
    return tokens_per_round, tokens_per_round / cost
