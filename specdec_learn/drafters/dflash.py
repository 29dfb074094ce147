"""DFlash: draft a whole block of tokens in ONE forward pass.

Every other drafter in this library guesses one token at a time. DFlash
(z-lab) guesses a block at once, the way a diffusion model fills in masked
text: the block is

    [anchor, MASK, MASK, ..., MASK]        (block_size = B slots)

where the anchor is the last token the loop committed (``state.ids[-1]``, the
target's own bonus or recovered token). A few small transformer layers read
the block and, through attention, a summary of the target's hidden states over
everything committed so far; each MASK slot comes out holding a guess. Slot j
guesses the token j places after the anchor, so one pass yields B - 1 drafts
(``max_k = B - 1``).

What makes it work with only a few layers:

* **Target context as extra K/V in every layer.** The target's residual
  stream at a few layers (``target_layer_ids``) is concatenated and fused,
  ``C = hidden_norm(fc(cat taps))`` ([T, H] for the T committed tokens before
  the anchor). In every draft layer the block attends to
  ``K = [k_proj(C); k_proj(block)]``, ``V = [v_proj(C); v_proj(block)]``: the
  context is never run through the draft layers, it is only looked at.
* **No causal mask inside the block.** A MASK slot sees the whole block and
  the whole context. Layers marked ``sliding_attention`` in ``layer_types``
  follow the serving engines (vLLM's ``qwen3_dflash._resolve_layer_attention``,
  SGLang alike): causal, each query seeing the last ``sliding_window``
  positions, context and block alike. (z-lab's ``model.py`` hands the window
  to the attention kernel: transformers' default SDPA ignores it, so there the
  layers run full and non-causal; flash-attention windows them symmetrically.)
  A sliding layer without a window, and other layer types, are refused, as vLLM does.
* **The target's own embedding and LM head**, frozen: the draft owns only
  ``fc``, ``hidden_norm``, its layers and a final ``norm``.

Tap numbering. DFlash's "layer i" is the OUTPUT of target layer i, which is
tap ``i + 1`` in this library (tap i = the residual stream entering layer i;
see target.py). A drafter built from ``target_layer_ids=[1, 14, 27]`` reads
taps (2, 15, 28). The last layer's output is the exception: z-lab reads HF's
``hidden_states[L]``, which transformers stores AFTER the final norm, so a tap
on layer L-1 is normed here too. (vLLM captures the raw stream there;
DeepSpec refuses such a tap for this very ambiguity, and DSpark here does too.)

Context cache. ``k_proj(C)`` and ``v_proj(C)`` depend only on the committed
context, never on the block, so each layer keeps them in a plain list that
only grows: a position enters once, the round after the target committed it,
and nothing is ever cropped (rejected drafts never reach the context).

The mask token. DFlash needs a token id whose embedding means "to be
guessed". Qwen3's vocabulary has spare rows (z-lab uses id 151669);
SmolLM2's 49,152 rows are all real tokens. We reuse ``<empty_output>`` (id
16), a pretraining-only special token (Jupyter notebooks) that the chat
template never produces, so its embedding row is free to mean MASK, and the
checkpoint stays in the unchanged z-lab format (just ``mask_token_id: 16``),
with no extra embedding row to ship. The draft learns what that row means.

Format: z-lab ``DFlashDraftModel`` (config.json + model.safetensors; names
and keys in formats/zlab.py), so ``z-lab/Qwen3-8B-DFlash-b16`` loads unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

from ..formats.io import load_strict
from ..formats.zlab import build_target_layer_ids, draft_config, layer_attention, read_dflash, write_dflash
from ..sampling import probabilities, sample
from ..tree import best_first, top_candidates
from ..vocab import ReducedHead
from .base import Drafter, Proposal, Rope, grouped_attention, rotate, visibility


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """z-lab's spread of taps over the target: round(1 + i (L - 4) / (n - 1)) (formats/zlab.py)."""
    return build_target_layer_ids(num_target_layers, num_taps)


# -- the network -----------------------------------------------------------------------


