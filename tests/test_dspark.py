"""DSpark: the Markov head and the survival gate on hand-made tensors, the cut Markov head,
anchor-as-first-prediction (k <= B), and both published formats.

Lossless decoding with every head on and off: test_lossless_tiny.py; sampled decoding reproduces the
target's distribution: test_sampling_e2e.py; the shipped drafter: test_shipped.py."""

import json

import pytest
import torch
from conftest import tiny_target
from transformers import Qwen3Config

import specdec_learn as sd
from specdec_learn.drafters.dspark import (
    DSparkDrafter,
    DSparkModel,
    MarkovHead,
    dspark_config,
    gated_length,
    load_dspark,
    markov_draft,
    save_dspark,
)


# -- the Markov head and the gate, by hand --------------------------------------------


def hand_markov() -> MarkovHead:
    """V = 4, r = 1: W1[t] = t, W2 = [0, 0, 0, 10]: after token 2 or 3, token 3 gets +20 or +30."""
    head = MarkovHead(vocab_size=4, rank=1)
    with torch.no_grad():
        head.markov_w1.weight.copy_(torch.tensor([[0.0], [1.0], [2.0], [3.0]]))
        head.markov_w2.weight.copy_(torch.tensor([[0.0], [0.0], [0.0], [10.0]]))
    return head


def test_markov_bias_is_w2_times_w1_of_the_previous_token():
    head = hand_markov()
    torch.testing.assert_close(head(torch.tensor(2)), torch.tensor([0.0, 0.0, 0.0, 20.0]))
    torch.testing.assert_close(head(torch.tensor([0, 1])), torch.tensor([[0.0] * 4, [0.0, 0.0, 0.0, 10.0]]))


def test_markov_bias_follows_the_tokens_chosen_left_to_right():
    """Slot j's bias comes from the token PICKED at slot j-1, not from the base argmax."""
    base = torch.tensor([
        [0.0, 0.0, 5.0, 0.0],  # slot 0: prev = anchor 0 (no bias) -> 2
        [0.0, 15.0, 0.0, 0.0],  # slot 1: prev = 2 -> token 3 gets +20 -> 3 (base alone says 1)
        [0.0, 25.0, 0.0, 0.0],  # slot 2: prev = 3 -> +30 -> 3 (base alone says 1)
    ])
    tokens, rows, prevs = markov_draft(base, anchor=0, markov=hand_markov(), pick=lambda r: int(r.argmax()))
    assert tokens == [2, 3, 3] and prevs == [0, 2, 3]
    torch.testing.assert_close(rows[1], torch.tensor([0.0, 15.0, 0.0, 20.0]))
    plain, _, _ = markov_draft(base, anchor=0, markov=None, pick=lambda r: int(r.argmax()))
    assert plain == [2, 1, 1]


def test_gate_keeps_the_prefix_whose_survival_stays_above_the_threshold():
    c = torch.tensor([0.75, 0.5, 0.5, 1.0])  # survival: 0.75, 0.375, 0.1875, 0.1875 (exact in binary)
    assert gated_length(c, 0.5) == 1
    assert gated_length(c, 0.375) == 2  # at the threshold still counts
    assert gated_length(c, 0.3) == 2
    assert gated_length(c, 0.1) == 4
    assert gated_length(c, 0.8) == 0
    assert gated_length(torch.tensor([0.2, 1.0]), 0.5) == 0  # a later sure slot cannot revive the prefix


# -- a draft vocabulary, the block's limit, trees ---------------------------------------------


@pytest.fixture(scope="module")
def random_dspark(target):
    torch.manual_seed(0)
    return DSparkModel(dspark_config(target, num_layers=1, block_size=7, markov_rank=16))


def test_a_cut_markov_bias_is_w2_on_the_draft_vocabulary_and_minus_inf_elsewhere(random_dspark):
    """Outside the draft vocabulary the base logits are -inf already: the cut reads V_d rows of W2."""
    drafter = DSparkDrafter(random_dspark, markov=True)
    assert drafter.markov_bias() is drafter.markov  # no draft vocabulary: the whole head
    ids = [3, 7, 8, 20, 49_151]
    drafter.reduce_vocabulary(ids)
    cut, prev = drafter.markov_bias(), torch.tensor([1, 20, 49_151])
    with torch.no_grad():
        full, reduced = drafter.markov(prev), cut(prev)  # [3, V] each
    torch.testing.assert_close(reduced[:, ids], full[:, ids])
    outside = torch.ones(full.shape[-1], dtype=torch.bool)
    outside[ids] = False
    assert (reduced[:, outside] == float("-inf")).all() and cut(torch.tensor(7)).shape == full.shape[-1:]
    assert cut[1].weight.shape == (5, 16) and drafter.markov_bias() is cut  # built once
    drafter.reduce_vocabulary(ids[:2])
    assert drafter.markov_bias()[1].weight.shape == (2, 16)  # a new vocabulary, a new cut


