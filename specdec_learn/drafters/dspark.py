"""DSpark: a DFlash block drafter that knows what it just drafted, and how sure it is.

DSpark (DeepSeek, DeepSpec) keeps DFlash's backbone (dflash.py: one forward
over a block, target context as extra K/V in every layer, no causal mask) and
changes three things.

1. **The anchor is the first prediction.** The block is still
   ``[x_p, MASK x (B-1)]``, but slot j predicts ``x_{p+j+1}``: slot 0, the
   anchor's own slot, already guesses the next token. So all B slots are
   drafts and ``max_k = B`` (DFlash: B - 1).

2. **The Markov head.** A parallel drafter guesses every slot at once, so
   slot j cannot know which token slot j-1 picked; two plausible
   continuations get mixed ("of the the"). DSpark adds a low-rank bigram
   table over the vocabulary,

       bias_j = W2 · W1[prev_j]          W1: [V, r] embedding, W2: [r -> V]

   with ``prev_0`` = the anchor and ``prev_{j+1}`` = the token chosen at slot
   j. Drafting becomes a cheap left-to-right pass over the block's logits:
   pick slot 0, look up its bias row for slot 1, pick slot 1, ... Each slot's
   distribution is still an exact categorical (base logits + a bias), so the
   rejection sampler stays lossless under sampling. With a draft vocabulary
   (vocab.py) the bias is computed over its tokens only (`markov_bias`).

3. **The confidence head.** ``c_j = σ(proj([h_j; W1[prev_j]]))`` predicts the
   chance that slot j is accepted *given* the previous ones were (trained
   against the analytic acceptance rate 1 - TV(q_j, p_j)). The product
   ``s_j = c_0 · ... · c_j`` is the chance the whole prefix up to j survives.
   With a **gate** threshold the drafter submits only the prefix whose
   survival stays at or above it: a round that would have wasted verify
   rows on hopeless drafts verifies fewer. (vLLM's seed experiments loaded
   this head but did not gate on it; DeepSpec's eval cuts at the first
   c_j < threshold, here it is the product.)

Both heads can be switched off at decode time (``markov=False``,
``gate=None``) on the same weights: that is the ablation the book measures.

Tap numbering. DSpark's ``target_layer_ids`` use DFlash's convention (i = the
output of layer i = tap i + 1) plus ``-1`` = the embedding output = tap 0;
the same ``i + 1`` covers both.

Formats: DeepSpec's ``Qwen3DSparkModel`` (with the draft's own embedding and
LM head; formats/deepspec.py) and speculators' ``dspark`` (formats/
speculators.py: speculators' own saves carry the verifier's embedding and
head, which load; ours name the verifier instead, from which speculators
loads them). The shipped SmolLM2 drafter uses the speculators one: it stays small.

Only the ``vanilla`` Markov head is implemented (vLLM too); a ``gated`` or
``rnn`` checkpoint is refused with a message.
"""

from __future__ import annotations

import torch
from torch import nn

from ..formats import deepspec, speculators
from ..formats.io import load_strict, read_config
from ..sampling import draft_token
from ..tree import best_first, top_candidates
from ..vocab import ReducedHead
from .base import Proposal
from .dflash import DFlashDrafter, DFlashModel, draft_config, slot_probabilities


# -- the network -----------------------------------------------------------------------


class MarkovHead(nn.Module):
    """bias(prev) = W2 · W1[prev]: a rank-r bigram table over the target vocabulary."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)  # W1: [V, r]
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)  # W2: [V, r] as a map r -> V

    def prev_embedding(self, prev: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> W1 rows [..., r]."""
        return self.markov_w1(prev)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> logit biases [..., V]."""
        return self.markov_w2(self.prev_embedding(prev))


class ConfidenceHead(nn.Module):
    """c = σ(proj(features)): the chance a slot is accepted if its prefix was."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> confidence LOGITS [...] (σ gives c)."""
        return self.proj(features).squeeze(-1)


