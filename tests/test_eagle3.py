"""EAGLE-3: lossless in the loop, the speculators format read and written, TTT training that learns.

The tiny checkpoints here are written by hand in the exact speculators layout
(config.json + model.safetensors, `midlayer.*` or `layers.0.*`, with and
without `embed_tokens`), for a llama-style and a qwen3-style target.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import specdec_learn as sd
from conftest import tiny_llama
from specdec_learn.limits import NO_BF16_ISAS, isa_cap
from specdec_learn.drafters.eagle3 import Eagle3Drafter, Eagle3Model, load_eagle3, new_eagle3, save_eagle3
from specdec_learn.target import Target

VOCAB, H, LAYERS = 96, 32, 6


def tiny_qwen3(vocab_size: int, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      eos_token_id=2, bos_token_id=1, pad_token_id=0)
    return Qwen3ForCausalLM(cfg).eval()


def tiny_target(kind: str) -> Target:
    model = tiny_llama(VOCAB, seed=1, hidden=H, layers=LAYERS) if kind == "llama" else tiny_qwen3(VOCAB, seed=1)
    return Target(model, tokenizer=None, name=f"tiny-{kind}")


def write_speculators_checkpoint(path, kind: str, names: str, with_embed: bool, draft_vocab: int = 40, seed: int = 0,
                                 extra: dict | None = None, layer_extra: dict | None = None, verifier="tiny"):
    """A random EAGLE-3 drafter in the published layout, written tensor by tensor (not by our writer).

    `extra` / `layer_extra`: more top-level / `transformer_layer_config` keys
    (norm_output, fc_norm, layer_types, ...); fc_norm and norm_before_fc get
    their norms' tensors. Deterministic under a fixed seed, so the reference
    values below (computed by speculators' own code on these tensors) apply.
    """
    g = torch.Generator().manual_seed(seed)
    heads, kv, hd, inter = 4, 2, 8, 64
    layer_cfg = {"model_type": kind, "hidden_size": H, "intermediate_size": inter, "num_attention_heads": heads,
                 "num_key_value_heads": kv, "head_dim": hd, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
                 "vocab_size": VOCAB, "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu",
                 **(layer_extra or {})}
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "transformer_layer_config": layer_cfg, "draft_vocab_size": draft_vocab,
              "eagle_aux_hidden_state_layer_ids": [1, 3, 4], "norm_before_residual": False,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": verifier if verifier != "tiny" else f"tiny-{kind}",
                                                  "architectures": ["X"]}},
              **(extra or {})}
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.2
    p = names  # "midlayer" or "layers.0"
    t = {"fc.weight": rnd(H, 3 * H), f"{p}.input_layernorm.weight": 1 + rnd(H), f"{p}.hidden_norm.weight": 1 + rnd(H),
         f"{p}.post_attention_layernorm.weight": 1 + rnd(H),
         f"{p}.self_attn.q_proj.weight": rnd(heads * hd, 2 * H), f"{p}.self_attn.k_proj.weight": rnd(kv * hd, 2 * H),
         f"{p}.self_attn.v_proj.weight": rnd(kv * hd, 2 * H), f"{p}.self_attn.o_proj.weight": rnd(H, heads * hd),
         f"{p}.mlp.gate_proj.weight": rnd(inter, H), f"{p}.mlp.up_proj.weight": rnd(inter, H),
         f"{p}.mlp.down_proj.weight": rnd(H, inter), "norm.weight": 1 + rnd(H), "lm_head.weight": rnd(draft_vocab, H)}
    if kind == "qwen3":
        t[f"{p}.self_attn.q_norm.weight"] = 1 + rnd(hd)
        t[f"{p}.self_attn.k_norm.weight"] = 1 + rnd(hd)
    ids = torch.randperm(VOCAB, generator=g)[:draft_vocab].sort().values
    t["d2t"] = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    t["t2d"] = t2d
    if with_embed:
        t["embed_tokens.weight"] = rnd(VOCAB, H)
    if config.get("fc_norm"):
        t.update({f"fc_norm.{i}.weight": 1 + rnd(H) for i in range(3)})
    if config.get("norm_before_fc"):
        t["input_norm.weight"] = 1 + rnd(3 * H)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(t, str(path / "model.safetensors"))
    return t


def greedy_ar(target, prompt, n):
    return sd.generate(target, prompt, None, max_new_tokens=n).tokens


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("names", ["midlayer", "layers.0"])
@pytest.mark.parametrize("with_embed", [False, True])
def test_speculators_checkpoint_loads_drafts_and_round_trips(tmp_path, kind, names, with_embed):
    target = tiny_target(kind)
    written = write_speculators_checkpoint(tmp_path / "in", kind, names, with_embed)
    model = load_eagle3(tmp_path / "in", target)
    state = model.state_dict()
    for name, tensor in written.items():
        ours = name.replace("midlayer.", "layers.0.")
        assert torch.equal(state[ours], tensor), name
    assert (model.embed_tokens is not None) == with_embed  # else the target's embedding is shared ...
    model.to(torch.float64)  # ... and casting the drafter leaves the target alone
    assert target.embed_tokens.weight.dtype == torch.float32
    model.float()  # (float32 -> float64 -> float32 is exact)

    # Lossless in the loop, on the family's own target.
    drafter = Eagle3Drafter(model, target)
    prompt = [5, 17, 33, 8, 61, 12]
    ar = greedy_ar(target, prompt, 20)
    for k in (1, 3, 5):
        assert sd.generate(target, prompt, drafter, k=k, max_new_tokens=20).tokens == ar

    # Our writer gives back the same tensors under the speculators names.
    save_eagle3(model, tmp_path / "out", dtype=torch.float32)
    again = load_file(str(tmp_path / "out" / "model.safetensors"))
    expected = {n.replace("midlayer.", "layers.0."): t for n, t in written.items()}
    assert again.keys() == expected.keys()
    for name in expected:
        assert torch.equal(again[name], expected[name]), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["transformer_layer_config"]["model_type"] == kind
    reloaded = load_eagle3(tmp_path / "out", target)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("rope_scaling", [
    None,
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
], ids=["default", "llama3", "yarn"])
def test_rotary_embedding_matches_transformers(rope_scaling):
    """Published drafters use scaled RoPE (Llama 3.1: llama3; long-context Qwen: YaRN); cos/sin must equal
    transformers' LlamaRotaryEmbedding, YaRN's attention factor (0.1 ln 4 + 1 = 1.139 at factor 4) included:
    a bare inv_freq rotates right but leaves cos/sin 0.14 too small."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from specdec_learn.formats.speculators import Eagle3Config

    layer = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16, "rope_theta": 5e5,
             "max_position_embeddings": 1024, "intermediate_size": 128, "vocab_size": 50, "num_hidden_layers": 1}
    if rope_scaling:
        layer["rope_scaling"] = rope_scaling
    hf = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in layer.items() if k != "model_type"}))
    positions = torch.arange(0, 300, 7)
    want_cos, want_sin = hf(torch.empty(0), positions[None])
    cos, sin = Eagle3Model(Eagle3Config(layer, 50, (1, 2, 3))).rope(positions)
    torch.testing.assert_close(cos, want_cos[0])
    torch.testing.assert_close(sin, want_sin[0])


