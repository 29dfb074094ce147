"""The target model: the large model whose output speculative decoding must
reproduce exactly.

`Target` wraps a Hugging Face causal LM and its KV cache with the four
operations the draft-verify loop needs:

* ``prefill(ids)``: run the prompt (all but its last token) to fill the cache;
* ``verify(state, drafts)``: ONE forward pass over ``[last, d1..dk]`` that
  returns k+1 rows of logits;
* ``commit(state, tokens)``: keep the accepted prefix, crop the cache to it;
* hidden-state *taps*: the residual stream at chosen layers, which EAGLE-3,
  DFlash, DSpark and MTP drafters read.

Tap numbering follows HF's ``output_hidden_states`` tuple: tap ``i`` is the
residual stream ENTERING decoder layer ``i`` (tap 0 = embedding output), and
tap ``L`` (L = number of layers) is the output of the last layer before the
final norm. EAGLE-3's "layer i" is tap i; DFlash's "layer i" (the OUTPUT of
layer i) is tap i+1. Only the requested taps are kept, caught with forward
hooks, rather than asking HF for every layer's hidden states.

The cache invariant: the target's KV cache always holds every committed token
except the last one (``state.ids[:-1]``). The last token has been chosen but
not yet run through the target; the next verify pass runs it first.

Keeping that invariant after a rejection means taking the rejected drafts back
out of the cache. How depends on the kind of layer (kv_cache.py):
full attention crops; sliding-window attention crops too, once told to keep
its past (`record_past`); linear attention (Qwen3.5, Qwen3-Next) cannot be
cropped before transformers 5.25, so verify snapshots its state and commit
replays the accepted rows (`LinearState`, `Target.commit`).
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import DynamicCache

from . import models
from .compat import cache_arg, cached_length
from .invariant import NotRowInvariant, is_row_invariant, make_row_invariant, not_invariant
from .kv_cache import (ATTENTION_TYPES, LinearState, Rollback, crop_cache, keep_path, keeps_every_position,
                       linear_mixers, record_past)
from .speedups import speed_up
from .tree import is_chain, tree_mask, tree_positions


@dataclass
class DecodeState:
    """Everything one generation carries from round to round."""

    ids: list[int]  # every committed token: prompt + generated; ids[-1] = `last`
    prompt_len: int
    cache: DynamicCache  # target K/V for ids[:-1]
    # Linear-attention targets only: the state before the last verify and what
    # each linear layer read during it, for `commit` to roll back (see LinearState).
    rollback: Rollback | None = None

    @property
    def num_cached(self) -> int:
        return len(self.ids) - 1


@dataclass
class TargetOutput:
    """What one target forward over n tokens gives back."""

    logits: torch.Tensor | None  # [n, V] next-token logits, or None when not asked for
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # tap -> [n, H]


class Target:
    """A causal LM + tokenizer, with prefill / verify / commit and hidden-state taps."""

    def __init__(self, model, tokenizer=None, name: str = "target"):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        cfg = model.config.get_text_config()
        self.config = cfg
        self.num_layers: int = cfg.num_hidden_layers
        self.hidden_size: int = cfg.hidden_size
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        eos = model.generation_config.eos_token_id
        if eos is None and tokenizer is not None:
            eos = tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos]) - {None}
        # Linear-attention layers' token mixers, by layer index: commit replays them (see `commit`).
        self.mixers: dict[int, torch.nn.Module] = linear_mixers(self.decoder, cfg)

    @property
    def row_invariant(self) -> bool:
        """Whether a row's result is independent of how many rows a forward computes (invariant.py)."""
        return is_row_invariant(self.model)

    @property
    def max_context(self) -> int | None:
        """The most positions the model reads (prompt + output), from its config; None when it says nothing."""
        return getattr(self.config, "max_position_embeddings", None)

    @property
    def can_roll_back(self) -> bool:
        """Whether rejected drafts can be taken back out of the cache.

        Attention layers crop (full and sliding-window alike, see `record_past`);
        Qwen3.5 / Qwen3-Next linear-attention layers are snapshotted and
        replayed (`commit`). Any other kind of layer (a Mamba or short-conv
        mixer, a layer that is attention and recurrence at once) is not
        handled here: such a target decodes without a drafter (vLLM keeps
        per-draft states for some of them: use backend="vllm").
        """
        types = getattr(self.config, "layer_types", None) or ()
        return all(kind in ATTENTION_TYPES or i in self.mixers for i, kind in enumerate(types))

    @cached_property
    def can_verify_tree(self) -> bool:
        """Whether a token tree can be verified in one pass: every cache layer keeps every position.

        A tree's rows are not consecutive positions, and only a full-attention
        layer can keep an arbitrary subset of them (`keep_path`). Sliding-window
        and linear-attention layers verify chains.
        """
        return not self.mixers and keeps_every_position(self.model.config)

    # -- the model's parts that drafters share ---------------------------
    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def decoder(self):
        return self.model.get_decoder()

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @property
    def final_norm(self) -> torch.nn.Module:
        return self.decoder.norm

    def rotary(self, x: torch.Tensor, positions: torch.Tensor):
        """(cos, sin) of the target's rotary embedding for a full-attention layer at `positions` [1, n]."""
        rope = self.decoder.rotary_emb
        if getattr(rope, "mrope_section", None) is not None:  # Qwen3.5: 3 position streams, equal for text
            positions = positions[None].expand(3, 1, -1)
        if "full_attention" in getattr(rope, "layer_types", ()):  # Gemma 3: one rotary per attention type
            return rope(x, positions, "full_attention")
        return rope(x, positions)

    # -- text <-> ids ----------------------------------------------------
    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of `prompt`, sent through the chat template when the model has one."""
        if self.tokenizer is None:
            raise ValueError(f"Target {self.name!r} has no tokenizer: pass token ids instead of text.")
        return encode(self.tokenizer, prompt, chat)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` ("" for a tokenizer-less target, which works on ids only)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token of `ids` as the text it adds, spaces shown as '·' and newlines as '↵'.

        The vocabulary's own names (`convert_ids_to_tokens`) are byte-level
        BPE's: GPT-2 maps every byte to a printable character, so a leading
        space reads 'Ġ' and a newline 'Ċ'. This shows what the token writes.
        """
        return [piece(self.tokenizer, t) for t in ids]

    # -- forward passes --------------------------------------------------
    @torch.inference_mode()
    def forward(self, state: DecodeState, tokens: list[int], taps=(), logits: bool = True,
                tree: list[int] | None = None) -> TargetOutput:
        """Run `tokens` after everything in the cache; the cache grows by len(tokens).

        tree: the parents of tokens[1:] (tree.py), tokens[0] being the root: each
        row then attends to the cache and its own ancestors only, at position
        (cache length + depth), instead of to every row before it.
        """
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, n]
        shape = {}
        if tree is not None:
            past = cached_length(state.cache)
            shape = dict(attention_mask=tree_mask(tree, past, self.dtype, self.device),  # [1, 1, n, past + n]
                         position_ids=tree_positions(tree, past, self.device))  # [1, n]
        with self._tapping(taps) as hidden:
            out = self.model(
                input_ids=input_ids,
                **cache_arg(state.cache),
                use_cache=True,
                **shape,
                # a slice, not an int: given an int, transformers 5.24 runs Gemma 4's KV-shared layers
                # on the last positions only, and the hidden-state taps need every position
                logits_to_keep=slice(-len(tokens) if logits else -1, None),
            )
        return TargetOutput(logits=out.logits[0] if logits else None, hidden=dict(hidden))

    def prefill(self, ids: list[int], taps=()) -> tuple[DecodeState, TargetOutput]:
        """A fresh DecodeState with the prompt (all but its last token) in the cache."""
        if not ids:
            raise ValueError("The prompt is empty: give the model some text to continue.")
        state = DecodeState(ids=list(ids), prompt_len=len(ids), cache=DynamicCache(config=self.model.config))
        if len(ids) == 1:  # nothing to prefill: the single token is `last`
            out = TargetOutput(logits=None, hidden={t: self._empty_hidden() for t in taps})
        else:
            out = self.forward(state, ids[:-1], taps, logits=False)
        # The prompt is committed; from here on positions may be rejected. Switching on
        # only now keeps a long prompt's K/V out of the sliding layers (HF's generate
        # waits for the prefill for the same reason).
        record_past(state.cache)
        return state, out

    def verify(self, state: DecodeState, drafts: list[int], taps=(), parents: list[int] | None = None) -> TargetOutput:
        """One forward over [last, d1..dk] -> logits [k+1, V] (+ taps [k+1, H]).

        parents: the drafts form a tree (tree.py); row 1 + i is then the target's
        distribution after node i's own root-to-node path. On a linear-attention
        target, first snapshot the linear state and keep what each linear layer
        reads, so that `commit` can roll back.
        """
        tokens = [state.ids[-1], *drafts]
        if parents is not None and not is_chain(parents):
            if not self.can_verify_tree:
                raise ValueError(f"{self.name} cannot verify a token tree (sliding-window or linear-attention "
                                 "layers): draft a chain.")
            return self.forward(state, tokens, taps, tree=parents)
        if not drafts or not self.mixers:  # nothing that could be rejected, or only attention layers
            return self.forward(state, tokens, taps)
        state.rollback = Rollback(LinearState.take(state.cache))
        with self._keeping_mixer_inputs(state.rollback.inputs):
            return self.forward(state, tokens, taps)

    def commit(self, state: DecodeState, tokens: list[int], path: list[int] | None = None) -> None:
        """Append the round's output tokens (accepted drafts + next) and take the rejected drafts out of the cache.

        verify ran [last, d1..dk]; the round output is d1..dn followed by the
        target's own token. The cache keeps [last, d1..dn] (n+1 = len(tokens)
        rows); d_{n+1}..d_k go: attention layers crop them, linear-attention
        layers roll back. After a tree, `path` lists the accepted nodes and the
        cache keeps [last, the path's nodes] (`keep_path`).

        Rolling back a linear-attention layer: its state after verify has
        folded in all k+1 rows and cannot un-fold the last k-n. So restore the
        state from before verify and run the layer's token mixer again on its
        first n+1 input rows, kept during verify. Only the mixers run, not the
        attention layers, MLPs or the LM head: a layer's state depends only on
        its own inputs, which causality left unchanged for the kept rows.

        What it costs, per round with a rejection: one copy of every linear
        layer's state (in verify, every round with drafts) and one pass of the
        linear mixers over n+1 rows (here), which reads the mixers' weights
        once more: on a GPU, where a forward over a few rows costs what reading
        the weights costs, up to the mixers' share of the active parameters
        (for Qwen3-Next-80B-A3B's published shapes about 1.2B of ~3B, so ~0.4
        of a forward), where replaying the whole model would cost a full one.
        vLLM needs no second pass: its kernels write the state at every draft
        position during verify and keep the accepted one.
        """
        if path is not None:  # a tree: the cache keeps `last` and the accepted path, in that order
            keep_path(state.cache, state.num_cached + 1, path)
            state.ids.extend(tokens)
            return
        state.ids.extend(tokens)
        rollback, state.rollback = state.rollback, None
        if rollback is not None and len(tokens) < rollback.rows:  # some drafts rejected
            self._replay_mixers(state, rollback, rows=len(tokens))
        crop_cache(state.cache, state.num_cached)

    @torch.inference_mode()
    def _replay_mixers(self, state: DecodeState, rollback: Rollback, rows: int) -> None:
        """Put every linear layer back where the first `rows` verified rows leave it."""
        rollback.before.restore(state.cache)
        for i, mixer in self.mixers.items():
            rows_in = rollback.inputs[i][:, :rows]  # [1, rows, H]
            mixer(hidden_states=rows_in, **cache_arg(state.cache, old="cache_params"))

    @contextmanager
    def _keeping_mixer_inputs(self, inputs: dict[int, torch.Tensor]):
        """During one forward, keep what each linear layer's token mixer reads ([1, n, H])."""

        def keep(i):
            def hook(_module, args, kwargs):
                inputs[i] = args[0] if args else kwargs["hidden_states"]
            return hook

        handles = [m.register_forward_pre_hook(keep(i), with_kwargs=True) for i, m in self.mixers.items()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    # -- hidden-state taps -------------------------------------------------
    @contextmanager
    def _tapping(self, taps):
        """Catch the residual stream at the requested taps during one forward."""
        hidden: dict[int, torch.Tensor] = {}
        handles = []
        layers = self.decoder.layers
        for tap in taps:
            if not 0 <= tap <= self.num_layers:
                raise ValueError(f"Tap {tap} is outside 0..{self.num_layers} for a {self.num_layers}-layer target.")

            def keep(_module, _inputs, output, tap=tap):
                h = output[0] if isinstance(output, tuple) else output
                hidden[tap] = h[0]  # [n, H], batch of one

            # Tap i = the residual stream entering layer i = the output of layer i-1
            # (tap 0 = the embedding output).
            module = self.embed_tokens if tap == 0 else layers[tap - 1]
            handles.append(module.register_forward_hook(keep))
        try:
            yield hidden
        finally:
            for handle in handles:
                handle.remove()

    def _empty_hidden(self) -> torch.Tensor:
        return torch.empty(0, self.hidden_size, device=self.device, dtype=self.dtype)

    def sync(self) -> None:
        """Wait for queued GPU work, so wall-clock timings mean something."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def piece(tokenizer, token: int) -> str:
    """One token as the text it adds, whitespace made visible (see Target.pieces); <id> without a tokenizer."""
    text = tokenizer.decode([token]) if tokenizer is not None else f"<{token}>"
    return text.replace("\n", "\u21b5").replace(" ", "\u00b7") or "\u2205"


def encode(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of `prompt`, sent through the chat template when the tokenizer has one.

    Both backends encode with this, so the readable loop and vLLM see the same ids.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("The prompt is empty: give the model some text to continue.")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # bytes that were not UTF-8 arrive as lone surrogates
        raise ValueError(f"The prompt is not valid UTF-8 text (at character {err.start}): save it as UTF-8.") from None
    if chat and tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def now(target: Target | None = None) -> float:
    if target is not None:
        target.sync()
    return time.perf_counter()


def load(name_or_path: str = "smollm2-135m", dtype=None, device: str | None = None, cache_dir=None,
         invariant: bool = True, speedups: bool = True) -> Target:
    """Load a target: 'smollm2-135m' or 'gemma3-270m' (embedded, offline), a local HF directory, or a hub id.

    dtype: 'fp32', 'bf16', 'fp16', 'auto' (what the device runs best) or a torch dtype; default fp32 on a
    CPU, bf16 on a GPU.
    device: 'cpu', 'cuda' (CUDA and ROCm alike); default: a GPU when there is one.
    cache_dir: where the embedded model is converted to (default: see `models`).
    invariant: on a CPU, make each row of a forward independent of how many rows the pass computes
    (invariant.py), so speculation reproduces plain decoding to the bit (a NotRowInvariant warning says why
    where it cannot); False keeps torch's own kernels.
    speedups: the CPU speed-ups of speedups.py, which change no number; False leaves them out.
    """
    model, tokenizer = models.load_hf(name_or_path, dtype=dtype, device=device, cache=cache_dir)
    if invariant and not make_row_invariant(model) and model.device.type == "cpu":
        warnings.warn(NotRowInvariant(f"{name_or_path} keeps torch's own kernels: {not_invariant(model)}; greedy "
                                      "speculation may differ from plain decoding in near-ties"), stacklevel=2)
    if speedups:
        speed_up(model)
    return Target(model, tokenizer, name=name_or_path)
