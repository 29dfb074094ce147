"""The physical limits: what they count, on hand-made numbers."""

from copy import deepcopy

import pytest
import torch
from conftest import tiny_llama

from specdec_learn.limits import (ar_ceiling, cpu_has_amx, cpu_has_bf16, isa_cap, matmul_weights, predicted_speedup,
                                  read_bandwidth, weight_bytes)
from specdec_learn.stats import Round, Stats
from specdec_learn.target import Target


# tiny_llama(64, hidden=16): vocabulary 64, 2 layers, MLP width 32, 4 heads of 4 dims, 2 K/V heads (8 dims), no biases.
#   a layer: q 16*16 + k 16*8 + v 16*8 + o 16*16 = 768, gate/up/down 3 * 16*32 = 1536, two norms 2 * 16 = 32 -> 2336
#   the model: 2 layers 4672 + embedding 64*16 = 1024 + final norm 16 + untied head 64*16 = 1024 -> 6736
TINY_PARAMS = 6736
TINY_TIED_PARAMS = 6736 - 1024  # the head is the embedding: its 1024 numbers are read once


def test_weight_bytes_counts_every_parameter_once_at_its_width():
    model = tiny_llama(64, hidden=16)
    assert not model.config.tie_word_embeddings
    assert weight_bytes(model) == 4 * TINY_PARAMS  # fp32
    assert weight_bytes(deepcopy(model).to(torch.bfloat16)) == 2 * TINY_PARAMS  # a bf16 copy: half the bytes
    model.lm_head.weight = model.model.embed_tokens.weight  # tie them
    assert weight_bytes(model) == 4 * TINY_TIED_PARAMS


def test_ceiling_is_bandwidth_over_bytes_per_token():
    target = Target(tiny_llama(64, hidden=16), None)
    assert ar_ceiling(target, 1e9) == pytest.approx(1e9 / (4 * TINY_PARAMS))  # 37,114 tokens/s at 1 GB/s
    assert read_bandwidth(mbytes=8, repeats=2) > 1e8  # any machine streams more than 100 MB/s


def test_predicted_speedup_from_round_costs():
    ar = Stats()
    for _ in range(10):  # a plain step costs 10 ms
        ar.record(Round(0, 0, draft_time=0.0, verify_time=0.010))
    spec = Stats()
    for _ in range(4):  # rounds of 3 tokens that cost 12 ms verify + 3 ms drafting
        spec.record(Round(3, 2, draft_time=0.003, verify_time=0.012))
    spec.num_output_tokens = 12
    tokens_per_round, allowed = predicted_speedup(spec, ar)
    assert tokens_per_round == 3
    assert allowed == pytest.approx(3 / 1.5)


def test_matmul_weights_counts_matrices_only():
    model = tiny_llama(64, hidden=32, layers=2)  # intermediate 64, 4 heads of 8, 2 K/V heads
    layer = 32 * 32 + 2 * (32 * 16) + 32 * 32 + 3 * (32 * 64)  # q, k and v, o, gate/up/down
    assert matmul_weights(model.model.layers) == 2 * layer  # norms (1-D) excluded
    assert matmul_weights(model.lm_head) == 64 * 32


def test_cpu_has_bf16_reads_the_flags_and_says_none_where_it_cannot(tmp_path, monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    found = []
    for i, flags in enumerate(["fpu avx2 avx512f", "fpu avx2 avx512f avx512_bf16", "fpu amx_bf16 amx_tile"]):
        cpuinfo = tmp_path / f"cpuinfo{i}"  # one file each: the answer is cached per path
        cpuinfo.write_text(f"flags\t\t: {flags}\n")
        found.append(cpu_has_bf16(cpuinfo))
    assert found == [False, True, True]
    assert cpu_has_bf16(tmp_path / "absent") is None  # macOS has no /proc/cpuinfo: not known, not False
    for cap, bf16 in [("avx2", False), ("AVX512_CORE", False), ("AVX512_CORE_AMX", True), ("all", True)]:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)  # oneDNN capped below bf16: torch computes without it
        assert cpu_has_bf16(tmp_path / "cpuinfo2") is bf16
    for unset in ("all", "DEFAULT", ""):  # oneDNN's own words for "no cap"
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", unset)
        assert isa_cap() is None
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert isa_cap() == "AVX2"


def test_cpu_has_amx_reads_the_flags_and_the_cap(tmp_path, monkeypatch):
    """An AVX512-BF16 Xeon and an AMX one share a name; the flags tell them apart, and a cap below AMX hides it."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    for i, (flags, amx) in enumerate([("fpu avx512f avx512_bf16", False), ("fpu avx512_bf16 amx_bf16 amx_tile", True)]):
        cpuinfo = tmp_path / f"amx{i}"
        cpuinfo.write_text(f"flags\t\t: {flags}\n")
        assert cpu_has_amx(cpuinfo) is amx
    assert cpu_has_amx(tmp_path / "absent") is None
    for cap, amx in [("AVX512_CORE_BF16", False), ("avx2", False), ("AVX512_CORE_AMX", True)]:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert cpu_has_amx(tmp_path / "amx1") is amx