# Logits of vllm-project/speculators' own Eagle3DraftModel (src/speculators/models/eagle3/core.py, snapshot
# c05b95b3, run with transformers 5.15 and attention "sdpa") on the checkpoints `write_speculators_checkpoint`
# writes with these keys, inputs from `speculators_inputs`: {(row t, TTT step i): first 6 draft logits}.
# Its training forward at step i, row t is exactly our drafter's step i after the target states of rows 0..t
# (step i reads the true token x_{t+1+i} at position t + i).
SPECULATORS_CASES = {
    "norm_output": ("llama", {"norm_output": True}, None),
    "plain": ("llama", {}, None),
    "fc_norm": ("llama", {"fc_norm": True, "norm_output": True}, None),
    "qwen3_norm_output": ("qwen3", {"norm_output": True, "norm_before_fc": True}, None),
    "sliding": ("llama", {}, {"layer_types": ["sliding_attention"], "sliding_window": 4}),
}
SPECULATORS_LOGITS = {
    "norm_output": {
        (6, 0): [0.26056, -2.33783, -0.07064, 0.57241, -0.45348, 0.25846],
        (6, 1): [0.14637, -2.10561, 0.35819, -0.96766, -0.29635, 0.10275],
        (6, 2): [-0.33488, -1.89560, 0.15375, -1.74720, 0.32469, -0.37061],
    },
    "plain": {
        (6, 0): [0.26056, -2.33783, -0.07064, 0.57241, -0.45348, 0.25846],
        (6, 1): [-0.02073, -1.73446, 0.08564, -0.23961, 0.08597, 0.21060],
        (6, 2): [-0.27731, -1.25467, 0.06074, -0.82282, 0.67593, 0.17709],
    },
    "fc_norm": {
        (6, 0): [0.36782, -2.29127, -0.43425, 0.23342, -0.34509, 0.12579],
        (6, 1): [0.33225, -1.89599, -0.12588, -1.17336, -0.06223, -0.27498],
        (6, 2): [-0.35078, -1.59837, -0.15326, -1.86865, 0.59757, -0.78199],
    },
    "qwen3_norm_output": {
        (6, 0): [-0.35331, -2.32269, -0.83890, -0.22314, -1.42209, 0.14436],
        (6, 1): [-0.76648, -2.27746, -0.91071, -1.60563, -0.25943, -0.95056],
        (6, 2): [-0.85795, -2.65907, -1.28549, -2.74379, -0.66563, -0.91948],
    },
    # Sliding window 4: step 0 everywhere, and steps >= 1 only while t + i < 4. Past that speculators' training
    # mask counts the window from the ROW (kv > t - W) where vLLM's served layer, and this one, count it from
    # the query's POSITION (kv > t + i - W); we follow what vLLM serves.
    "sliding": {
        (6, 0): [0.13475, -1.68721, -0.05658, 0.55928, -0.07654, 0.05366],
        (2, 1): [-0.58288, -0.28643, -0.26496, -1.56936, 0.95607, 0.59331],
    },
}