def biased(row: torch.Tensor, prev: int, markov: nn.Module | None) -> torch.Tensor:
    """A slot's logits [V] after the token `prev`: base + W2·W1[prev] (no Markov head: base alone)."""
    if markov is None:
        return row
    return row + markov(torch.tensor(prev, device=row.device)).to(row.dtype)


def markov_draft(base_logits: torch.Tensor, anchor: int, markov: nn.Module | None, pick):
    """Left to right over the block: slot j's logits = base_j + W2·W1[prev_j].

    base_logits [k, V]; `pick(logits_row) -> token id` (argmax or a sample).
    Returns (tokens [k], each slot's final logits [V] x k, the prev ids used [k]).
    """
    tokens, rows, prevs = [], [], []
    prev = anchor
    for j in range(base_logits.shape[0]):
        row = biased(base_logits[j], prev, markov)
        prevs.append(prev)
        prev = pick(row)
        tokens.append(prev)
        rows.append(row)
    return tokens, rows, prevs


def gated_length(confidence: torch.Tensor, threshold: float) -> int:
    """How many drafts to submit: the longest prefix whose survival Π c stays >= threshold.

    confidence [k] holds c_j in (0, 1). Survival only falls along the block,
    so the kept drafts are exactly those with cumprod(c)_j >= threshold.
    """
    survival = torch.cumprod(confidence.double(), dim=0)  # [k]
    return int((survival >= threshold).sum())


