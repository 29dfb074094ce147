"""Row invariance (invariant.py): a row's logits are the same bits in a one-row pass and inside a wider one.

The property checked is the one greedy speculation needs: row i of a verify
pass over [last, d1..dk] (or over a tree) equals what plain decoding computes
at that position, one row at a time, after committing the same tokens.
"""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec_learn as sd
from specdec_learn.limits import cpu_has_bf16, machine_info
from specdec_learn.methods import names
from specdec_learn.zoo import make_drafter
from specdec_learn.invariant import (RowLinear, is_row_invariant, make_row_invariant, packed_matmul_works, plan,
                                     shared_start, visible_keys)
from specdec_learn.target import Target

from conftest import embedded_target, tiny_llama

DRAFTS = [13, 567, 89, 1000, 22, 7, 99, 100, 5]
TREE = ([13, 567, 89, 1000, 22], [-1, -1, 0, 1, 2])  # two branches: 13 -> 89 -> 22 and 567 -> 1000


def needs_packed_matmul(dtype: torch.dtype) -> None:
    """Rows are computed alike in `dtype` only through oneDNN's packed matmul in it, which a CPU without bf16
    instructions (AVX2-only) lacks in bf16: there the library keeps torch's own kernels and says why (the last
    test of this file). Everywhere else the packed matmul must work: a torch that broke it fails here, rather
    than skipping every test of this file."""
    if dtype == torch.bfloat16 and cpu_has_bf16() is False:
        pytest.skip("no bf16 instructions in use here (none on this CPU, or oneDNN capped below them), so no oneDNN "
                    "packed matmul in bf16: rows are not computed alike in bf16 here")
    assert packed_matmul_works(dtype), f"oneDNN's packed matmul fails in {dtype} on a CPU that should have it"


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def real(request):
    needs_packed_matmul(request.param)
    return embedded_target(request.param)


def one_row_logits(target, state, tokens):
    """Plain decoding's logits at `last` and after each of `tokens`: one row a pass, committing as it goes."""
    state, rows = copy.deepcopy(state), []
    for i in range(len(tokens) + 1):
        rows.append(target.verify(state, []).logits[0])
        if i < len(tokens):
            target.commit(state, [tokens[i]])
    return rows


def differing(target, prompt, drafts, parents=None):
    """The rows of one verify pass over `drafts` (a chain, or a tree) whose bits differ from plain decoding's."""
    state, _ = target.prefill(prompt)
    wide = target.verify(copy.deepcopy(state), drafts, parents=parents).logits
    bad = []
    for row in range(len(drafts) + 1):
        path = []  # the drafts on the way to this row: its ancestors, root first
        node = row - 1
        while node >= 0:
            path.insert(0, drafts[node])
            node = parents[node] if parents is not None else node - 1
        if not torch.equal(wide[row], one_row_logits(target, state, path)[-1]):
            bad.append(row)
    return bad


def test_the_embedded_target_is_row_invariant_in_each_dtype(real):
    assert real.row_invariant and machine_info(real)["row_invariant"]
    prompt = real.encode("Write a Python function that reverses a linked list.")
    for n in (1, 3, 4, len(DRAFTS)):
        assert differing(real, prompt, DRAFTS[:n]) == [], f"{real.dtype}: a chain of {n}"
    assert differing(real, prompt, *TREE) == [], f"{real.dtype}: a tree"


def test_without_the_switch_rows_differ_somewhere():
    """What the switch is for: torch's own kernels give a wide pass's rows other bits (in fp32 on every CPU
    these tests have met; the one-row and multi-row matmul kernels round differently)."""
    plain = sd.load("smollm2-135m", dtype="fp32", device="cpu", invariant=False)
    assert not plain.row_invariant
    prompt = plain.encode("Write a Python function that reverses a linked list.")
    assert differing(plain, prompt, DRAFTS[:4]) != []


def test_greedy_speculation_equals_plain_decoding_in_bf16(real_prompts):
    """Every drafter, chains and a tree, in the dtype where near-ties used to flip (on a CPU whose fast dtype is
    bf16, the suite's `target` checks this again on every test)."""
    needs_packed_matmul(torch.bfloat16)
    target = embedded_target(torch.bfloat16)
    prompts = [real_prompts[0], real_prompts[6]]
    ar = [sd.generate(target, p, max_new_tokens=24).tokens for p in prompts]
    for method in names()[1:]:
        drafter = make_drafter(method, target)
        for prompt, expected in zip(prompts, ar):
            assert sd.generate(target, prompt, drafter, k=3, max_new_tokens=24).tokens == expected, method
    tree = sd.TreeSpec(8, 3, 2)
    for method in ("eagle3", "ngram"):
        drafter = make_drafter(method, target)
        assert sd.generate(target, prompts[0], drafter, tree=tree, max_new_tokens=24).tokens == ar[0], method


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_targets_are_row_invariant_past_the_window(family, dtype):
    from test_sliding_window import PROMPT, TARGETS

    needs_packed_matmul(dtype)
    target = Target(TARGETS[family]().to(dtype), None, name=f"tiny-{family}")
    assert make_row_invariant(target.model)
    prompt = PROMPT * 2  # six windows of 8
    for n in (2, 5):
        assert differing(target, prompt, [5, 9, 14, 3, 27][:n]) == [], f"{family} {dtype}: a chain of {n}"