def speculators_inputs():
    g = torch.Generator().manual_seed(5)
    taps = torch.randn(10, 3 * H, generator=g)  # [T, 3H] the three taps of rows 0..9
    tokens = torch.randint(3, VOCAB, (13,), generator=g)  # tokens[t]: the token that follows row t
    return taps, tokens


@pytest.mark.parametrize("case", list(SPECULATORS_CASES))
def test_drafts_equal_speculators_own_forward(tmp_path, case):
    """norm_output (speculators' training default since Eagle 3.1: steps >= 1 feed back the NORMED state),
    fc_norm (one norm per tap), norm_before_fc, a qwen3 draft layer and a sliding-window layer give the
    logits speculators' Eagle3DraftModel gives (values above); a loader that ignored norm_output was off by
    0.5-3.4 at steps >= 1, one that ignored the window by 0.3 at step 0."""
    from specdec_learn.drafters.eagle3 import KVCache

    kind, extra, layer_extra = SPECULATORS_CASES[case]
    write_speculators_checkpoint(tmp_path, kind, "layers.0", True, extra=extra, layer_extra=layer_extra)
    model = load_eagle3(tmp_path)
    drafter = Eagle3Drafter(model)
    taps, tokens = speculators_inputs()
    for (t, step), want in SPECULATORS_LOGITS[case].items():
        drafter.cache = KVCache()
        with torch.no_grad():
            x = drafter._step(model.fuse(taps[: t + 1]), tokens[: t + 1].tolist(), 0)[-1:]  # target rows 0..t
            for i in range(step):
                x = drafter._step(model.feedback(x), [int(tokens[t + 1 + i])], t + 1 + i)
            got = model.logits(x)[0, :6]
        torch.testing.assert_close(got, torch.tensor(want), atol=2e-4, rtol=0, msg=f"{case}: row {t}, step {step}")


def test_keys_that_change_the_forward_are_honoured_in_the_round_trip_or_refused(tmp_path):
    target = tiny_target("llama")
    written = write_speculators_checkpoint(tmp_path / "in", "llama", "layers.0", False,
                                           extra={"norm_output": True, "fc_norm": True},
                                           layer_extra={"layer_types": ["sliding_attention"], "sliding_window": 3})
    model = load_eagle3(tmp_path / "in", target)
    save_eagle3(model, tmp_path / "out", dtype=torch.float32)
    again = load_eagle3(tmp_path / "out", target)
    assert again.config.norm_output and again.config.fc_norm and again.layers[0].window == 3
    assert torch.equal(again.fc_norm[2].weight, written["fc_norm.2.weight"])
    prompt = list(range(5, 17))  # past the window of 3
    ar = greedy_ar(target, prompt, 16)
    assert sd.generate(target, prompt, Eagle3Drafter(again, target), k=4, max_new_tokens=16).tokens == ar

    refusals = {
        "logit_scale": ({"logit_scale": 0.5}, None),
        "partial_rotary_factor": ({}, {"partial_rotary_factor": 0.5}),
        "one or the other": ({"norm_before_fc": True, "fc_norm": True}, None),
        "chunked_attention": ({}, {"layer_types": ["chunked_attention"]}),
    }
    for i, (message, (extra, layer_extra)) in enumerate(refusals.items()):
        write_speculators_checkpoint(tmp_path / f"r{i}", "llama", "layers.0", False, extra=extra,
                                     layer_extra=layer_extra)
        with pytest.raises(ValueError, match=message):
            load_eagle3(tmp_path / f"r{i}", target)


