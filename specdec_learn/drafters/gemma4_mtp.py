"""The Gemma 4 MTP "assistant": a small drafter that reads the TARGET's KV cache.

Gemma 4 ships each model with an assistant (``google/gemma-4-E2B-it-assistant``
for ``google/gemma-4-E2B-it``, HF model type ``gemma4_assistant``). It differs
from a draft model in three ways, all visible in one draft step::

    x = pre_projection(cat[Emb_target(tok) * sqrt(H_b), h])    # [1, 2*H_b] -> [1, H_d]
    for layer in layers:                                        # Q-only attention:
        x = layer(x, K_target, V_target, position=q)            #   K/V come from the target's cache
    d = norm(x)
    logits = lm_head(d)          (optionally only over the tokens of the top centroids,
                                  or of a draft vocabulary: vocab.py)
    h = post_projection(d)                                      # [1, H_b], the next step's h

* **No KV cache of its own.** Each assistant layer has only ``q_proj`` (and
  ``q_norm``, ``o_proj``); its keys and values are the target's, from the last
  target layer of the same attention type (sliding or full) that computes its
  own K/V. The assistant reads them and writes nothing, so it needs no prefill
  and its cost does not grow with the context.
* **Constant positions.** Every draft step queries at the same position.
  Draft tokens never enter any cache; what carries the draft forward is
  ``h``, fed back through ``post_projection``. Which position is a choice
  (below): p-1, where vLLM puts it, by default.
* **Input = token embedding + target hidden state**, as in MTP: step 0 pairs
  the target's hidden state at position p-1 (the state that predicted
  ``last``) with ``last``'s embedding. The embedding is the target's, scaled by
  sqrt(H_b) as Gemma scales its own (Gemma's embedding module already carries
  the scale; for other targets we multiply).

Which target hidden state: post-final-norm, as HF's candidate generator passes
``hidden_states[-1]`` (Google does not document it; decided here). Our tap L
is pre-norm, so the drafter applies ``target.final_norm``.

The cache read here is ``state.cache``, the target's own HF DynamicCache,
holding ``state.ids[:-1]`` (positions 0..p-1, p = the position of ``last``).

Three rules differ between the two published runtimes; each is chosen to
match vLLM (``v1/spec_decode/gemma4.py``, ``llm_base_proposer.py``,
``model_executor/models/gemma4_mtp.py``), what a GPU user runs:

* **Query position: p-1** (``position="vllm"``). vLLM's first draft pass
  keeps the target's positions and shifts the tokens, so ``last`` is read at
  the position of the state that predicted it, p-1, and stays there
  (``constant_draft_positions``). transformers' ``SinglePositionMultiTokenCandidateGenerator``
  (assisted generation) queries at p (``position="hf"``).
* **K/V: committed positions only.** vLLM trims the rejected tokens from the
  drafter's sequence lengths; HF slices the cache to ``len(input_ids)``,
  which after a rejection keeps the stale K/V of the rejected draft at p.
* **Soft-capping: dense logits only.** vLLM applies
  ``final_logit_softcapping`` in its logits processor for dense logits and
  not for centroid-masked ones (whose tokens outside the top centroids get
  the dtype's minimum: no probability, as here); HF's assistant never caps
  (and leaves the outside tokens at min - 1).

Greedy output is the target's either way (the verifier decides); acceptance
is what changes: the shipped assistant, trained with queries at p
(train/gemma4_mtp.py), accepts slightly less under the vLLM rule it was not
trained for (the draft distributions move, top-1 mostly not), a reason to
train it at p-1, where vLLM will query it. ``final_logit_softcapping`` is
unset in this assistant, so the third rule changes nothing for it.

The assistant network itself is transformers' ``Gemma4AssistantForCausalLM``
(the published format loads with `load_gemma4_assistant`); this file is the
glue that makes it a drafter: what goes in, which cache it reads, what comes back.
"""

from __future__ import annotations

import math

import torch

from ..formats.hf_assistant import read_assistant
from ..sampling import draft_token
from ..vocab import cut_output_head
from .base import Drafter, Proposal

ATTENTION_TYPES = ("full_attention", "sliding_attention")
POSITIONS = {"vllm": 1, "hf": 0}  # how far before `last`'s position p the draft query sits


