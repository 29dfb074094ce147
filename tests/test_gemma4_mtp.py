"""The Gemma 4 assistant: reads (never grows) the target's KV cache, HF format round trip, the rules HF and vLLM
disagree on."""

import copy

import pytest
import torch
from conftest import tiny_target

import specdec_learn as sd
from specdec_learn.drafters.gemma4_mtp import (
    Gemma4AssistantDrafter,
    load_gemma4_assistant,
    random_assistant,
    read_shared_kv,
    shared_kv_layers,
)
from specdec_learn.sampling import GREEDY, Sampling
from specdec_learn.target import Target
from specdec_learn.vocab import ReducedHead

SAMPLED = Sampling(temperature=1.0)


@pytest.mark.slow
def test_an_assistant_shaped_for_the_real_target_runs_losslessly(target, real_prompts, ar_greedy):
    """assistant_config_for on SmolLM2 (head size 64, 3 K/V heads, its RoPE): one short run at k = 7.
    Lossless decoding at every k: test_lossless_tiny.py; the shipped assistant: test_shipped.py."""
    drafter = Gemma4AssistantDrafter(random_assistant(target, hidden_size=64, num_layers=2), target)
    out = sd.generate(target, real_prompts[0], drafter, k=7, max_new_tokens=8)
    assert out.tokens == ar_greedy[0].tokens[:8] and out.stats.num_draft_tokens > 0


def started(target, drafter, ids):
    state, out = target.prefill(ids, drafter.taps)
    drafter.start(target, state, out.hidden)
    return state


def draft_q(drafter, state, k=4):
    return drafter.propose(state, k, SAMPLED, torch.Generator().manual_seed(0)).q


def test_assistant_reads_the_target_cache_and_never_grows_it():
    target = tiny_target(hidden=64)
    drafter = Gemma4AssistantDrafter(random_assistant(target, hidden_size=32, num_layers=2), target)
    state = started(target, drafter, list(range(5, 25)))
    layer = state.cache.layers[shared_kv_layers(target)["full_attention"]]
    keys_before, length_before = layer.keys.clone(), state.cache.get_seq_length()

    q = draft_q(drafter, state, k=6)
    assert state.cache.get_seq_length() == length_before  # 6 draft steps wrote nothing
    assert torch.equal(layer.keys, keys_before)

    layer.keys = keys_before + 0.5 * torch.randn_like(keys_before)  # perturb the target's cache only
    q_perturbed = draft_q(drafter, state, k=6)
    assert not torch.allclose(q, q_perturbed, atol=1e-4)
    # ...and only through the cache: restoring it restores the drafts
    layer.keys = keys_before
    torch.testing.assert_close(draft_q(drafter, state, k=6), q)


def test_assistant_uses_the_last_cache_layer_of_a_single_type_target():
    target = tiny_target(layers=3)
    assert shared_kv_layers(target) == {"full_attention": 2, "sliding_attention": 2}


def test_incremental_state_equals_from_scratch():
    """After rounds with various acceptance, the fed-back target state is the one a fresh
    drafter derives from the whole sequence."""
    target = tiny_target(hidden=64)
    assistant = random_assistant(target, hidden_size=32, num_layers=2)
    drafter = Gemma4AssistantDrafter(assistant, target)
    state = started(target, drafter, list(range(5, 17)))
    for n in [0, 2, 3, 0, 1]:
        drafts = drafter.propose(state, 3, GREEDY, None).tokens
        out = target.verify(state, drafts, drafter.taps)
        target.commit(state, drafts[:n] + [int(out.logits[n].argmax())])
        drafter.observe(state, n, {t: h[: n + 1] for t, h in out.hidden.items()})
    fresh = Gemma4AssistantDrafter(assistant, target)
    fresh_state = started(target, fresh, state.ids)
    torch.testing.assert_close(draft_q(drafter, state), draft_q(fresh, fresh_state), atol=1e-5, rtol=1e-4)


def test_assistant_for_another_target_is_refused():
    big, small = tiny_target(hidden=64), tiny_target(hidden=32)
    with pytest.raises(ValueError, match="backbone_hidden_size"):
        Gemma4AssistantDrafter(random_assistant(big, hidden_size=32), small)