def test_mismatched_target_is_refused_naming_both_numbers(tmp_path):
    write_speculators_checkpoint(tmp_path / "c", "llama", "layers.0", False)
    wide = Target(tiny_llama(VOCAB, seed=1, hidden=48, layers=LAYERS), None)
    with pytest.raises(ValueError, match=r"hidden size 32 .* 48"):
        load_eagle3(tmp_path / "c", wide)
    other_vocab = Target(tiny_llama(VOCAB + 4, seed=1, hidden=H, layers=LAYERS), None)
    with pytest.raises(ValueError, match=rf"{VOCAB} tokens .* {VOCAB + 4}"):
        load_eagle3(tmp_path / "c", other_vocab)
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    config["speculators_model_type"] = "eagle"
    (tmp_path / "c" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="expected 'eagle3'"):
        load_eagle3(tmp_path / "c")


def test_drafting_step_by_step_equals_the_training_unroll():
    """Inference (KV cache, positions, own-state feedback) and the TTT unroll compute the same thing."""
    from specdec_learn.train.examples import Example
    from specdec_learn.train.features import capture
    from specdec_learn.train.eagle3 import ttt_forward

    target = tiny_target("llama")
    torch.manual_seed(0)
    model = new_eagle3(target, draft_ids=list(range(0, VOCAB, 2)), taps=(1, 3, 4)).float()
    ids = torch.randint(3, VOCAB, (14,)).tolist()
    example = Example("x", ids, [False] * 4 + [True] * 10)
    feats = capture(target, [example], model.config.aux_layer_ids, progress=False, dtype=torch.float32)
    steps = ttt_forward(model, target.embed_tokens, feats, steps=3)  # each [T, V_d]

    drafter = Eagle3Drafter(model, target)
    t = 6  # row t: target states 0..t, then drafts x_{t+2}, x_{t+3}, x_{t+4} from true tokens
    state, out = target.prefill(ids[: t + 2], drafter.taps)
    drafter.start(target, state, out.hidden)
    g = model.fuse(torch.cat(drafter.pending, dim=-1))
    x = drafter._step(g, ids[1 : t + 2], 0)[-1:]
    for i in range(3):
        torch.testing.assert_close(model.logits(x)[0], steps[i][t].detach(), atol=1e-4, rtol=1e-4)
        x = drafter._step(x, [ids[t + 2 + i]], t + 1 + i)


@pytest.mark.parametrize("asked", [None, True, False])
def test_bf16_autocast_follows_the_hardware_unless_asked(asked):
    from specdec_learn.train.eagle3 import TrainConfig, autocast, bf16_is_native

    cpu = torch.device("cpu")
    with autocast(TrainConfig(autocast_bf16=asked), cpu):
        assert torch.is_autocast_enabled("cpu") == (bf16_is_native(cpu) if asked is None else asked)
    flags = open("/proc/cpuinfo").read() if Path("/proc/cpuinfo").exists() else ""
    capped = isa_cap() in NO_BF16_ISAS  # oneDNN kept below bf16
    assert bf16_is_native(cpu) == (("avx512_bf16" in flags or "amx_bf16" in flags) and not capped)
    assert bf16_is_native(torch.device("cuda"))  # a GPU: always (no GPU needed to ask)


def test_twenty_training_steps_lower_the_loss(tmp_path):
    from specdec_learn.train.examples import Example
    from specdec_learn.train.features import capture
    from specdec_learn.train.eagle3 import TrainConfig, choose_draft_vocab, fit

    target = tiny_target("llama")
    with torch.no_grad():  # a confident target (a random one is near-uniform: nothing to learn)
        target.lm_head.weight.mul_(30)
    g = torch.Generator().manual_seed(0)
    # Learnable text: each example repeats a short random pattern.
    examples = []
    for i in range(12):
        pattern = torch.randint(3, VOCAB, (4,), generator=g).tolist()
        ids = [1] + pattern * 8
        examples.append(Example(f"e{i}", ids, [False] * 5 + [True] * (len(ids) - 5)))
    draft_ids = choose_draft_vocab(examples, 48, VOCAB, always=[2])
    assert len(draft_ids) == 48 and 2 in draft_ids.tolist()
    model = new_eagle3(target, draft_ids=draft_ids, taps=(1, 3, 4)).float()
    feats = capture(target, examples, model.config.aux_layer_ids, progress=False)
    cfg = TrainConfig(steps=20, tokens_per_batch=200, lr=3e-3, eval_every=10**9)
    run = fit(target, model, feats, feats[:3], cfg, tmp_path, log=lambda *_: None)
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # the work dir holds the whole history
    losses = [h["loss"] for h in state["history"] if "loss" in h]
    assert run.steps == 20 and len(losses) == 20
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4
    # Resuming continues from the saved step instead of starting over.
    cfg.steps = 22
    assert fit(target, model, feats, [], cfg, tmp_path, log=lambda *_: None).steps == 22