def test_with_a_draft_vocabulary_the_cut_markov_head_drafts_what_the_full_one_does():
    """The same rounds, greedy and sampled, whether the Markov bias is computed over V or over V_d."""
    target = tiny_target(layers=4)
    torch.manual_seed(0)
    model = DSparkModel(dspark_config(target, num_layers=1, block_size=7, markov_rank=16))
    ids = sorted({*range(0, target.vocab_size, 7), *target.eos_ids})
    cut, uncut = DSparkDrafter(model, markov=True), DSparkDrafter(model, markov=True)
    cut.reduce_vocabulary(ids)
    uncut.reduce_vocabulary(ids)
    uncut.markov_bias = lambda: uncut.markov  # the whole W2, over the same cut LM head
    prompt = [5, 9, 14, 3, 27, 8, 5, 9, 14, 3]
    for sampling in (sd.Sampling(), sd.Sampling(temperature=0.8)):
        runs = [sd.generate(target, prompt, d, k=5, max_new_tokens=16, sampling=sampling, seed=3,
                            keep_trace=True) for d in (cut, uncut)]
        drafts = [[r.drafts for r in run.trace] for run in runs]
        assert drafts[0] == drafts[1] and runs[0].tokens == runs[1].tokens and runs[0].stats.num_drafts > 0
    assert cut.markov_bias()[1].weight.shape[0] == len(ids)  # the cut was used


def test_the_anchor_slot_is_a_draft_so_k_can_reach_the_block_size(target, random_dspark):
    drafter = DSparkDrafter(random_dspark, markov=False)
    assert drafter.max_k == 7
    sd.generate(target, "Hi", drafter, k=7, max_new_tokens=4)
    with pytest.raises(ValueError, match="block size 7"):
        sd.generate(target, "Hi", drafter, k=8, max_new_tokens=4)


def test_a_tree_runs_the_lm_head_once_a_round_not_once_per_node(target, random_dspark, monkeypatch):
    """Every slot's logits come from one head pass over the block; a node adds only its Markov bias."""
    drafter = DSparkDrafter(random_dspark, markov=True)
    head, shapes = drafter.logits, []
    monkeypatch.setattr(drafter, "logits", lambda hidden: shapes.append(tuple(hidden.shape)) or head(hidden))
    out = sd.generate(target, "Name three fruits.", drafter, tree=sd.TreeSpec(nodes=8, depth=3, branch=2),
                      max_new_tokens=8)
    assert out.stats.num_drafts > 0 and len(shapes) == out.stats.num_drafts
    assert max(s[0] for s in shapes) == 3  # [depth, H]: every slot at once (the last rounds are shallower)


def test_heads_that_are_missing_are_refused(target):
    model = DSparkModel(dspark_config(target, num_layers=1, block_size=4, markov_rank=0, confidence=False))
    with pytest.raises(ValueError, match="no Markov head"):
        DSparkDrafter(model, markov=True)
    with pytest.raises(ValueError, match="confidence head"):
        DSparkDrafter(model, markov=False, gate=0.5)


# -- the DeepSpec and speculators formats ---------------------------------------------------


def tiny_dspark(own_embeddings: bool) -> DSparkModel:
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.num_target_layers = 5, 7, [-1, 1, 2], 4
    cfg.markov_rank, cfg.markov_head_type, cfg.num_anchors = 4, "vanilla", 16
    cfg.enable_confidence_head, cfg.confidence_head_with_markov = True, True
    torch.manual_seed(2)
    model = DSparkModel(cfg, target_hidden_size=32, own_embeddings=own_embeddings)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


