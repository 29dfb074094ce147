"""Native multi-token prediction (MTP): extra layers that live inside the target.

DeepSeek-V3, Qwen3-Next and Qwen3.5 were trained with one (or a few) extra
decoder layers after the main stack. Layer j learns to predict token t+j+2
from two things: the embedding of token t+j+1 and a hidden state of position
t (the target's for j = 0, layer j-1's output after that). At inference the
same layers draft: no second model, no extra training.

One MTP step, in the Qwen3.5 / Qwen3-Next layout (checkpoint keys ``mtp.*``)::

    e = pre_fc_norm_embedding(Emb(tok))            # [n, H]
    h = pre_fc_norm_hidden(h_prev)                 # [n, H]
    x = fc(cat[e, h])                              # [n, 2H] -> [n, H], embedding FIRST
    x = layers[step % n_layers](x)                 # a full-attention decoder layer
    out = norm(x); logits = lm_head(out)           # `out` is the next step's h_prev

and in the DeepSeek-V3 layout (checkpoint keys ``model.layers.{L+j}.*``, L =
num_hidden_layers): ``enorm``, ``hnorm``, ``eh_proj``, the block, then
``shared_head.norm`` / ``shared_head.head``; there the PRE-norm x is fed back,
and each layer has its own norms and projection.

Inputs (as vLLM pairs them):
* step 0 pairs the target hidden state at position t with token t+1;
* step s > 0 feeds back the previous step's output with the draft it produced;
* k larger than the number of MTP layers reuses them, layer ``s % n`` at step
  s (vLLM does the same and warns that acceptance drops: the layers were never
  trained that deep).

Which target hidden state: the one AFTER the target's final norm. vLLM hands
its MTP proposer the model's output, which is post-norm (the published MTP
papers leave it open; decided here); HF's ``MTPCandidateGenerator`` uses
``hidden_states[-1]``, which is also post-norm. Our tap L is pre-norm, so the
drafter applies ``target.final_norm`` itself.

Each MTP layer is a real attention layer with its own KV cache over the
positions it has seen. Layer j's cache holds every position t whose input
token t+j+1 is committed (teacher forcing, as in training: HF's ``MtpModel``
keeps the same complete caches). Drafting extends the caches with positions
that use draft tokens; those entries are cropped before the next round.

`load_mtp` reads the weights straight from a target checkpoint directory, so
a Qwen3.5 model's own MTP layers draft unchanged; the published names are in
formats/mtp.py.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import torch
from torch import nn
from transformers import DynamicCache

from ..formats import mtp as names
from ..formats.io import load_strict, read_config
from ..formats.mtp import LAYOUTS
from ..sampling import draft_token
from ..compat import cache_arg, cached_length
from ..kv_cache import crop_cache
from ..tree import causal_mask
from ..vocab import ReducedHead
from .base import Drafter, Proposal


# -- the network ------------------------------------------------------------------


class MTPStep(nn.Module):
    """One MTP layer with the pieces around it: norms, projection, block, output norm, head.

    Its modules carry DeepSeek-V3's checkpoint names (the formula in the
    module docstring). In that layout each step owns them, so the steps are
    the head's layers; in the Qwen layout every step shares one `enorm`,
    `hnorm`, `eh_proj` (Qwen's `fc`) and output norm (the same module
    objects) and owns only its block.
    """

    def __init__(self, enorm, hnorm, eh_proj, mtp_block, shared_head_norm, head, feed_back_normed: bool):
        super().__init__()
        self.enorm, self.hnorm, self.eh_proj, self.mtp_block = enorm, hnorm, eh_proj, mtp_block
        self.shared_head_norm = shared_head_norm
        self.unowned = SimpleNamespace(head=head)  # the target's LM head: not registered, so never saved here
        self.feed_back_normed = feed_back_normed  # Qwen: norm(x) is fed back; DeepSeek: x

    @property
    def head(self) -> nn.Module:
        return self.unowned.head

    def forward(self, e, h, position_embeddings, mask, cache):
        """e, h: [1, n, H] -> (logits [1, n, V], next h_prev [1, n, H])."""
        out, h_next = self.hidden(e, h, position_embeddings, mask, cache)
        return self.head(out), h_next

    def hidden(self, e, h, position_embeddings, mask, cache):
        """The step before its LM head: e, h [1, n, H] -> (normed output [1, n, H], next h_prev [1, n, H]).

        Training scores a sample of the rows, so it applies `head` to those alone.
        """
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h)], dim=-1))  # [1, n, 2H] -> [1, n, H]
        x = self.mtp_block(x, position_embeddings=position_embeddings, attention_mask=mask, **cache_arg(cache))
        out = self.shared_head_norm(x)
        return out, (out if self.feed_back_normed else x)


class MTPHead(nn.Module):
    """The MTP layers of one target, in either published layout."""

    def __init__(self, target, num_layers: int, layout: str = "qwen3_next"):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"Unknown MTP layout {layout!r}: choose from {', '.join(LAYOUTS)}.")
        if num_layers < 1:
            raise ValueError(f"An MTP head needs at least one layer, got num_layers={num_layers}.")
        self.layout, self.num_layers = layout, num_layers
        self.chain_depth: int | None = None  # set for recursively trained heads (see MTPDrafter)
        H = target.hidden_size
        norm_cls, eps = type(target.final_norm), target.config.rms_norm_eps
        layers = nn.ModuleList(_decoder_layer(target, j, num_layers) for j in range(num_layers))
        if layout == "qwen3_next":
            self.pre_fc_norm_embedding = norm_cls(H, eps=eps)
            self.pre_fc_norm_hidden = norm_cls(H, eps=eps)
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layers = layers
            self.norm = norm_cls(H, eps=eps)
            steps = [MTPStep(self.pre_fc_norm_embedding, self.pre_fc_norm_hidden, self.fc, layer, self.norm,
                             target.lm_head, feed_back_normed=True) for layer in layers]
        else:  # deepseek_v3: every layer carries its own enorm / hnorm / eh_proj / shared_head norm
            steps = [MTPStep(norm_cls(H, eps=eps), norm_cls(H, eps=eps), nn.Linear(2 * H, H, bias=False), layer,
                             norm_cls(H, eps=eps), target.lm_head, feed_back_normed=False) for layer in layers]
            self.layers = nn.ModuleList(steps)
        # Not registered (a plain namespace): the Qwen steps only regroup the modules above, and the
        # embedding is the target's, saved, moved and counted with the target, not with this head.
        self.unowned = SimpleNamespace(steps=steps, embedding=target.embed_tokens)

    def step(self, j: int) -> MTPStep:
        return self.unowned.steps[j]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.unowned.embedding(tokens)


def _decoder_layer(target, j: int, num_layers: int) -> nn.Module:
    """A fresh decoder layer of the target's own class, sitting at index L + j.

    At index L + j it gets what an MTP layer is in the published models: full
    attention (Qwen3.5 alternates linear and full attention in the main stack)
    and, for DeepSeek-V3, the MoE MLP of the deep layers. Each MTP layer keeps
    its own one-layer KV cache, so its attention reads cache slot 0.
    """
    cfg = copy.deepcopy(target.config)
    L = target.num_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types) + ["full_attention"] * num_layers
    cfg.num_hidden_layers = L + num_layers
    layer = type(target.decoder.layers[-1])(cfg, L + j)
    for module in layer.modules():
        if hasattr(module, "layer_idx"):
            module.layer_idx = 0
    return layer.to(device=target.device, dtype=target.dtype)


def random_mtp_head(target, num_layers: int = 1, layout: str = "qwen3_next", seed: int = 0) -> MTPHead:
    """An untrained head (for tests and as the starting point of a graft).

    Norm weights start at the identity of the target's norm class (1, or 0 for
    zero-centred norms), linear weights small and random.
    """
    torch.manual_seed(seed)
    head = MTPHead(target, num_layers, layout)
    H = target.hidden_size
    for name, p in head.named_parameters():
        if p.ndim >= 2:
            nn.init.normal_(p, std=1 / math.sqrt(H))
    return head.to(device=target.device, dtype=target.dtype).eval()


# -- the drafter ------------------------------------------------------------------


class MTPDrafter(Drafter):
    """Drafts with the target's MTP layers: k steps, layer `s % n` at step s.

    depth: how many chained steps keep a cache of their own over the committed
    positions (teacher-forced, as in training). Default: the number of MTP
    layers, as published. A head trained recursively, one layer applied K
    times (FastMTP, our SmolLM2 graft), sets depth=K so that inference sees
    what training saw; steps past `depth` reuse a slot as vLLM does.
    """

    name = "mtp"

    def __init__(self, head: MTPHead, target, depth: int | None = None):
        self.head = head.eval()
        self.depth = depth or getattr(head, "chain_depth", None) or head.num_layers  # chained slots
        if self.depth < head.num_layers:
            raise ValueError(f"depth={self.depth} is below the head's {head.num_layers} MTP layers.")
        self.taps = (target.num_layers,)  # tap L: the last layer's output (we apply the final norm)
        self.target = target
        self.reduced = None  # a draft vocabulary's head (vocab.py), used instead of each step's own

    @classmethod
    def build(cls, target, draft, options) -> MTPDrafter:
        """The target checkpoint's own MTP layers, the shipped graft, or a folder."""
        from ..checkpoints import find

        return cls(load_mtp(find("mtp", target.name, draft), target), target)

    can_reduce_vocabulary = True

    def reduce_vocabulary(self, ids) -> None:
        """Score only the tokens `ids` (vocab.py): every step's head is the target's, so one cut head serves all."""
        self.reduced = ReducedHead(self.target.lm_head, sorted(ids))

    def start(self, target, state, hidden) -> None:
        self.target = target
        self.caches = [DynamicCache() for _ in range(self.depth)]  # step j's K/V over positions 0..len_j-1
        H = target.hidden_size
        # pending[j]: layer j's hidden inputs for the committed positions it has not run yet
        self.pending = [torch.empty(1, 0, H, device=target.device, dtype=target.dtype) for _ in range(self.depth)]
        self._receive(hidden[target.num_layers])

    def observe(self, state, accepted, hidden) -> None:
        self._receive(hidden[self.target.num_layers])

    @torch.inference_mode()
    def _receive(self, h_last: torch.Tensor) -> None:
        """New target rows (tap L, [n, H]) for newly committed positions -> layer 0's queue."""
        h = self.target.final_norm(h_last)[None]  # [1, n, H], post-norm (see the module docstring)
        self.pending[0] = torch.cat([self.pending[0], h], dim=1)

    @torch.inference_mode()
    def propose(self, state, k, sampling, generator) -> Proposal:
        T = len(state.ids) - 1  # positions in the target cache; x_T = state.ids[-1] is `last`
        outputs = self._catch_up(state.ids, T, layers=min(k, self.depth))
        if outputs is None:  # a one-token prompt: no target hidden state to start from
            return Proposal([])
        committed = [cached_length(c) for c in self.caches]
        tokens, qs = [], []
        logits, last = outputs  # step 0: layer 0's logits and output at position T-1 (from the catch-up)
        chain = last[:, :0]  # the outputs of the step before, for the positions that used drafts
        for s in range(k):
            tokens.append(draft_token(logits, sampling, generator, qs))
            if s == k - 1:
                break
            j = (s + 1) % self.depth
            if s + 1 < self.depth:
                # Layer j ran every position up to T-1-j with committed tokens; its last j
                # positions (T-j..T-1) take the drafts d1..dj as their tokens, and layer j-1's
                # outputs there: one row from the catch-up, the rest from the step before.
                h_in = torch.cat([self.pending[j], chain], dim=1)  # [1, <=j, H]
                logits_all, chain = self._run(j, h_in, tokens[-h_in.shape[1] :])
                last = chain[:, -1:]
            else:
                # Past the trained depth: reuse layer j, one more position after its end (as vLLM).
                logits_all, last = self._run(j, last, tokens[-1:])
            logits = logits_all[0, -1]
        for cache, n in zip(self.caches, committed):
            crop_cache(cache, n)  # forget the positions that used draft tokens
        return Proposal(tokens, torch.stack(qs) if qs else None)

    def _catch_up(self, ids: list[int], T: int, layers: int):
        """Run layers 0..layers-1 over the committed positions they have not seen (teacher forcing).

        Layer j at position t reads token x_{t+j+1}, so it can run up to
        t = T-1-j with committed tokens. Its outputs queue up as layer j+1's
        inputs. Returns layer 0's (logits at T-1, output at T-1), or None.

        A round of k drafts reads layers 0..k-1 only, and only layer 0's
        logits here. So the layers a round will not read wait, their inputs
        queued, until a round with a larger k catches them up in one pass
        (causal attention gives the same rows in one pass as in many), and
        only layer 0 runs its head.
        """
        result = None
        for j in range(layers):
            start = cached_length(self.caches[j])
            m = min(T - j - start, self.pending[j].shape[1])
            if m <= 0:
                continue
            step_tokens = ids[start + j + 1 : start + j + 1 + m]
            logits, out = self._run(j, self.pending[j][:, :m], step_tokens, logits=j == 0)
            self.pending[j] = self.pending[j][:, m:]
            if j + 1 < self.depth:
                self.pending[j + 1] = torch.cat([self.pending[j + 1], out], dim=1)
            if j == 0:
                result = (logits[0, -1], out[:, -1:])
        if result is None and T > 0:
            raise RuntimeError("MTP drafter fell out of step with the target: call start() before propose().")
        return result

    def _run(self, j: int, h_in: torch.Tensor, tokens: list[int], logits: bool = True):
        """Layer j over len(tokens) new positions after its cache -> (logits [1, 1, V] or None, h [1, n, H]).

        Only the last position's token is ever drafted, so only its row goes through
        the output head: on a small target the head costs more than the layer.
        """
        cache = self.caches[j]
        past, n = cached_length(cache), len(tokens)
        device = h_in.device
        ids = torch.tensor([tokens], dtype=torch.long, device=device)  # [1, n]
        e = self.head.embed(ids)  # [1, n, H]
        positions = torch.arange(past, past + n, device=device)[None]  # [1, n]
        if self.head.layout == "deepseek_v3" and past == 0:
            e[:, 0] = 0  # vLLM zeroes the embedding at position 0 for DeepSeek MTP
        pe = self.target.rotary(e, positions)
        mask = causal_mask(past, n, e.dtype, device)
        step = self.head.step(j % self.head.num_layers)
        out, h_next = step.hidden(e, h_in, pe, mask, cache)
        return (self.reduced or step.head)(out[:, -1:]) if logits else None, h_next