@pytest.mark.parametrize("share,tokens", [(1.0, 5 * 80), (0.0, 5 * 100)])
def test_a_templated_share_packs_each_batch_from_the_sources_it_asks_for(tmp_path, share, tokens):
    from specdec_learn.train.examples import Example
    from specdec_learn.train.features import capture
    from specdec_learn.train.sources import source_weights
    from specdec_learn.train.eagle3 import TrainConfig, fit

    target = tiny_target("llama")
    templated = [Example(f"mbpp/{i}", list(range(3, 43)), [False] * 5 + [True] * 35) for i in range(4)]
    magpie = [Example(f"magpie/{i:016x}", list(range(50, 70)), [False] * 5 + [True] * 15) for i in range(4)]
    examples = templated + magpie
    model = new_eagle3(target, draft_ids=torch.arange(VOCAB), taps=(1, 3, 4)).float()
    feats = capture(target, examples, model.config.aux_layer_ids, progress=False)
    cfg = TrainConfig(steps=5, tokens_per_batch=100, eval_every=10**9)
    run = fit(target, model, feats, [], cfg, tmp_path, log=lambda *_: None,
              weights=source_weights(examples, share))
    # 100 rows hold two 40-token templated answers or five 20-token Magpie ones: each batch came from one source
    assert run.tokens == tokens


@pytest.mark.slow
def test_shipped_drafter_is_small_and_loads(target):
    from specdec_learn.checkpoints import shipped
    from specdec_learn.zoo import make_drafter

    path = shipped("eagle3", target.name)
    size_mb = sum(f.stat().st_size for f in path.iterdir()) / 1e6
    assert size_mb < 25, f"the shipped EAGLE-3 drafter takes {size_mb:.1f} MB"
    assert (path / "README.md").is_file()
    drafter = make_drafter("eagle3", target)
    assert drafter.taps == (2, 15, 27)


def test_sampled_drafts_put_mass_only_on_the_draft_vocabulary(tmp_path):
    from specdec_learn.sampling import Sampling

    target = tiny_target("llama")
    write_speculators_checkpoint(tmp_path, "llama", "layers.0", False)
    drafter = Eagle3Drafter(load_eagle3(tmp_path, target), target)
    prompt = [5, 17, 33, 8]
    state, out = target.prefill(prompt, drafter.taps)
    drafter.start(target, state, out.hidden)
    proposal = drafter.propose(state, 3, Sampling(temperature=0.8), torch.Generator().manual_seed(0))
    outside = ~drafter.model.t2d
    assert proposal.q.shape == (3, VOCAB)
    assert torch.allclose(proposal.q.sum(-1), torch.ones(3)) and proposal.q[:, outside].sum() == 0
    assert all(drafter.model.t2d[t] for t in proposal.tokens)


def test_sampled_decoding_drafts_in_the_draft_vocabulary_and_emits_outside_it(tmp_path):
    """The whole loop under sampling: every draft is a draft-vocabulary token, while the tokens the target adds
    (the residual after a rejection, the bonus after a full block) come from its whole vocabulary."""
    from specdec_learn.sampling import Sampling

    target = tiny_target("llama")
    write_speculators_checkpoint(tmp_path, "llama", "layers.0", False)  # 40 of the 96 tokens
    drafter = Eagle3Drafter(load_eagle3(tmp_path, target), target)
    t2d = drafter.model.t2d
    drafted, emitted = [], []
    for seed in range(3):
        out = sd.generate(target, [5, 17, 33, 8], drafter, k=3, max_new_tokens=12, sampling=Sampling(temperature=0.8),
                          seed=seed, keep_trace=True)
        drafted += [t for r in out.trace for t in r.drafts]
        emitted += out.tokens
    assert drafted and all(t2d[t] for t in drafted)
    assert not all(t2d[t] for t in emitted)
