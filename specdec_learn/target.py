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
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from . import models


@dataclass
class DecodeState:
    """Everything one generation carries from round to round."""

    ids: list[int]  # every committed token: prompt + generated; ids[-1] = `last`
    prompt_len: int
    cache: DynamicCache  # target K/V for ids[:-1]

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

    @property
    def max_context(self) -> int | None:
        """The most positions the model reads (prompt + output), from its config; None when it says nothing."""
        return getattr(self.config, "max_position_embeddings", None)

    @property
    def can_roll_back(self) -> bool:
        """Whether rejected drafts can be taken back out of the cache.

        Attention caches crop: drop the last positions and they were never
        there. Linear-attention layers (Qwen3.5, Qwen3-Next) fold every token
        into one recurrent state, which cannot be un-folded, so speculation on
        such a target needs per-draft state snapshots that this loop does not
        keep (vLLM does: use backend="vllm").
        """
        return "linear_attention" not in (getattr(self.config, "layer_types", None) or ())

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

    # -- text <-> ids ----------------------------------------------------
    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of `prompt`, sent through the chat template when the model has one."""
        if self.tokenizer is None:
            raise ValueError(f"Target {self.name!r} has no tokenizer: pass token ids instead of text.")
        return encode(self.tokenizer, prompt, chat)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` ("" for a tokenizer-less target, which works on ids only)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    # -- forward passes --------------------------------------------------
    @torch.inference_mode()
    def forward(self, state: DecodeState, tokens: list[int], taps=(), logits: bool = True) -> TargetOutput:
        """Run `tokens` after everything in the cache; the cache grows by len(tokens)."""
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, n]
        with self._tapping(taps) as hidden:
            out = self.model(
                input_ids=input_ids,
                past_key_values=state.cache,
                use_cache=True,
                logits_to_keep=len(tokens) if logits else 1,
            )
        return TargetOutput(logits=out.logits[0] if logits else None, hidden=dict(hidden))

    def prefill(self, ids: list[int], taps=()) -> tuple[DecodeState, TargetOutput]:
        """A fresh DecodeState with the prompt (all but its last token) in the cache."""
        if not ids:
            raise ValueError("The prompt is empty: give the model some text to continue.")
        state = DecodeState(ids=list(ids), prompt_len=len(ids), cache=DynamicCache(config=self.model.config))
        if len(ids) == 1:  # nothing to prefill: the single token is `last`
            return state, TargetOutput(logits=None, hidden={t: self._empty_hidden() for t in taps})
        return state, self.forward(state, ids[:-1], taps, logits=False)

    def verify(self, state: DecodeState, drafts: list[int], taps=()) -> TargetOutput:
        """One forward over [last, d1..dk] -> logits [k+1, V] (+ taps [k+1, H])."""
        return self.forward(state, [state.ids[-1], *drafts], taps)

    def commit(self, state: DecodeState, tokens: list[int]) -> None:
        """Append the round's output tokens (accepted drafts + next) and crop the cache.

        verify ran [last, d1..dk]; the round output is d1..dn followed by the
        target's own token. The K/V of [last, d1..dn] stay; d_{n+1}..d_k go.
        """
        state.ids.extend(tokens)
        crop_cache(state.cache, state.num_cached)

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


def crop_cache(cache: DynamicCache, keep: int) -> None:
    """Drop every cached position from `keep` on (the rejected drafts)."""
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)  # a negative count removes that many positions from the end


def now(target: Target | None = None) -> float:
    if target is not None:
        target.sync()
    return time.perf_counter()


def load(name_or_path: str = "smollm2-135m", dtype=None, device: str | None = None, cache_dir=None) -> Target:
    """Load a target: 'smollm2-135m' (embedded, offline), a local HF directory, or a hub id.

    dtype: 'fp32', 'bf16', 'fp16' or a torch dtype; default fp32 on a CPU, bf16 on a GPU.
    device: 'cpu', 'cuda' (CUDA and ROCm alike); default: a GPU when there is one.
    cache_dir: where the embedded model is converted to (default: see `models`).
    """
    model, tokenizer = models.load_hf(name_or_path, dtype=dtype, device=device, cache=cache_dir)
    return Target(model, tokenizer, name=name_or_path)