def shared_kv_layers(target) -> dict[str, int]:
    """For each attention type, the last target layer that computes (not borrows) its K/V.

    Gemma 4 targets themselves share K/V in their top ``num_kv_shared_layers``
    layers; those hold no cache of their own, so the assistant reads the last
    layer below them of the same type. A target with one attention type (a
    Llama) serves both types from its last layer.
    """
    cfg = target.config
    L = target.num_layers
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * L)
    own = L - (getattr(cfg, "num_kv_shared_layers", 0) or 0)  # layers 0..own-1 compute their K/V
    found = {}
    for kind in ATTENTION_TYPES:
        idx = [i for i in range(own) if types[i] == kind]
        if idx:
            found[kind] = idx[-1]
    if not found:
        raise ValueError(f"Target {target.name!r} has no attention layer with its own K/V to share.")
    for kind in ATTENTION_TYPES:  # a single-type target answers both
        found.setdefault(kind, next(iter(found.values())))
    return found


def read_shared_kv(cache, layers: dict[str, int]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The target's K/V per attention type: views into the cache, [1, kv_heads, T, head_dim] each."""
    out = {}
    for kind, i in layers.items():
        layer = cache.layers[i]
        if layer.keys is None or layer.keys.numel() == 0:
            raise ValueError(f"Target cache layer {i} is empty: the assistant needs a prefilled target cache.")
        out[kind] = (layer.keys, layer.values)
    return out


class Gemma4AssistantDrafter(Drafter):
    """Drafts with a Gemma-4-style assistant that attends to the target's KV cache."""

    name = "gemma4_mtp"

    def __init__(self, assistant, target, position: str = "vllm"):
        """`assistant`: a ``Gemma4AssistantForCausalLM`` built for `target` (checked here).

        position: "vllm" queries at p-1, "hf" at p (the module docstring says why and what it changes).
        """
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {position!r}.")
        self.query_back = POSITIONS[position]
        check_pairing(assistant, target)
        self.assistant = assistant.eval()
        self.target = target
        self.taps = (target.num_layers,)
        self.kv_layers = shared_kv_layers(target)
        H_b = target.hidden_size
        # Gemma's embedding module carries sqrt(H) already; other targets' do not.
        self.embed_scale = 1.0 if hasattr(target.embed_tokens, "embed_scale") else math.sqrt(H_b)
        text_cfg = assistant.config.get_text_config()
        self.softcap = getattr(text_cfg, "final_logit_softcapping", None)
        # Sparse logits: score only the tokens of the top `centroid_intermediate_top_k` centroids.
        self.sparse_logits = bool(assistant.config.use_ordered_embeddings)
        # generation_config.json's suppress_tokens: never drafted (vLLM's compute_logits sets them to -inf)
        self.suppress = list(getattr(getattr(assistant, "generation_config", None), "suppress_tokens", None) or [])
        self.h: torch.Tensor | None = None
        self.full_head = None  # the assistant's own head, once reduce_vocabulary has swapped it

    @classmethod
    def build(cls, target, draft, options) -> Gemma4AssistantDrafter:
        """The shipped assistant for the target, or a gemma4_assistant folder."""
        from ..checkpoints import find

        return cls(load_gemma4_assistant(find("gemma4_mtp", target.name, draft), target), target)

    can_reduce_vocabulary = True

    def reduce_vocabulary(self, ids) -> None:
        """Score only the tokens `ids` (vocab.py): the assistant's own head is swapped for its cut rows.

        A centroid-masked assistant (``use_ordered_embeddings``) already scores
        only the tokens of its top centroids, through the full head's weight:
        its format's own answer to the same cost, so it is refused here.
        """
        if self.sparse_logits:
            raise ValueError("This assistant already scores only the tokens of its top centroids "
                             "(use_ordered_embeddings): drop --draft-vocab for it.")
        self.full_head = cut_output_head(self.assistant, ids, self.full_head)  # kept, should this be called again

    def start(self, target, state, hidden) -> None:
        self.target = target
        rows = hidden[target.num_layers]  # [prompt_len-1, H_b]
        self.h = self._post_norm(rows[-1:]) if rows.shape[0] else None  # a one-token prompt has no state yet

    def observe(self, state, accepted, hidden) -> None:
        # Row `accepted` is the target's state at the position that predicted the new `last`.
        self.h = self._post_norm(hidden[self.target.num_layers][accepted : accepted + 1])

    @torch.inference_mode()
    def _post_norm(self, rows: torch.Tensor) -> torch.Tensor:
        return self.target.final_norm(rows)[None]  # [1, 1, H_b]

    @torch.inference_mode()
    def propose(self, state, k, sampling, generator) -> Proposal:
        if self.h is None:
            return Proposal([])
        p = len(state.ids) - 1 - self.query_back  # constant for every draft step: p-1 as vLLM, or `last`'s
        shared_kv = read_shared_kv(state.cache, self.kv_layers)  # read only: nothing is appended
        position_ids = torch.tensor([[p]], device=self.h.device)  # [1, 1]
        tok, h = state.ids[-1], self.h
        tokens, qs = [], []
        for _ in range(k):
            logits, h = self.step(tok, h, position_ids, shared_kv)
            tok = draft_token(logits, sampling, generator, qs)
            tokens.append(tok)
        return Proposal(tokens, torch.stack(qs) if qs else None)

    def step(self, tok: int, h: torch.Tensor, position_ids, shared_kv):
        """One assistant pass: (token, h [1, 1, H_b]) -> (logits [V], next h [1, 1, H_b])."""
        ids = torch.tensor([[tok]], device=h.device)  # [1, 1]
        e = self.target.embed_tokens(ids) * self.embed_scale  # [1, 1, H_b]
        out = self.assistant(
            inputs_embeds=torch.cat([e, h], dim=-1).to(self.assistant.dtype),  # [1, 1, 2*H_b]
            position_ids=position_ids,
            shared_kv_states=shared_kv,
            use_cache=False,
        )
        logits = out.logits[0, -1].float()  # [V]
        if self.sparse_logits:  # HF leaves the tokens outside the top centroids at (lowest kept - 1): some
            # probability; vLLM gives them none, and caps none of these logits
            logits = logits.masked_fill(logits == logits.min(), float("-inf"))
        elif self.softcap:  # dense logits: soft-capped, as vLLM's logits processor does
            cut = self.full_head is not None  # a cut head leaves the tokens outside its vocabulary at -inf
            outside = torch.isneginf(logits) if cut else None  # (reduce_vocabulary)
            logits = self.softcap * torch.tanh(logits / self.softcap)
            if cut:
                logits = logits.masked_fill(outside, float("-inf"))  # tanh would bring -inf back to -softcap
        if self.suppress:
            logits[self.suppress] = float("-inf")
        return logits, out.last_hidden_state.to(h.dtype)


def check_pairing(assistant, target) -> None:
    """An assistant reads one target's hidden states and K/V: their shapes must agree."""
    cfg = assistant.config
    text_cfg = cfg.get_text_config()
    problems = []
    if cfg.backbone_hidden_size != target.hidden_size:
        problems.append(f"backbone_hidden_size {cfg.backbone_hidden_size} != target hidden size {target.hidden_size}")
    if text_cfg.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {text_cfg.vocab_size} != target vocabulary {target.vocab_size}")
    if text_cfg.num_kv_shared_layers != text_cfg.num_hidden_layers:
        problems.append("not every assistant layer is KV-shared (num_kv_shared_layers != num_hidden_layers)")
    if problems:
        raise ValueError(
            "This Gemma 4 assistant was not built for this target: " + "; ".join(problems)
            + ". Pair each assistant with the target it was trained for "
            "(google/gemma-4-E2B-it-assistant with google/gemma-4-E2B-it)."
        )


def load_gemma4_assistant(path, target):
    """A ``gemma4_assistant`` checkpoint (HF format: formats/hf_assistant.py), checked against `target`."""
    from ..checkpoints import complete

    path = complete(path, target.name)  # ours ships its table as E_target·P (train/projected.py)
    assistant = read_assistant(path, dtype=target.dtype)
    check_pairing(assistant, target)
    return assistant.to(target.device).eval()


def assistant_config_for(target, hidden_size: int = 256, num_layers: int = 4, num_heads: int | None = None,
                         intermediate_size: int | None = None, **overrides):
    """A ``Gemma4AssistantConfig`` shaped to read `target`'s cache (for a graft or a test).

    The assistant's attention must match the target's K/V: same number of
    K/V heads, same head size, same rotary embedding (its queries are rotated
    to meet keys the target rotated). Every layer is full attention and KV-shared.
    """
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    tcfg = target.config
    kv_heads = tcfg.num_key_value_heads
    head_dim = getattr(tcfg, "head_dim", None) or tcfg.hidden_size // tcfg.num_attention_heads
    rope = dict(getattr(tcfg, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
    if "full_attention" not in rope:
        rope = {"full_attention": rope, "sliding_attention": rope}
    text = Gemma4TextConfig(
        vocab_size=target.vocab_size, hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads or tcfg.num_attention_heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, global_head_dim=head_dim, layer_types=["full_attention"] * num_layers,
        rope_parameters=rope, num_kv_shared_layers=num_layers, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, max_position_embeddings=tcfg.max_position_embeddings,
        rms_norm_eps=tcfg.rms_norm_eps, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )
    return Gemma4AssistantConfig(text_config=text, backbone_hidden_size=target.hidden_size, **overrides)


def random_assistant(target, seed: int = 0, **config_kwargs):
    """An untrained assistant for `target` (tests; the starting point of training)."""
    from transformers import Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(assistant_config_for(target, **config_kwargs))
    return model.to(device=target.device, dtype=target.dtype).eval()
