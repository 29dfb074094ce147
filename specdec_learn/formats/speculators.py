"""The speculators format (vllm-project/speculators): what vLLM's `eagle3` and `dspark` methods read.

A speculators checkpoint is a folder with ``config.json`` and
``model.safetensors``. The config names the algorithm in
``speculators_model_type``, carries the draft layers' own transformer config
under ``transformer_layer_config``, the algorithm's fields beside it, and a
``speculators_config`` (proposal methods and the ``verifier``: the target's
hub id and architectures; vLLM and speculators' ``from_pretrained`` both
require the key, speculators loads the verifier's embedding and LM head from
it when the checkpoint has none).

EAGLE-3 (``speculators_model_type: "eagle3"``; checked against
vllm-project/speculators ``src/speculators/models/eagle3/{config,core}.py``
and vLLM's ``model_executor/models/llama_eagle3.py``):

* config keys honoured: ``draft_vocab_size``, ``target_hidden_size``,
  ``eagle_aux_hidden_state_layer_ids`` (the taps: the residual stream ENTERING
  those target layers), ``norm_before_residual``, ``norm_before_fc`` (one norm
  over the concatenated taps), ``fc_norm`` (one norm per tap, Eagle 3.1),
  ``norm_output`` (steps >= 1 feed back the NORMED state: speculators' training
  default since Eagle 3.1); in ``transformer_layer_config``: the layer's shape,
  ``hidden_act``, biases, ``rope_theta`` / rope scaling (any type transformers
  implements, its attention factor included), ``layer_types`` +
  ``sliding_window`` (speculators trains every draft layer with a 2048 window
  by default).
* keys without effect on the forward: ``embed_requires_grad`` (training),
  ``speculators_config``, ``speculators_version``, dtypes, versions.
* refused with a message: ``logit_scale`` != 1, ``partial_rotary_factor`` < 1,
  ``norm_before_fc`` together with ``fc_norm``, layer types other than full /
  sliding attention, more than one draft layer.
* tensors: ``fc``, ``layers.0.*`` (the original EAGLE code names it
  ``midlayer.*``), ``norm``, ``lm_head`` over the draft vocabulary, ``d2t``
  (target id = draft id + d2t[draft id]) and ``t2d`` (a boolean mask over
  the target vocabulary), optionally ``input_norm`` / ``fc_norm.{i}`` and
  ``embed_tokens`` (else the target's embedding is shared).

One default differs between the two readers: a config WITHOUT
``norm_before_residual`` is read as False by speculators (its pydantic
default, used here) and as True by vLLM; every writer in speculators and here
writes the key.

DSpark (``speculators_model_type: "dspark"``; vllm-project/speculators
``src/speculators/models/{dflash,dspark}/``): the DFlash backbone's tensors
and DeepSpec's head fields (see deepspec.py), the taps as
``aux_hidden_state_layer_ids`` (already our tap numbers: DSpark id + 1).
Honoured: the head fields (a missing one takes speculators' pydantic default,
``DSPARK_DEFAULTS``), the layer config's ``layer_types`` / ``sliding_window``
(causal windows, vLLM's rules: zlab.layer_attention) and
``sliding_window_non_causal`` (speculators' flag for sliding layers that see
their whole block; vLLM's DSpark reader ignores it). Refused: a reduced
``draft_vocab_size``, ``sample_from_anchor: false``, a gated / rnn Markov head.
speculators' own ``save_pretrained`` also stores the verifier's
``embed_tokens`` and ``lm_head`` (frozen copies): they are read when present.
We write neither by default (57 MB each for SmolLM2) and name the verifier
instead, from which speculators' ``from_pretrained`` is meant to load both
(under transformers 5 it does so only by chance: the shipped README says why
and what to do). One more difference: speculators' training mask counts a
sliding window from the block's anchor, vLLM from each query's position; we
follow vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .deepspec import HEAD_KEYS, head_fields, read_heads
from .io import full_attention_head_dim, full_attention_rope, qwen3_config, read_config, read_weights, write_folder

LAYER_TYPES = ("llama", "qwen3")  # the draft layer types our EAGLE-3 network implements


# --- EAGLE-3 ----------------------------------------------------------------------------


@dataclass
class Eagle3Config:
    """The fields of a speculators EAGLE-3 `config.json` that change the network."""

    layer_config: dict  # `transformer_layer_config`: a llama / qwen3 config for the draft layer
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]  # `eagle_aux_hidden_state_layer_ids`
    target_hidden_size: int | None = None  # None = the draft's hidden size
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False  # one RMSNorm per tap before fc (Eagle 3.1)
    norm_output: bool = False  # steps >= 1 feed back norm(x) instead of x (Eagle 3.1)
    extra: dict = field(default_factory=dict)  # other top-level keys, written back unchanged

    @property
    def hidden_size(self) -> int:
        return self.layer_config["hidden_size"]

    @property
    def vocab_size(self) -> int:  # the TARGET's vocabulary
        return self.layer_config["vocab_size"]

    @property
    def tap_size(self) -> int:  # the width of one tap (the target's hidden size)
        return self.target_hidden_size or self.hidden_size

    @property
    def fc_in(self) -> int:
        return len(self.aux_layer_ids) * self.tap_size


_EAGLE3_KEYS = {"speculators_model_type", "transformer_layer_config", "draft_vocab_size", "target_hidden_size",
                "eagle_aux_hidden_state_layer_ids", "norm_before_residual", "norm_before_fc", "fc_norm",
                "norm_output"}
ATTENTION_TYPES = ("full_attention", "sliding_attention")


def layer_hf_config(layer: dict):
    """transformers' config object for a ``transformer_layer_config`` (its ``model_type``'s class)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(layer["model_type"], **{k: v for k, v in layer.items() if k != "model_type"})