# -- the published format, with a tiny Gemma 4 target ------------------------------------
def tiny_gemma4_pair(ordered_embeddings: bool):
    """A tiny Gemma 4 target (sliding + full layers, KV-shared top layers, soft-capped logits)
    and an assistant in the ``gemma4_assistant`` layout that reads it."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

    common = dict(vocab_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                  sliding_window=64, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                  final_logit_softcapping=30.0, eos_token_id=1, bos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    target_cfg = Gemma4TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2, **common,
    )
    target = Target(Gemma4ForCausalLM(target_cfg).eval(), None, name="tiny-gemma4")
    text = Gemma4TextConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention"], **common,
    )
    extra = {}
    if ordered_embeddings:
        extra = dict(use_ordered_embeddings=True, num_centroids=16, centroid_intermediate_top_k=4)
    assistant = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=text, backbone_hidden_size=64, **extra))
    if ordered_embeddings:  # a real checkpoint ships this permutation of the vocabulary
        assistant.masked_embedding.token_ordering.copy_(torch.randperm(256))
    return target, assistant.eval()


@pytest.mark.parametrize("ordered_embeddings", [False, True], ids=["dense-logits", "centroid-logits"])
def test_gemma4_assistant_format_round_trip(ordered_embeddings, tmp_path):
    target, assistant = tiny_gemma4_pair(ordered_embeddings)
    assert shared_kv_layers(target) == {"full_attention": 2, "sliding_attention": 3}
    assistant.save_pretrained(tmp_path)
    loaded = load_gemma4_assistant(tmp_path, target)
    assert loaded.config.model_type == "gemma4_assistant"
    for (name, a), b in zip(assistant.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name

    prompt = list(range(3, 40))
    ar = sd.generate(target, prompt, max_new_tokens=16)
    for k in (1, 2, 4):
        drafter = Gemma4AssistantDrafter(loaded, target)
        assert sd.generate(target, prompt, drafter, k=k, max_new_tokens=16).tokens == ar.tokens
    if ordered_embeddings:  # sparse logits: only the tokens of the top centroids can be drafted
        state = started(target, drafter, prompt)
        q = draft_q(drafter, state, k=1)[0]
        assert 0 < int((q > 0).sum()) <= 4 * 256 // 16


# -- the rules vLLM and HF disagree on (module docstring of drafters/gemma4_mtp.py) ------------------------------


def hf_candidate_logits(target, assistant, ids, k):
    """transformers' own loop (generation/candidate_generator.py, SinglePositionMultiTokenCandidateGenerator,
    the generator `generate(assistant_model=<Gemma4Assistant>)` uses), one round after the prompt: the
    target ran ids[:-1] and sampled ids[-1]."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

    assistant.generation_config.num_assistant_tokens = k
    gen = SinglePositionMultiTokenCandidateGenerator(
        input_ids=torch.tensor([ids]), assistant_model=assistant,
        target_model_input_embeddings=target.model.get_input_embeddings(),
        generation_config=GenerationConfig(max_length=len(ids) + 50), model_kwargs={})
    with torch.no_grad():
        outputs = target.model(torch.tensor([ids[:-1]]), output_hidden_states=True, return_shared_kv_states=True)
        _, logits = gen.get_candidates(torch.tensor([ids]), {}, outputs, is_first_iteration=False, n_last_matches=0)
    return logits[0]  # [k, V]


def test_hf_position_rule_reproduces_transformers_loop_and_vllm_rule_differs():
    """position="hf" drafts what transformers' loop drafts (query at p, the position of `last`); the
    default, vLLM's (v1/spec_decode/llm_base_proposer.py keeps the target's positions and shifts the tokens,
    gemma4.py keeps them constant), queries at p-1 and gives other logits. Dense logits are soft-capped as
    vLLM's logits processor caps them (model_executor/models/gemma4_mtp.py), where HF's are raw."""
    target, assistant = tiny_gemma4_pair(ordered_embeddings=False)
    cap = assistant.config.get_text_config().final_logit_softcapping
    ids = list(range(3, 30))
    want = cap * torch.tanh(hf_candidate_logits(target, assistant, ids, k=3).float() / cap)
    for position, same in (("hf", True), ("vllm", False)):
        drafter = Gemma4AssistantDrafter(assistant, target, position=position)
        state = started(target, drafter, ids)
        p = len(ids) - 1 - (position == "vllm")
        shared = read_shared_kv(state.cache, drafter.kv_layers)
        tok, h, rows = ids[-1], drafter.h, []
        with torch.inference_mode():
            for i in range(3):
                logits, h = drafter.step(tok, h, torch.tensor([[p]]), shared)
                rows.append(logits)
                tok = int(want[i].argmax()) if same else int(logits.argmax())
        got = torch.stack(rows)
        assert torch.allclose(got, want, atol=1e-4) == same, position
    with pytest.raises(ValueError, match="position"):
        Gemma4AssistantDrafter(assistant, target, position="middle")