class DSparkModel(DFlashModel):
    """DFlash backbone + MarkovHead + ConfidenceHead (+ own embed_tokens/lm_head in DeepSpec's format).

    Extra config attributes: markov_rank (0 = no head), markov_head_type,
    enable_confidence_head, confidence_head_with_markov, num_anchors.
    """

    def __init__(self, config, target_hidden_size=None, own_embeddings: bool = False, own_lm_head: bool | None = None):
        super().__init__(config, target_hidden_size)
        H, V, r = config.hidden_size, config.vocab_size, int(getattr(config, "markov_rank", 0))
        self.markov_head = MarkovHead(V, r) if r > 0 else None
        self.confidence_head = None
        if getattr(config, "enable_confidence_head", False):
            with_markov = bool(getattr(config, "confidence_head_with_markov", False))
            if with_markov and self.markov_head is None:
                raise ValueError("confidence_head_with_markov needs a Markov head (markov_rank > 0).")
            self.confidence_head = ConfidenceHead(H + (r if with_markov else 0))
        self.embed_tokens = nn.Embedding(V, H) if own_embeddings else None
        self.lm_head = nn.Linear(H, V, bias=False) if (own_embeddings if own_lm_head is None else own_lm_head) else None

    def confidence_logits(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """hidden [..., H], prev ids [...] -> confidence logits [...]."""
        features = hidden
        if self.config.confidence_head_with_markov:
            features = torch.cat([hidden, self.markov_head.prev_embedding(prev).to(hidden.dtype)], dim=-1)
        return self.confidence_head(features)


def dspark_config(target, num_layers=1, block_size=7, markov_rank=32, confidence=True, **kw):
    """A SmolLM2-sized DSpark config (see dflash.draft_config for the backbone)."""
    cfg = draft_config(target, num_layers=num_layers, block_size=block_size, **kw)
    cfg.markov_rank = markov_rank
    cfg.markov_head_type = "vanilla"
    cfg.enable_confidence_head = confidence
    cfg.confidence_head_with_markov = confidence and markov_rank > 0
    cfg.num_anchors = 64
    return cfg


# -- the drafter -----------------------------------------------------------------------


class DSparkDrafter(DFlashDrafter):
    """Up to B drafts a round: Markov-biased left-to-right picks, cut by the survival gate.

    markov: add the Markov bias (when the checkpoint has the head).
    gate:   survival threshold in (0, 1]; None = submit all k drafts.
    """

    name = "dspark"

    def __init__(self, model: DSparkModel, markov: bool = True, gate: float | None = None):
        super().__init__(model)
        self.max_k = self.block_size
        if markov and model.markov_head is None:
            raise ValueError("This DSpark checkpoint has no Markov head (markov_rank 0): use markov=False.")
        if gate is not None:
            if model.confidence_head is None:
                raise ValueError("The confidence gate needs a confidence head; this checkpoint has none (gate=None).")
            if not 0.0 < gate <= 1.0:
                raise ValueError(f"gate is a survival threshold in (0, 1], got {gate}.")
        self.markov = model.markov_head if markov else None
        self.gate = gate

    @classmethod
    def build(cls, target, draft, options) -> DSparkDrafter:
        """The shipped DSpark drafter, or a folder; the Markov head and the gate as options say."""
        from ..checkpoints import find

        model = load_dspark(find("dspark", target.name, draft), dtype=target.dtype)
        return cls(model, markov=options.markov and model.markov_head is not None, gate=options.gate)

    def _slots_explained(self) -> str:
        return "every slot, the anchor's included, is a draft"

    def _check_taps(self, target) -> None:
        super()._check_taps(target)
        if target.num_layers in self.taps:  # DeepSpec's eval asserts the same (assert_no_final_target_layer)
            raise ValueError(
                f"DSpark target_layer_ids include the final layer {target.num_layers - 1}: HF's hidden_states "
                "stores it after the final norm, training caches before it, so DeepSpec refuses such a tap; "
                "use an earlier layer."
            )

    def embed(self, ids):
        own = self.model.embed_tokens
        return own(ids) if own is not None else self.target.embed_tokens(ids)

    def full_head(self):
        own = self.model.lm_head  # DeepSpec's checkpoints carry a copy of the target's
        return own if own is not None else self.target.lm_head

    def markov_bias(self) -> nn.Module | None:
        """The Markov head drafting uses: cut to the draft vocabulary when there is one (None: no bias).

        W2 maps r -> V: for SmolLM2 49,152 x 32 weights (3 MB in bf16), read at
        every drafted slot for one row of biases. With a draft vocabulary the
        base logits are -inf outside it, so the bias there changes nothing: the
        cut reads W2's V_d rows (a vocab.ReducedHead, -inf elsewhere) and the
        drafts and their probabilities stay the same.
        """
        if self.markov is None or self.draft_ids is None:
            return self.markov
        if "markov" not in self.heads:  # built, and dropped, with DFlash's head (self.heads)
            w1, w2 = self.markov.markov_w1, self.markov.markov_w2
            self.heads["markov"] = nn.Sequential(w1, ReducedHead(w2, self.draft_ids))  # ids -> [.., r] -> [.., V]
        return self.heads["markov"]

    @torch.inference_mode()
    def propose(self, state, k, sampling, generator) -> Proposal:
        hidden = self.block_hidden(state)[:k]  # [k, H]; slot j predicts x_{p+j+1}
        base = self.logits(hidden)  # [k, V]
        qs = []

        def pick(row):
            return draft_token(row, sampling, generator, qs)

        tokens, _, prevs = markov_draft(base, state.ids[-1], self.markov_bias(), pick)
        if self.gate is not None:
            prev = torch.tensor(prevs, device=hidden.device)
            confidence = torch.sigmoid(self.model.confidence_logits(hidden, prev).float())  # [k]
            tokens = tokens[: gated_length(confidence, self.gate)]
        q = torch.stack(qs[: len(tokens)]) if qs and tokens else None
        return Proposal(tokens, q)

    def propose_tree(self, state, tree, sampling, generator) -> Proposal:
        """A tree from each slot's candidates; with the Markov head, a node's children see its token.

        Slot d's logits for a child of node u are base_d + W2·W1[token of u]:
        the same left-to-right bias as the chain, applied per branch. The gate
        does not prune trees: the node budget already bounds the verify cost.
        """
        hidden = self.block_hidden(state)[: tree.depth]  # [depth, H]; slot d predicts depth d + 1
        anchor, markov = state.ids[-1], self.markov_bias()
        with torch.inference_mode():
            base = self.logits(hidden)  # [depth, V]: the LM head once per slot; nodes differ only by the bias

        @torch.inference_mode()
        def expand(path):
            row = biased(base[len(path)], path[-1] if path else anchor, markov)  # [V]
            return top_candidates(slot_probabilities(row[None], sampling)[0], tree.branch)

        tokens, parents, _ = best_first(expand, tree)
        return Proposal(tokens, parents=parents)


# -- load and save (the formats themselves: formats/deepspec.py, formats/speculators.py) --


def load_dspark(path, dtype=None) -> DSparkModel:
    """A DeepSpec (`Qwen3DSparkModel`) or speculators (`dspark`) checkpoint directory -> DSparkModel.

    The embedding and LM head are the model's own when the folder carries them (see the module docstring).
    """
    d = read_config(path, "a DSpark checkpoint")
    if speculators.is_dspark(d):
        cfg, weights = speculators.read_dspark(path, d)
    elif deepspec.is_deepspec(d):
        cfg, weights = deepspec.read_dspark(path, d)
    else:
        raise ValueError(
            f"{path} is neither a DeepSpec DSpark checkpoint (architectures Qwen3DSparkModel) "
            f"nor a speculators one (speculators_model_type 'dspark')."
        )
    model = DSparkModel(cfg, weights["fc.weight"].shape[1] // len(cfg.target_layer_ids),
                        own_embeddings="embed_tokens.weight" in weights, own_lm_head="lm_head.weight" in weights)
    load_strict(model, weights, f"DSpark checkpoint {path}")
    return model.to(dtype) if dtype is not None else model


def save_dspark(model: DSparkModel, path, format: str = "speculators", target=None, dtype=torch.bfloat16,
                verifier: str | None = None, with_verifier_tensors: bool = False):
    """Write `model` as a speculators `dspark` or a DeepSpec `Qwen3DSparkModel` checkpoint.

    speculators: `verifier` (default: the target's hub id, when `target` is given) goes into
    ``speculators_config.verifier``, from which speculators' ``from_pretrained`` loads the embedding
    and LM head; `with_verifier_tensors` writes them into the folder too (speculators' own layout,
    but 2 x 57 MB for SmolLM2). DeepSpec's format always holds them: pass `target` when the model
    borrows the target's.
    """
    state = model.state_dict()
    owner = model if model.embed_tokens is not None else target
    if format == "speculators":
        if verifier is None and target is not None:  # a hub id the readers can resolve, not our cache folder
            from ..models import EMBEDDED

            verifier = EMBEDDED.get(target.name, {}).get("hf_id") or target.model.config.name_or_path or target.name
        architectures = list(getattr(target.model.config, "architectures", None) or []) if target is not None else []
        if with_verifier_tensors:
            if owner is None:
                raise ValueError("with_verifier_tensors: pass target= to copy the target's embedding and LM head.")
            state = {**state, "embed_tokens.weight": owner.embed_tokens.weight, "lm_head.weight": owner.lm_head.weight}
        return speculators.write_dspark(model.config, state, model.fc.in_features // len(model.config.target_layer_ids),
                                        path, dtype, speculators.verifier_config(verifier, architectures),
                                        with_verifier_tensors)
    if format != "deepspec":
        raise ValueError(f"format must be 'speculators' or 'deepspec', got {format!r}.")
    if owner is None:
        raise ValueError("DeepSpec's format stores embed_tokens and lm_head: pass target= to copy the target's.")
    return deepspec.write_dspark(model.config, state, owner.embed_tokens.weight, owner.lm_head.weight, path, dtype)