def eagle3_layer_attention(layer: dict) -> tuple[str, int | None]:
    """(layer type, window) of the one draft layer, as transformers' config class resolves them.

    The config class is the one vLLM builds too, so its rules apply: Qwen3
    keeps ``sliding_window`` only with ``use_sliding_window``, and a sliding
    layer without a window attends to everything (vLLM's ``LlamaAttention``).
    """
    hf = layer_hf_config(layer)
    kind = (getattr(hf, "layer_types", None) or ["full_attention"])[0]
    if kind not in ATTENTION_TYPES:
        raise ValueError(f"Draft layer type {kind!r} is not implemented here (only {', '.join(ATTENTION_TYPES)}).")
    return kind, (getattr(hf, "sliding_window", None) if kind == "sliding_attention" else None)


def eagle3_config(d: dict) -> Eagle3Config:
    """A speculators EAGLE-3 config.json dict -> Eagle3Config (refusing what the network cannot run)."""
    if d.get("speculators_model_type") != "eagle3":
        raise ValueError(
            f"Not an EAGLE-3 speculators config: speculators_model_type is "
            f"{d.get('speculators_model_type')!r}, expected 'eagle3'."
        )
    layer = dict(d["transformer_layer_config"])
    layer.setdefault("model_type", "llama")
    if layer["model_type"] not in LAYER_TYPES:
        raise ValueError(f"Draft layer type {layer['model_type']!r} is not supported; known: {', '.join(LAYER_TYPES)}.")
    if layer.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"This loader reads one-layer EAGLE-3 drafters; the config has {layer['num_hidden_layers']}.")
    refused = []
    if float(d.get("logit_scale", layer.get("logit_scale", 1.0))) != 1.0:
        refused.append("logit_scale != 1 (the draft logits would be scaled)")
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    if float(layer.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))) != 1.0:
        refused.append("partial_rotary_factor < 1 (this layer rotates whole heads, as vLLM's and speculators' do)")
    if d.get("norm_before_fc") and d.get("fc_norm"):
        refused.append("norm_before_fc together with fc_norm (speculators allows one or the other)")
    if refused:
        raise ValueError("This EAGLE-3 config asks for what the network here does not implement: "
                         + "; ".join(refused) + ".")
    eagle3_layer_attention(layer)  # refuses unknown layer types now, not at the first draft
    return Eagle3Config(
        layer_config=layer,
        draft_vocab_size=d.get("draft_vocab_size", 32000),
        aux_layer_ids=tuple(d.get("eagle_aux_hidden_state_layer_ids") or ()),
        target_hidden_size=d.get("target_hidden_size"),
        norm_before_residual=bool(d.get("norm_before_residual", False)),
        norm_before_fc=bool(d.get("norm_before_fc", False)),
        fc_norm=bool(d.get("fc_norm", False)),
        norm_output=bool(d.get("norm_output", False)),
        extra={k: v for k, v in d.items() if k not in _EAGLE3_KEYS},
    )