class BlockAttention(nn.Module):
    """Qwen3 attention whose keys are [context; block] and whose block is not causal."""

    def __init__(self, cfg: Qwen3Config, layer_idx: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(H, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(H, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(H, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, H, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.window, self.causal = layer_attention(cfg, layer_idx)

    def keys_values(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, H] -> K, V [kv_heads, n, d] (K normed and rotated)."""
        n = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)).transpose(0, 1)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        return rotate(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_kv, mask) -> torch.Tensor:
        """x [n, H] (the block rows), ctx_kv = (K, V) [kv_heads, T, d] -> [n, H]."""
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.num_heads, self.head_dim)).transpose(0, 1)  # [heads, n, d]
        q = rotate(q, cos, sin)
        k, v = self.keys_values(x, cos, sin)  # [kv_heads, n, d]
        k = torch.cat([ctx_kv[0], k], dim=1)  # [kv_heads, T + n, d]
        v = torch.cat([ctx_kv[1], v], dim=1)
        return self.o_proj(grouped_attention(q, k, v, mask))  # [n, H]


class BlockLayer(nn.Module):
    """A pre-norm decoder layer around BlockAttention (tensor names as in Qwen3)."""

    def __init__(self, cfg: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = BlockAttention(cfg, layer_idx)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_kv, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashModel(nn.Module):
    """The draft's own weights, named as z-lab names them: fc, hidden_norm, layers, norm.

    `config` is a Qwen3Config for the draft layers with three more attributes:
    ``block_size``, ``mask_token_id`` and ``target_layer_ids`` (DFlash numbering).
    """

    def __init__(self, config: Qwen3Config, target_hidden_size: int | None = None):
        super().__init__()
        self.config = config
        H = config.hidden_size
        n_taps = len(config.target_layer_ids)
        self.fc = nn.Linear(n_taps * (target_hidden_size or H), H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.angles = Rope(config)  # fp32 whatever the model's dtype (base.Rope)

    @property
    def block_size(self) -> int:
        return int(self.config.block_size)

    def rope(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin [n, d] for integer positions [n], in the dtype of `like`."""
        return self.angles(positions, like)

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Concatenated taps [T, n*Ht] at `positions` [T] -> every layer's context (K, V)."""
        c = self.hidden_norm(self.fc(taps))  # [T, H], the fused target context C
        cos, sin = self.rope(positions, c)
        return [layer.self_attn.keys_values(c, cos, sin) for layer in self.layers]

    def forward(self, x, positions, ctx_kv, ctx_positions=None, mask=None) -> torch.Tensor:
        """Block embeddings x [n, H] at `positions` [n] -> final hidden states [n, H].

        mask: [n, T + n] bool (True = may attend), used in training where many
        blocks share one context; at decode time it is None (one block, sees all),
        except in sliding-window layers, which build theirs from the positions
        (full-attention DFlash layers see everything: the block is not causal).
        """
        cos, sin = self.rope(positions, x)
        for layer, kv in zip(self.layers, ctx_kv):
            layer_mask = mask
            attn = layer.self_attn
            if mask is None and (attn.causal or attn.window is not None):
                k_pos = torch.cat([ctx_positions, positions])
                layer_mask = visibility(positions, k_pos, attn.causal, attn.window)
            x = layer(x, cos, sin, kv, layer_mask)
        return self.norm(x)


# -- the drafter -----------------------------------------------------------------------


def slot_probabilities(logits: torch.Tensor, sampling) -> torch.Tensor:
    """A tree's candidates are ranked by the drafter's distribution (temperature 1 when greedy)."""
    return logits.float().softmax(-1) if sampling.greedy else probabilities(logits, sampling)


class DFlashDrafter(Drafter):
    """Plugs a DFlashModel into the loop: one forward per round, up to B - 1 drafts."""

    name = "dflash"

    def __init__(self, model: DFlashModel):
        self.model = model.eval()
        self.block_size = model.block_size
        self.max_k = self.block_size - 1
        self.mask_token_id = int(model.config.mask_token_id)
        self.taps = tuple(i + 1 for i in model.config.target_layer_ids)  # output of layer i = tap i + 1
        self.target = None
        self.draft_ids: list[int] | None = None  # a draft vocabulary (vocab.py); None = all V tokens
        self.heads: dict[str, nn.Module] = {}  # heads built on first use, for this target and draft vocabulary

    @classmethod
    def build(cls, target, draft, options) -> DFlashDrafter:
        """The shipped DFlash drafter for the target, or a z-lab folder, in the target's dtype."""
        from ..checkpoints import find

        return cls(load_dflash(find("dflash", target.name, draft), dtype=target.dtype))

    def check_k(self, k: int) -> None:
        if k > self.max_k:
            raise ValueError(
                f"{self.name} drafts at most {self.max_k} tokens per round with block size {self.block_size} "
                f"({self._slots_explained()}); got k={k}. Use k <= {self.max_k}, or a drafter trained with a larger block."
            )

    def _slots_explained(self) -> str:
        return "slot 0 holds the anchor, slots 1..B-1 the drafts"

    # -- the target's parts the draft borrows ------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed_tokens(ids)

    def full_head(self) -> torch.nn.Module:
        """The head over all V tokens: the target's own."""
        return self.target.lm_head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if "lm_head" not in self.heads:  # first use with this target or vocabulary
            full = self.full_head()
            self.heads["lm_head"] = full if self.draft_ids is None else ReducedHead(full, self.draft_ids)
        return self.heads["lm_head"](hidden)  # [.., V]

    can_reduce_vocabulary = True

    def reduce_vocabulary(self, ids) -> None:
        """Score only the tokens `ids` (vocab.py): the same drafts whenever the argmax is among them."""
        self.draft_ids, self.heads = sorted(ids), {}

    # -- the three verbs ------------------------------------------------------
    def start(self, target, state, hidden) -> None:
        if self.model.fc.in_features != len(self.taps) * target.hidden_size:
            raise ValueError(
                f"This {self.name} drafter expects {len(self.taps)} taps of width "
                f"{self.model.fc.in_features // len(self.taps)}, but the target's hidden size is "
                f"{target.hidden_size}: it was trained for a different target."
            )
        self._check_taps(target)
        self.model.to(device=target.device, dtype=target.dtype)
        if target is not self.target:  # the heads are built anew, from this target, on its device
            self.target, self.heads = target, {}
        empty = torch.empty(self.model.config.num_key_value_heads, 0, self.model.config.head_dim,
                            device=target.device, dtype=target.dtype)
        self.ctx_kv = [(empty, empty) for _ in self.model.layers]  # per layer: K, V [kv_heads, T, d]
        self.num_ctx = 0  # positions 0..num_ctx-1 are in ctx_kv
        self.pending = self._cat(hidden)  # [n, n_taps * Ht], taps not yet turned into K/V

    def _check_taps(self, target) -> None:
        bad = [t - 1 for t in self.taps if not 0 <= t <= target.num_layers]
        if bad:
            raise ValueError(f"{self.name} target_layer_ids {bad} are outside -1..{target.num_layers - 1} "
                             f"for a {target.num_layers}-layer target.")

    @torch.inference_mode()
    def _cat(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """The taps side by side; the last layer's output final-normed, as HF's hidden_states[L] is."""
        L = self.target.num_layers
        return torch.cat([self.target.final_norm(hidden[t]) if t == L else hidden[t] for t in self.taps], dim=-1)

    @torch.inference_mode()
    def _catch_up(self) -> None:
        """Turn the taps of newly committed tokens into context K/V in every layer."""
        n = self.pending.shape[0]
        if n == 0:
            return
        positions = torch.arange(self.num_ctx, self.num_ctx + n, device=self.pending.device)
        new = self.model.context_kv(self.pending, positions)
        self.ctx_kv = [(torch.cat([k, nk], 1), torch.cat([v, nv], 1)) for (k, v), (nk, nv) in zip(self.ctx_kv, new)]
        self.num_ctx += n
        self.pending = self.pending[:0]

    @torch.inference_mode()
    def block_hidden(self, state) -> torch.Tensor:
        """One draft forward over [anchor, MASK x (B-1)] -> hidden states [B, H]."""
        self._catch_up()
        p = len(state.ids) - 1  # the anchor's position; the context is positions < p
        assert self.num_ctx == p, f"draft context holds {self.num_ctx} positions, expected {p}"
        ids = torch.full((self.block_size,), self.mask_token_id, dtype=torch.long, device=self.target.device)
        ids[0] = state.ids[-1]
        positions = torch.arange(p, p + self.block_size, device=ids.device)
        # Always the full block, as in training: every slot sees B - 1 MASKs, whatever k is.
        return self.model(self.embed(ids), positions, self.ctx_kv, torch.arange(p, device=ids.device))

    def propose(self, state, k, sampling, generator) -> Proposal:
        hidden = self.block_hidden(state)[1 : k + 1]  # slots 1..k hold the drafts
        with torch.inference_mode():
            logits = self.logits(hidden)  # [k, V]
        if sampling.greedy:
            return Proposal(logits.argmax(-1).tolist())
        q = probabilities(logits, sampling)  # [k, V]
        return Proposal([sample(row, generator) for row in q], q)

    can_branch = True

    def propose_tree(self, state, tree, sampling, generator) -> Proposal:
        """One block forward, then a tree from each slot's top candidates (slots never see each other)."""
        hidden = self.block_hidden(state)[1 : tree.depth + 1]  # slot d drafts depth d
        with torch.inference_mode():
            probs = slot_probabilities(self.logits(hidden), sampling)  # [depth, V]
        tokens, parents, _ = best_first(lambda path: top_candidates(probs[len(path)], tree.branch), tree)
        return Proposal(tokens, parents=parents)

    def observe(self, state, accepted, hidden) -> None:
        # Rows of [last, d1..dn]: newly committed context. Append, do not replace: a
        # round with no drafts (the budget's last token) skips propose and its catch-up.
        self.pending = torch.cat([self.pending, self._cat(hidden)])


# -- load and save (the z-lab format itself: formats/zlab.py) ---------------------------


def load_dflash(path, dtype=None) -> DFlashModel:
    """A z-lab DFlash checkpoint directory -> DFlashModel."""
    cfg, weights = read_dflash(path)
    model = DFlashModel(cfg, target_hidden_size=weights["fc.weight"].shape[1] // len(cfg.target_layer_ids))
    load_strict(model, weights, f"DFlash checkpoint {path}")
    return model.to(dtype) if dtype is not None else model


def save_dflash(model: DFlashModel, path, dtype=torch.bfloat16):
    """Write `model` as a z-lab DFlash checkpoint (config.json + model.safetensors)."""
    return write_dflash(model.config, model.state_dict(), path, dtype)