# -- load and save (the names on disk: formats/mtp.py) ------------------------------


def load_mtp(checkpoint_dir, target) -> MTPHead:
    """The MTP head stored inside a target checkpoint directory (safetensors + config.json)."""
    layout, n = names.mtp_config(checkpoint_dir)
    tensors = names.read_mtp_tensors(checkpoint_dir, layout, target.num_layers) if n else {}
    if not n or not tensors:
        raise ValueError(
            f"The target checkpoint {checkpoint_dir} has no MTP weights (its config declares "
            f"{n} MTP layers and its files hold {len(tensors)} MTP tensors), so native MTP cannot draft "
            "for it. Use a checkpoint trained with MTP (Qwen3.5, Qwen3-Next, DeepSeek-V3), a grafted MTP "
            "head (method 'mtp' on smollm2-135m ships one), or another method."
        )
    head = MTPHead(target, n, layout)
    ours = names.from_checkpoint(tensors, layout, target.num_layers)
    load_strict(head, ours, f"The MTP weights in {checkpoint_dir} do not match an MTP head of this target "
                f"({layout} layout; does the directory belong to this target?)")
    head.chain_depth = read_config(checkpoint_dir).get("mtp_chain_depth")
    return head.to(device=target.device, dtype=target.dtype).eval()


def save_mtp(head: MTPHead, checkpoint_dir, target, config_extra: dict | None = None, dtype=None):
    """Write `head` into `checkpoint_dir` (``mtp.safetensors``) under the published names."""
    tensors = names.to_checkpoint(head.state_dict(), head.layout, target.num_layers, head.num_layers,
                                  target.embed_tokens.weight, target.lm_head.weight)
    return names.write_mtp(tensors, checkpoint_dir, head.layout, head.num_layers, config_extra, dtype)