def test_visible_keys_are_the_mask_rows():
    """Consecutive keys come back as a slice (a view), a tree row's ancestors as their indices."""
    causal = visible_keys(None, 3, 10)
    assert causal == [slice(0, 8), slice(0, 9), slice(0, 10)]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    rows = visible_keys(mask, 3, 5)
    assert rows[0] == slice(0, 3) and rows[1].tolist() == [0, 1, 3] and rows[2] == slice(0, 0)
    additive = torch.where(mask, 0.0, float("-inf"))
    assert visible_keys(additive, 3, 5)[1].tolist() == [0, 1, 3]


def test_a_tree_pass_plans_its_rows_once_and_shares_the_cache_part():
    """The keys every tree row sees from key 0 on (the cache and the root) are found, and one pass's layers,
    which all get the same mask object, reuse one plan; another mask gets its own."""
    allowed = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 1]],
                           dtype=torch.bool)  # a cache of 2, the root, and nodes 0 and 1 (children of the root), 2
    assert shared_start(visible_keys(allowed, 4, 6)) == 3
    assert shared_start([slice(0, 4), torch.tensor([1, 2])]) == 0 and shared_start([slice(0, 4)]) == 0
    mask = allowed[None, None]
    rows, start = plan(mask, 4, 6)
    assert start == 3 and rows[2].tolist() == [0, 1, 2, 4] and plan(mask, 4, 6)[0] is rows
    assert plan(mask.clone(), 4, 6)[0] is not rows


def test_row_linear_keeps_the_layer_and_its_ties():
    """The wrapped layer keeps its Parameters (a tied embedding stays tied) and its state-dict names; a one-row
    input gives a multi-row pass's bits; an in-place change of the weight reaches the packed copy; autograd
    runs the plain layer."""
    model = tiny_llama(96)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    head, keys = model.lm_head, set(model.state_dict())
    assert make_row_invariant(model) and is_row_invariant(model)
    assert isinstance(model.lm_head, RowLinear) and model.lm_head.weight is head.weight
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert set(model.state_dict()) == keys
    x = torch.randn(5, 32)
    with torch.inference_mode():
        assert torch.equal(model.lm_head(x[2:3]), model.lm_head(x)[2:3])
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(model.lm_head(x), x @ model.lm_head.weight.T)
    with torch.enable_grad():
        assert model.lm_head(x).requires_grad  # autograd goes through the plain layer
    assert make_row_invariant(model)  # idempotent: not wrapped twice
    assert type(model.lm_head) is RowLinear


def test_what_cannot_be_made_invariant_is_left_as_it_is():
    """A hybrid (linear-attention) target and an fp16 one keep their kernels, and say why."""
    from test_hybrid import tiny_qwen3_5

    from specdec_learn.invariant import not_invariant

    hybrid = tiny_qwen3_5()
    assert "linear_attention" in not_invariant(hybrid) and not make_row_invariant(hybrid)
    assert not is_row_invariant(hybrid)
    half = tiny_llama(96).half()
    assert "float16" in not_invariant(half) and not make_row_invariant(half)


def test_load_warns_where_it_cannot_compute_rows_alike(monkeypatch):
    """`sd.load` asked for rows computed alike (the default) and not given them says so, with the reason."""
    import warnings

    from test_hybrid import tiny_qwen3_5

    from specdec_learn import models
    from specdec_learn.invariant import NotRowInvariant

    monkeypatch.setattr(models, "load_hf", lambda *args, **kwargs: (tiny_qwen3_5(), None))
    with pytest.warns(NotRowInvariant, match="tiny-hybrid keeps torch's own kernels: it has linear_attention"):
        assert not sd.load("tiny-hybrid").row_invariant
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotRowInvariant)
        sd.load("tiny-hybrid", invariant=False)  # asked for torch's kernels: nothing to warn about
        monkeypatch.setattr(models, "load_hf", lambda *args, **kwargs: (tiny_llama(64), None))
        assert sd.load("tiny").row_invariant


def test_a_cpu_without_packed_bf16_matmuls_computes_rows_alike_in_fp32_and_says_why_not_in_bf16():
    """An AVX2-only CPU (here: oneDNN capped at AVX2, as such a CPU computes) packs no bf16 weights. `--dtype auto`
    takes fp32 there, rows alike; an explicit bf16 target keeps torch's own kernels and says why, never failing
    in its first forward."""
    code = """if True:
        import torch
        from conftest import tiny_llama
        from specdec_learn.invariant import make_row_invariant, not_invariant
        from specdec_learn.limits import cpu_has_bf16, machine_info
        from specdec_learn.models import resolve_dtype
        assert cpu_has_bf16() is False and machine_info()["isa_cap"] == "AVX2"
        assert resolve_dtype("auto", "cpu") == torch.float32
        assert make_row_invariant(tiny_llama(64))
        model = tiny_llama(64).to(torch.bfloat16)
        assert not make_row_invariant(model) and "packed matmul in bfloat16" in not_invariant(model)
        model(torch.tensor([[1, 2, 3]]))
        import warnings
        import specdec_learn as sd
        from specdec_learn import models
        models.load_hf = lambda *args, **kwargs: (tiny_llama(64).to(torch.bfloat16), None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not sd.load("tiny").row_invariant
        assert any("load in fp32" in str(w.message) for w in caught), caught
    """
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).parent)
    assert run.returncode == 0, run.stderr[-2000:]
