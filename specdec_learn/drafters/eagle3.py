"""EAGLE-3: one decoder layer that drafts from the target's own hidden states.

Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test" (2025). The drafter is tiny (one decoder layer)
because it does not start from scratch: it reads what the target already
computed. At position t it gets

    g_t   = fc(cat[h_a(t), h_b(t), h_c(t)])       # three target layers, fused   [H]
    e_t   = Emb(x_{t+1})                          # the token that follows t      [H]

and its one decoder layer runs attention over cat[input_layernorm(e_t),
hidden_norm(g_t)] (so q/k/v take 2H inputs), adds the residual g_t, then the
MLP. `lm_head(norm(.))` scores a reduced *draft vocabulary*, mapped back to
target ids through `d2t` (target id = draft id + d2t[draft id]).

Drafting k tokens is k sequential steps with the drafter's own KV cache. Step
0 reads the target's fused hidden state; later steps have no target state for
positions the target has not run yet, so they feed back the drafter's own
output x instead (the "training-time test" teaches it to cope): pre-norm x, or
norm(x) under ``norm_output`` (Eagle 3.1, speculators' training default: it
keeps the magnitude from drifting over the steps; vLLM does the same). On
rejection the drafter's cache is cropped back to the positions that used
real target states, and the target's states for the accepted tokens come next.
RoPE is transformers' own class (every scaling, YaRN's attention factor
included); a ``sliding_attention`` layer sees the last ``sliding_window``
positions, as vLLM serves it.

The taps (`eagle_aux_hidden_state_layer_ids`) default to (2, L//2, L-3): the
residual stream ENTERING those layers, i.e. HF `hidden_states[i]` (target.py's
tap numbering).

The weights load from, and save to, the *speculators* format (vLLM's `eagle3`
method reads it; its names and config keys: formats/speculators.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP
from transformers.models.llama.modeling_llama import LlamaRMSNorm as RMSNorm  # the same norm as the draft layer's
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

from ..formats.io import load_strict
from ..formats.speculators import (Eagle3Config, check_target, eagle3_config_for, eagle3_layer_attention,
                                   layer_hf_config, read_eagle3, write_eagle3)
from ..kv_cache import KVCache
from ..sampling import draft_token
from ..tree import ancestor_mask, dynamic_tree
from .base import Drafter, Proposal, Rope, grouped_attention, rotate, visibility


def default_taps(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default: low, middle and high layers of the target."""
    return (2, num_layers // 2, num_layers - 3)


# --- the network ----------------------------------------------------------------


class Eagle3Layer(nn.Module):
    """The first (and only) draft decoder layer: attention over cat[norm(embedding), norm(fused hidden)]."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        c = cfg.layer_config
        H, eps = c["hidden_size"], c.get("rms_norm_eps", 1e-6)
        self.num_heads, self.num_kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        self.head_dim = c.get("head_dim") or H // self.num_heads
        self.norm_before_residual = cfg.norm_before_residual
        self.window = eagle3_layer_attention(c)[1]  # None = full attention
        bias = c.get("attention_bias", False)
        self.input_layernorm = RMSNorm(H, eps)  # on the token embedding
        self.hidden_norm = RMSNorm(H, eps)  # on the fused target state
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * H, self.num_heads * self.head_dim, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * H, self.num_kv_heads * self.head_dim, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * H, self.num_kv_heads * self.head_dim, bias=bias)
        self.self_attn.o_proj = nn.Linear(self.num_heads * self.head_dim, H, bias=bias)
        if c["model_type"] == "qwen3":  # Qwen3 normalises each head's queries and keys
            self.self_attn.q_norm = RMSNorm(self.head_dim, eps)
            self.self_attn.k_norm = RMSNorm(self.head_dim, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = (Qwen3MLP if c["model_type"] == "qwen3" else LlamaMLP)(layer_hf_config(c))  # the layer type's own

    def qkv(self, emb, hidden, cos, sin):
        """Queries [heads, n, d] and this call's keys/values [kv_heads, n, d]."""
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # [n, 2H]
        n, attn = x.shape[0], self.self_attn
        q = attn.q_proj(x).view(n, self.num_heads, self.head_dim).transpose(0, 1)
        k = attn.k_proj(x).view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        v = attn.v_proj(x).view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def attend(self, q, k_all, v_all, mask):
        """Attention of q [heads, n, d] over k_all/v_all [kv_heads, m, d] under mask [n, m] -> [n, H]."""
        return self.self_attn.o_proj(grouped_attention(q, k_all, v_all, mask))

    def finish(self, hidden, attn_out):
        """Residual (the fused state, or its norm) + attention output, then the MLP block."""
        residual = self.hidden_norm(hidden) if self.norm_before_residual else hidden
        x = residual + attn_out  # [n, H]
        h = self.post_attention_layernorm(x)
        return x + self.mlp(h)


class Eagle3Model(nn.Module):
    """fc + one draft layer + norm + lm_head over the draft vocabulary (+ d2t / t2d)."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.config = cfg
        H, c = cfg.hidden_size, cfg.layer_config
        eps = c.get("rms_norm_eps", 1e-6)
        if cfg.norm_before_fc:  # one norm over the concatenated taps
            self.input_norm = RMSNorm(cfg.fc_in, eps)
        if cfg.fc_norm:  # one norm per tap
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.tap_size, eps) for _ in cfg.aux_layer_ids)
        self.fc = nn.Linear(cfg.fc_in, H, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(cfg)])
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.t2d[: cfg.draft_vocab_size] = True  # identity mapping until a real one is loaded
        self.embed_tokens: nn.Embedding | None = None  # only when the checkpoint has its own
        # Used here, not owned: a module in a plain namespace is no submodule, so the target's embedding
        # (`borrow_embedding`) is never saved, moved or counted with this model.
        self.unowned = SimpleNamespace(embedding=None)
        self.angles = Rope(layer_hf_config(c))  # fp32 whatever the model's dtype (base.Rope)

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """Use the target ids `draft_ids` (sorted, V_d of them) as the draft vocabulary."""
        draft_ids = torch.as_tensor(draft_ids, dtype=torch.long).sort().values
        if draft_ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"{draft_ids.numel()} draft ids for a draft vocabulary of {self.config.draft_vocab_size}.")
        self.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        self.t2d.zero_()
        self.t2d[draft_ids] = True

    @property
    def draft_to_target(self) -> torch.Tensor:  # [V_d] target id of each draft id
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def borrow_embedding(self, target) -> None:
        """Look tokens up in the target's embedding, unless the checkpoint brought its own."""
        if self.embed_tokens is None:
            self.unowned.embedding = target.embed_tokens

    def rope(self, positions: torch.Tensor):
        """cos, sin [n, d] for integer positions [n] (attention factor applied, as transformers does)."""
        return self.angles(positions, self.fc.weight.new_empty(0))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.embed_tokens if self.embed_tokens is not None else self.unowned.embedding
        if table is None:
            raise ValueError("This drafter has no embed_tokens of its own: call model.borrow_embedding(target) first.")
        return table(ids)

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """g = fc(cat[h_a, h_b, h_c]): [n, 3 H_t] -> [n, H]."""
        taps = taps.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            taps = self.input_norm(taps)
        if self.config.fc_norm:
            taps = torch.cat([norm(t) for norm, t in zip(self.fc_norm, taps.chunk(len(self.fc_norm), dim=-1))], -1)
        return self.fc(taps)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [n, V_d] from pre-norm outputs x [n, H]."""
        return self.lm_head(self.norm(x))

    def feedback(self, x: torch.Tensor) -> torch.Tensor:
        """The state the next step reads in place of a target state: norm(x) under norm_output, else x."""
        return self.norm(x) if self.config.norm_output else x


def new_eagle3(target, draft_ids=None, taps=None, intermediate_size: int | None = None, seed: int = 0) -> Eagle3Model:
    """A fresh (random) drafter shaped for `target`, its draft layer a copy of the target's layer shape."""
    n_draft = target.vocab_size if draft_ids is None else len(draft_ids)
    cfg = eagle3_config_for(target, n_draft, tuple(taps or default_taps(target.num_layers)), intermediate_size)
    torch.manual_seed(seed)
    model = Eagle3Model(cfg)
    if draft_ids is not None:
        model.set_vocab(torch.as_tensor(draft_ids))
    model.borrow_embedding(target)
    return model.to(device=target.device)


# --- the drafter ----------------------------------------------------------------------


class Eagle3Drafter(Drafter):
    """Plugs an Eagle3Model into the loop (see base.py): reads taps, drafts k tokens step by step."""

    name = "eagle3"
    can_branch = True

    def __init__(self, model: Eagle3Model, target=None):
        self.model = model.eval()
        self.taps = tuple(model.config.aux_layer_ids)
        self.cache = KVCache()  # the drafter's own K/V: row i = position i, as far as the chain goes
        self.num_real = 0  # cached positions computed from real target states (the rest are this round's drafts)
        self.pending: list[torch.Tensor] = []  # per tap [m, H_t]: committed target rows not run yet
        if target is not None:
            self._attach(target)

    @classmethod
    def build(cls, target, draft, options) -> Eagle3Drafter:
        """The shipped EAGLE-3 head for the target, or a speculators-format folder."""
        from ..checkpoints import find

        return cls(load_eagle3(find("eagle3", target.name, draft), target), target)

    def _attach(self, target) -> None:
        """Refuse a target the model was not made for; borrow its embedding if the checkpoint has none."""
        check_target(self.model.config, target)
        self.model.borrow_embedding(target)

    def start(self, target, state, hidden) -> None:
        self._attach(target)
        self.cache, self.num_real = KVCache(), 0
        self.pending = [hidden[t] for t in self.taps]

    @torch.inference_mode()
    def _step(self, hidden: torch.Tensor, tokens: list[int], start: int, ancestors=None) -> torch.Tensor:
        """One draft step over n rows (hidden [n, H], the tokens that follow them) -> pre-norm x [n, H].

        A chain's rows sit at positions start, start+1, ... and see every
        cached position up to their own. A tree's nodes of one depth all sit
        at `start`; past the committed rows each sees only its `ancestors`
        ([n, T] bool over the cache, themselves included).
        """
        model, layer = self.model, self.model.layers[0]
        device = model.fc.weight.device
        if ancestors is None:  # a chain: one position after another
            positions = torch.arange(start, start + len(tokens), device=device)  # [n]
        else:  # one depth of a tree: its nodes side by side, at one position
            positions = torch.full((len(tokens),), start, device=device)
        emb = model.embed(torch.tensor(tokens, device=device)).to(hidden.dtype)  # [n, H]
        cos, sin = model.rope(positions)
        q, k, v = layer.qkv(emb, hidden, cos, sin)
        self.cache.append(k, v)  # committed row i holds position i
        mask = visibility(positions, torch.arange(len(self.cache), device=device), True, layer.window)  # [n, T]
        if ancestors is not None:
            mask[:, self.num_real :] = ancestors[:, self.num_real :]
        return layer.finish(hidden, layer.attend(q, self.cache.k, self.cache.v, mask))

    def _catch_up(self, state) -> torch.Tensor | None:
        """Run the target rows committed since the last round -> the state x [1, H] that drafts d1 (None: nothing yet)."""
        rows = self.pending[0].shape[0]
        if rows == 0:  # a one-token prompt: no target state to draft from yet
            return None
        # Row p pairs the target's state at p with token ids[p + 1].
        start = self.num_real
        g = self.model.fuse(torch.cat(self.pending, dim=-1))  # [rows, H]
        x = self._step(g, state.ids[start + 1 : start + 1 + rows], start)[-1:]  # [1, H]
        self.num_real, self.pending = start + rows, [p[:0] for p in self.pending]
        return x

    def propose(self, state, k, sampling, generator) -> Proposal:
        model = self.model
        x = self._catch_up(state)
        if x is None:
            return Proposal([])
        tokens, qs = [], []
        for i in range(k):
            logits = model.logits(x)[0]  # [V_d]
            if sampling.greedy:  # the argmax over the draft vocabulary, as a target id (no [V] row to fill)
                tokens.append(int(model.draft_to_target[logits.argmax()]))
            else:  # q over the target's vocabulary: zero outside the draft vocabulary
                full = logits.new_full((model.config.vocab_size,), -math.inf)  # [V]
                full[model.draft_to_target] = logits
                tokens.append(draft_token(full, sampling, generator, qs))
            if i < k - 1:  # later steps feed back the drafter's own state (pre-norm, or normed: norm_output)
                x = self._step(model.feedback(x), tokens[-1:], self.num_real + i)
        return Proposal(tokens, torch.stack(qs) if qs else None)

    @torch.inference_mode()
    def propose_tree(self, state, tree, sampling, generator) -> Proposal:
        """EAGLE-2's dynamic tree (tree.dynamic_tree): one batched draft step per depth.

        The nodes of one depth run together, each seeing the committed
        positions and its own ancestors only (a tree mask over the drafter's
        cache); each feeds back its parent's state, as a chain step does.
        The drafts are the top candidates, not samples: under sampling the
        verifier treats them as one-hot (verify.py), which keeps it lossless.
        """
        model = self.model
        x = self._catch_up(state)
        if x is None:
            return Proposal([])
        states, rows = {-1: x}, {}  # node -> its state x [1, H]; node -> its row in the drafter's cache

        def step(run, tokens, parents, depth):  # one batched draft step for the nodes `run`, all at `depth`
            rows.update({c: len(self.cache) + i for i, c in enumerate(run)})
            ancestors = ancestor_mask(run, parents, rows, len(self.cache) + len(run), x.device)  # [n, T]
            hidden = model.feedback(torch.cat([states[parents[c]] for c in run]))  # [n, H]: each parent's state
            xs = self._step(hidden, [tokens[c] for c in run], self.num_real + depth - 1, ancestors)  # [n, H]
            states.update({c: xs[i : i + 1] for i, c in enumerate(run)})
            return model.logits(xs).float().softmax(-1)  # [n, V_d]

        root = model.logits(x)[0].float().softmax(-1)  # [V_d]
        tokens, parents = dynamic_tree(root, step, tree, vocab=model.draft_to_target)
        return Proposal(tokens, parents=parents)

    def observe(self, state, accepted, hidden) -> None:
        # Positions drafted from the drafter's own states are redone with the target's.
        self.cache.crop(self.num_real)
        self.pending = [torch.cat([p, hidden[t]]) for p, t in zip(self.pending, self.taps)]


# --- load and save (the format itself: formats/speculators.py) ------------------------


def load_eagle3(path, target=None, dtype=None, device=None) -> Eagle3Model:
    """An Eagle3Model from a speculators-format folder, checked against `target` when given."""
    cfg, tensors = read_eagle3(path)
    if not cfg.aux_layer_ids:  # older checkpoints leave the taps to the default
        if target is None:
            raise ValueError(f"{path}/config.json names no eagle_aux_hidden_state_layer_ids: pass the target, "
                             "so the default (2, L//2, L-3) can be used.")
        cfg.aux_layer_ids = default_taps(target.num_layers)
    if target is not None:
        check_target(cfg, target)
    model = Eagle3Model(cfg)
    if "embed_tokens.weight" in tensors:
        model.embed_tokens = nn.Embedding(*tensors["embed_tokens.weight"].shape)
    identity = {name: t for name, t in model.state_dict().items() if name in ("d2t", "t2d") and name not in tensors}
    load_strict(model, {**identity, **tensors}, f"EAGLE-3 checkpoint {path}")
    dtype = dtype or (target.dtype if target is not None else torch.float32)
    model = model.to(device=device or (target.device if target is not None else "cpu"), dtype=dtype)
    if target is not None:
        model.borrow_embedding(target)
    return model.eval()


def save_eagle3(model: Eagle3Model, path, dtype=torch.bfloat16, verifier: str | None = None):
    """Write `model` in the speculators format (a borrowed embedding is not in its state dict, so not saved)."""
    return write_eagle3(model.config, model.state_dict(), path, dtype, verifier)