@pytest.mark.parametrize("fmt,own", [("deepspec", True), ("speculators", False)])
def test_published_formats_round_trip(tmp_path, fmt, own):
    model = tiny_dspark(own)
    save_dspark(model, tmp_path, format=fmt, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if fmt == "deepspec":
        assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["target_layer_ids"] == [-1, 1, 2]
    else:
        assert cfg["speculators_model_type"] == "dspark" and cfg["aux_hidden_state_layer_ids"] == [0, 2, 3]
        assert cfg["sample_from_anchor"] is True
    loaded = load_dspark(tmp_path)
    assert loaded.config.target_layer_ids == [-1, 1, 2] and loaded.block_size == 5 and loaded.config.markov_rank == 4
    assert (loaded.embed_tokens is not None) == own
    state, again = model.state_dict(), loaded.state_dict()
    assert set(state) == set(again)
    for name in state:
        torch.testing.assert_close(again[name], state[name])


def test_taps_map_minus_one_to_the_embedding_output(target):
    cfg = dspark_config(target, target_layer_ids=[-1, 14, 28])
    assert DSparkDrafter(DSparkModel(cfg), markov=False).taps == (0, 15, 29)


def test_deepspec_format_needs_embeddings_from_somewhere(tmp_path):
    with pytest.raises(ValueError, match="pass target="):
        save_dspark(tiny_dspark(False), tmp_path, format="deepspec")


def test_gated_or_rnn_markov_heads_are_refused(tmp_path):
    save_dspark(tiny_dspark(True), tmp_path, format="deepspec", dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["markov_head_type"] = "gated"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="only 'vanilla'"):
        load_dspark(tmp_path)


# -- the speculators format in both directions (vllm-project/speculators, snapshot c05b95b3) ----------------


def speculators_saved(tmp_path, model: DSparkModel):
    """A folder laid out as speculators' own DSparkDraftModel.save_pretrained lays it out (observed by running
    it: src/speculators/model.py DraftVocabMixin keeps frozen copies of the verifier's embed_tokens and lm_head
    and saves them; config keys as it writes them), with random stand-ins for the verifier's two tensors."""
    from safetensors.torch import load_file, save_file

    save_dspark(model, tmp_path, format="speculators", dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(architectures=["DSparkDraftModel"], auto_map={"": "config.DSparkSpeculatorConfig"},
               speculators_version="0.5.0.dev0", sliding_window_non_causal=False, dtype="float32",
               tie_word_embeddings=False)
    cfg["speculators_config"]["proposal_methods"][0].update(accept_tolerance=0.0, verifier_accept_k=1)
    cfg["speculators_config"]["verifier"] = {"architectures": [], "name_or_path": "Qwen/Qwen3-8B"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(3)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["embed_tokens.weight"] = torch.randn(64, 32, generator=g)
    tensors["lm_head.weight"] = torch.randn(64, 32, generator=g)
    save_file(tensors, tmp_path / "model.safetensors")
    return tensors


def test_a_checkpoint_saved_by_speculators_loads_with_its_embedding_and_head(tmp_path):
    """speculators stores embed_tokens / lm_head (the verifier's, copied); they were refused as unexpected
    tensors. They load as the drafter's own, and drafting uses them in place of the target's."""
    model = tiny_dspark(False)
    tensors = speculators_saved(tmp_path, model)
    loaded = load_dspark(tmp_path)
    assert torch.equal(loaded.embed_tokens.weight, tensors["embed_tokens.weight"])
    assert torch.equal(loaded.lm_head.weight, tensors["lm_head.weight"])
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    drafter = DSparkDrafter(loaded, markov=False)
    hidden = torch.randn(3, 32)
    torch.testing.assert_close(drafter.logits(hidden), hidden @ tensors["lm_head.weight"].T)
    ids = torch.tensor([1, 5])
    torch.testing.assert_close(drafter.embed(ids), tensors["embed_tokens.weight"][ids])


def test_our_speculators_checkpoint_names_its_verifier(tmp_path, target):
    """speculators' DSparkSpeculatorConfig (models/dspark/config.py via config.py SpeculatorsConfig) requires
    speculators_config.verifier, and vLLM's speculators reader (transformers_utils/configs/speculators/base.py)
    requires verifier.name_or_path: our folders lacked it, so both refused them. Checked by running
    speculators' DSparkDraftModel.from_pretrained on such a folder: it loads, and fills embed_tokens /
    lm_head from the named verifier (see the shipped README for a caveat under transformers 5)."""
    model = DSparkModel(dspark_config(target, num_layers=1, block_size=4, markov_rank=4))
    save_dspark(model, tmp_path / "a", target=target, dtype=torch.float32)
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"] == {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                     "architectures": ["LlamaForCausalLM"]}
    from safetensors.torch import load_file

    assert not {"embed_tokens.weight", "lm_head.weight"} & set(load_file(tmp_path / "a" / "model.safetensors"))
    save_dspark(model, tmp_path / "b", target=target, dtype=torch.float32, with_verifier_tensors=True)
    full = load_dspark(tmp_path / "b")  # speculators' own layout, written on request
    assert torch.equal(full.lm_head.weight, target.lm_head.weight) and torch.equal(
        full.embed_tokens.weight, target.embed_tokens.weight)

    from specdec_learn.checkpoints import shipped

    shipped_cfg = json.loads((shipped("dspark", target.name) / "config.json").read_text())
    assert shipped_cfg["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_speculators_keys_take_speculators_defaults_and_the_non_causal_flag_is_honoured(tmp_path):
    """A speculators config that leaves a head field out means speculators' pydantic default
    (markov_rank 256, both confidence flags true, block_size 8), not DeepSpec's; sliding_window_non_causal
    (speculators' DFlash field) makes sliding layers see their whole block, and is written back."""
    model = tiny_dspark(False)
    save_dspark(model, tmp_path, format="speculators", dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    from specdec_learn.formats import speculators

    bare = {k: v for k, v in cfg.items() if k not in ("markov_rank", "enable_confidence_head",
                                                    "confidence_head_with_markov", "block_size")}
    got, _ = speculators.read_dspark(tmp_path, bare)
    assert (got.markov_rank, got.enable_confidence_head, got.confidence_head_with_markov, got.block_size) == (
        256, True, True, 8)
    layer = dict(cfg["transformer_layer_config"], layer_types=["sliding_attention"], use_sliding_window=True,
                 sliding_window=4)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "transformer_layer_config": layer,
                                                      "sliding_window_non_causal": True}))
    loaded = load_dspark(tmp_path)
    assert (loaded.layers[0].self_attn.window, loaded.layers[0].self_attn.causal) == (4, False)
    save_dspark(loaded, tmp_path / "again", dtype=torch.float32)
    again = load_dspark(tmp_path / "again")
    assert (again.layers[0].self_attn.window, again.layers[0].self_attn.causal) == (4, False)