def test_centroid_logits_are_not_soft_capped_and_dense_ones_are():
    """vLLM (gemma4_mtp.py compute_logits): the masked-embedding path bypasses the logits processor's
    soft cap and gives the tokens outside the top centroids the dtype's minimum; the dense path is capped."""
    target, assistant = tiny_gemma4_pair(ordered_embeddings=True)
    with torch.no_grad():  # logits of tens, where a cap of 30 bends them visibly
        assistant.lm_head.weight.mul_(100)
    drafter = Gemma4AssistantDrafter(assistant, target)
    state = started(target, drafter, list(range(3, 30)))
    shared = read_shared_kv(state.cache, drafter.kv_layers)
    position = torch.tensor([[len(state.ids) - 2]])
    ids = torch.tensor([[state.ids[-1]]])
    with torch.inference_mode():
        raw = assistant(inputs_embeds=torch.cat([target.embed_tokens(ids) * drafter.embed_scale, drafter.h], -1),
                        position_ids=position, shared_kv_states=shared).logits[0, -1]
        logits, _ = drafter.step(state.ids[-1], drafter.h, position, shared)
    kept = torch.isfinite(logits)
    assert 0 < int(kept.sum()) <= 4 * 256 // 16
    torch.testing.assert_close(logits[kept], raw[kept].float())  # uncapped (30 * tanh(x / 30) would differ)


def test_suppressed_tokens_are_never_drafted():
    """generation_config.json's suppress_tokens change the draft distribution: vLLM (gemma4_mtp.py
    compute_logits) sets them to -inf; so does the drafter (from the generation_config a folder loads with)."""
    target, assistant = tiny_gemma4_pair(ordered_embeddings=False)
    plain = Gemma4AssistantDrafter(assistant, target)
    state = started(target, plain, list(range(3, 30)))
    banned = draft_q(plain, state, k=1)[0].topk(3).indices.tolist()
    assistant.generation_config.suppress_tokens = banned
    drafter = Gemma4AssistantDrafter(assistant, target)
    state = started(target, drafter, list(range(3, 30)))
    q = draft_q(drafter, state, k=4)
    assert q[:, banned].sum() == 0 and torch.allclose(q.sum(-1), torch.ones(4))


def test_a_draft_vocabulary_on_a_soft_capped_assistant_keeps_the_outside_at_minus_infinity():
    """reduce_vocabulary swaps the assistant's head for its cut rows. The soft cap bends logits with tanh,
    which would bring -inf back to -cap (a probability for tokens that cannot be drafted): they stay -inf,
    the kept tokens' logits are the full head's, and greedy output is still the target's."""
    target, assistant = tiny_gemma4_pair(ordered_embeddings=False)
    ids = list(range(3, 30))
    full = Gemma4AssistantDrafter(assistant, target)
    state = started(target, full, ids)
    shared = read_shared_kv(state.cache, full.kv_layers)
    position = torch.tensor([[len(state.ids) - 2]])
    with torch.inference_mode():
        want, _ = full.step(state.ids[-1], full.h, position, shared)  # [V], soft-capped
    kept = sorted(torch.randperm(256, generator=torch.Generator().manual_seed(0))[:64].tolist())
    cut = Gemma4AssistantDrafter(copy.deepcopy(assistant), target)
    cut.reduce_vocabulary(kept)
    cut.h = full.h
    with torch.inference_mode():
        got, _ = cut.step(state.ids[-1], cut.h, position, shared)
    outside = torch.ones(256, dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(got[outside]).all()
    torch.testing.assert_close(got[kept], want[kept])
    ar = sd.generate(target, ids, max_new_tokens=16)
    assert sd.generate(target, ids, cut, k=3, max_new_tokens=16).tokens == ar.tokens
    assert not isinstance(assistant.get_output_embeddings(), ReducedHead)  # the copy was cut, not the original


def test_a_centroid_assistant_refuses_a_draft_vocabulary():
    target, assistant = tiny_gemma4_pair(ordered_embeddings=True)
    with pytest.raises(ValueError, match="top centroids.*drop --draft-vocab"):
        Gemma4AssistantDrafter(assistant, target).reduce_vocabulary(range(64))


@pytest.mark.parametrize("method", ["eagle3", "dflash", "dspark"])
def test_a_fresh_learned_drafter_for_a_gemma4_target_takes_its_full_attention_heads(method):
    """Gemma 4's full-attention layers have larger heads than its sliding ones, so transformers refuses to read one
    `head_dim` off its config: a fresh drafter copies the full-attention layers' (and their RoPE base)."""
    from conftest import learned_drafter

    target, _ = tiny_gemma4_pair(False)
    drafter = learned_drafter(method, target)
    model = drafter.model
    head_dim = model.layers[0].head_dim if method == "eagle3" else model.config.head_dim
    assert head_dim == 32  # global_head_dim; the sliding layers' heads are 16
    prompt = list(range(3, 40))
    ar = sd.generate(target, prompt, max_new_tokens=12)
    assert sd.generate(target, prompt, drafter, k=3, max_new_tokens=12).tokens == ar.tokens