def eagle3_json(cfg: Eagle3Config) -> dict:
    """Eagle3Config -> the config.json dict speculators and vLLM read."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        **{k: v for k, v in cfg.extra.items() if k != "architectures"},
        "transformer_layer_config": cfg.layer_config,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
    }


def eagle3_config_for(target, draft_vocab_size: int, taps: tuple[int, ...], intermediate_size: int | None = None
                      ) -> Eagle3Config:
    """The config of a fresh one-layer drafter for `target`: its layer shaped like the target's.

    A target whose RoPE turns only part of each head (Gemma 4's full-attention layers) gives its drafter
    plain RoPE at the same base: the layer here, as vLLM's and speculators', turns whole heads.
    """
    c = target.config
    rope = full_attention_rope(c)
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        rope = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    layer = {
        "model_type": "qwen3" if c.model_type.startswith("qwen3") else "llama",
        "hidden_size": c.hidden_size, "intermediate_size": intermediate_size or c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": full_attention_head_dim(c),
        "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "hidden_act": getattr(c, "hidden_act", "silu"),
        "max_position_embeddings": c.max_position_embeddings, "vocab_size": target.vocab_size,
        "rope_theta": rope["rope_theta"], "attention_bias": getattr(c, "attention_bias", False),
        "mlp_bias": getattr(c, "mlp_bias", False), "tie_word_embeddings": False,
    }
    if rope["rope_type"] != "default":  # the old-style key, which speculators and vLLM both read
        layer["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return Eagle3Config(layer, draft_vocab_size, tuple(taps))


def read_eagle3(path) -> tuple[Eagle3Config, dict[str, torch.Tensor]]:
    """(config, tensors under our names: ``midlayer.*`` read as ``layers.0.*``) of an EAGLE-3 folder."""
    cfg = eagle3_config(read_config(path, "a speculators-format EAGLE-3"))
    tensors = read_weights(path)
    tensors = {("layers.0." + k.removeprefix("midlayer.")) if k.startswith("midlayer.") else k: v
               for k, v in tensors.items()}
    if "d2t" not in tensors and cfg.draft_vocab_size != cfg.vocab_size:
        raise ValueError(f"{path}: the draft vocabulary ({cfg.draft_vocab_size}) is reduced but there is no d2t tensor.")
    check_vocab_map(tensors, cfg, path)
    return cfg, tensors


def check_vocab_map(tensors: dict[str, torch.Tensor], cfg: Eagle3Config, path) -> None:
    """d2t and t2d must describe one map from the draft vocabulary into the target's, or drafting reads garbage."""
    V, Vd = cfg.vocab_size, cfg.draft_vocab_size
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is not None:
        if d2t.dtype.is_floating_point or d2t.shape != (Vd,):
            raise ValueError(f"{path}: d2t must be an integer tensor of shape ({Vd},), got {d2t.dtype} "
                             f"{tuple(d2t.shape)}: the checkpoint is damaged.")
        target_ids = torch.arange(Vd) + d2t.long()
        if target_ids.min() < 0 or target_ids.max() >= V or target_ids.unique().numel() != Vd:
            raise ValueError(f"{path}: d2t maps draft ids outside the target vocabulary 0..{V - 1} (or two onto one): "
                             "the checkpoint is damaged; fetch it again.")
    if t2d is not None:
        if t2d.shape != (V,) or int(t2d.bool().sum()) != Vd:
            raise ValueError(f"{path}: t2d must mark exactly {Vd} of the {V} target ids, got shape "
                             f"{tuple(t2d.shape)} with {int(t2d.bool().sum())} marked: the checkpoint is damaged.")
        if d2t is not None and not bool(t2d.bool()[target_ids].all()):
            raise ValueError(f"{path}: d2t and t2d disagree on which target ids are in the draft vocabulary: "
                             "the checkpoint is damaged.")


def check_target(cfg: Eagle3Config, target) -> None:
    """Refuse an EAGLE-3 checkpoint made for another target (hidden size, vocabulary, taps), naming both numbers."""
    h_target = cfg.target_hidden_size or cfg.hidden_size
    if h_target != target.hidden_size:
        raise ValueError(
            f"The EAGLE-3 drafter expects target hidden size {h_target} but the target's is {target.hidden_size}: "
            "this drafter was trained for a different target model."
        )
    if cfg.vocab_size != target.vocab_size:
        raise ValueError(
            f"The EAGLE-3 drafter's vocabulary has {cfg.vocab_size} tokens but the target's has {target.vocab_size}: "
            "this drafter was trained for a different target model."
        )
    bad = [t for t in cfg.aux_layer_ids if not 0 <= t <= target.num_layers]
    if bad:
        raise ValueError(f"EAGLE-3 taps {bad} are outside 0..{target.num_layers} for a {target.num_layers}-layer target.")


def write_eagle3(cfg: Eagle3Config, tensors: dict[str, torch.Tensor], path, dtype=torch.bfloat16,
                 verifier: str | None = None) -> Path:
    """Write an EAGLE-3 drafter in the speculators format (loadable by vLLM's `eagle3` method)."""
    from .io import cpu_tensors

    cfg.extra.setdefault("speculators_config", {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
    })
    cfg.extra["torch_dtype"] = str(dtype).removeprefix("torch.")
    return write_folder(path, eagle3_json(cfg), cpu_tensors(tensors, dtype))


# --- DSpark -------------------------------------------------------------------------------


def is_dspark(d: dict) -> bool:
    return d.get("speculators_model_type") == "dspark"


# speculators' DSparkSpeculatorConfig defaults (models/dspark/config.py, DFlash's for block_size), for keys a
# config leaves out; its own save_pretrained writes them all.
DSPARK_DEFAULTS = {"block_size": 8, "markov_rank": 256, "markov_head_type": "vanilla", "enable_confidence_head": True,
                   "confidence_head_with_markov": True, "num_anchors": 256}
VERIFIER_TENSORS = ("embed_tokens.weight", "lm_head.weight")  # speculators' copies of the verifier's


def read_dspark(path, d: dict):
    """(Qwen3Config with DSpark's fields, tensors) of a speculators `dspark` folder (config dict `d`).

    The tensors keep ``embed_tokens`` / ``lm_head`` when speculators stored them (the verifier's,
    copied); the drafter then uses them in place of the target's.
    """
    cfg = qwen3_config(d["transformer_layer_config"])
    if d.get("draft_vocab_size", cfg.vocab_size) != cfg.vocab_size:
        raise ValueError(f"{path}: a reduced draft vocabulary (d2t/t2d) is not supported; train with the full vocabulary.")
    if not d.get("sample_from_anchor", True):
        raise ValueError(f"{path}: sample_from_anchor=false is DFlash's slot convention, not DSpark's.")
    if not d.get("aux_hidden_state_layer_ids"):
        raise ValueError(f"{path}/config.json names no aux_hidden_state_layer_ids (the taps).")
    cfg.target_layer_ids = [t - 1 for t in d["aux_hidden_state_layer_ids"]]  # taps -> DSpark ids (0 -> -1)
    read_heads(cfg, d, path, DSPARK_DEFAULTS)
    if d.get("sliding_window_non_causal"):  # speculators: sliding layers see their whole block (full ones always do)
        cfg.dflash_attention = {"causal": False}
    tensors = read_weights(path)
    for name in ("t2d", "d2t"):  # identity maps of a full vocabulary (speculators writes none then)
        tensors.pop(name, None)
    return cfg, tensors


def verifier_config(name_or_path: str | None, architectures=()) -> dict:
    """``speculators_config.verifier``: required by vLLM's and speculators' readers, None allowed as the name."""
    return {"name_or_path": name_or_path, "architectures": list(architectures)}


def write_dspark(cfg, tensors: dict[str, torch.Tensor], target_hidden_size: int, path, dtype=torch.bfloat16,
                 verifier: dict | None = None, with_verifier_tensors: bool = False) -> Path:
    """Write a DSpark drafter (backbone + heads) in the speculators format.

    `verifier` (see `verifier_config`) names the target: speculators' ``from_pretrained`` loads the
    embedding and LM head from it. `with_verifier_tensors` also writes the ``embed_tokens`` /
    ``lm_head`` in `tensors` (what speculators itself saves; 57 MB each for SmolLM2, so off by default).
    """
    from .io import cpu_tensors

    layer_cfg = {k: v for k, v in cfg.to_dict().items() if k not in HEAD_KEYS}
    d = {
        "speculators_model_type": "dspark", "architectures": ["DSparkSpeculator"],
        "transformer_layer_config": layer_cfg, "draft_vocab_size": cfg.vocab_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids], "sample_from_anchor": True,
        "target_hidden_size": target_hidden_size,
        "speculators_config": {
            "algorithm": "dspark", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size}],
            "verifier": verifier or verifier_config(None),
        },
        **head_fields(cfg),
    }
    if (getattr(cfg, "dflash_attention", None) or {}).get("causal") is False:
        d["sliding_window_non_causal"] = True
    state = {k: v for k, v in tensors.items() if with_verifier_tensors or k not in VERIFIER_TENSORS}
    missing = [k for k in VERIFIER_TENSORS if with_verifier_tensors and k not in state]
    if missing:
        raise ValueError(f"with_verifier_tensors: the tensors lack {missing}.")
    return write_folder(path, d, cpu_tensors(state, dtype))
