"""The book's coding labs: the reader writes one function of a method, the library grades it.

A lab's cell in the chapter is a function whose body raises
NotImplementedError; its check runs that function through the library's own
harness on fixed and random cases and compares with the library's function
(or, for rejection sampling, with the target distribution through chapter 2's
chi-square test). The verdict names the first case the function gets wrong
and, when the result matches a mistake readers make, what that mistake is.
Until the body is written, the check says the lab is not answered yet
(exercises.check).

    lab    the reader writes            graded against
    2.3    speculative_sample           the target distribution p (chi-square)
    3.3    ngram_propose                drafters.ngram.find_continuation
    5.4    centroid_logits              transformers' Gemma4AssistantMaskedEmbedder
    6.4    eagle3_first_draft           Eagle3Model's fuse, layer and head
    8.4    survival_gate                drafters.dspark.gated_length
    13.3   longest_match                drafters.suffix.match
    14.3   accept_walk                  verify.greedy_accept
    14.4   tree_visibility              tree.tree_mask

The reference solutions are in book/solutions.py, outside the package.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from .exercises import Unanswered, Wrong, exercise


def run(fn, *args):
    """The reader's fn(*args); NotImplementedError means not answered yet, any other error is a hint."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise Unanswered from None
    except Exception as err:  # the reader's bug, reported as a hint, not a traceback
        raise Wrong(f"your function raised {type(err).__name__}: {err}") from None


def case(call: str, got, expected, why: str = "") -> Wrong:
    """A failing case, said as the call, what came back and what should have."""
    return Wrong(f"{call} returned {got!r}, expected {expected!r}." + (f" {why}" if why else ""))


# --- 2.3: rejection sampling with its residual ------------------------------------------

SAMPLING_CASES = [  # (p, q): chapter 2's pair, a drafter surer than the target, a token the drafter never drafts
    ((0.5, 0.35, 0.15), (0.2, 0.3, 0.5)),
    ((0.25, 0.25, 0.25, 0.25), (0.7, 0.1, 0.1, 0.1)),
    ((0.3, 0.3, 0.4), (0.5, 0.5, 0.0)),
]
DRAWS = 6000  # per case: enough to tell each known mistake from p at a p-value far below THRESHOLD
THRESHOLD = 1e-3  # a chi-square p-value below this says the outputs do not follow p


def p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit of counts [V] to the distribution expected [V] (zeros skipped)."""
    n, keep = counts.sum(), expected > 0
    if (counts[~keep] > 0).any():
        return 0.0  # a token with probability 0 came out
    e = expected[keep] * n
    chi2 = ((counts[keep] - e) ** 2 / e).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), chi2 / 2)) if df else 1.0


def outputs_if(p: torch.Tensor, q: torch.Tensor, keep: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """The distribution of the emitted token when x ~ q is kept with probability keep[x], else a draw from rest."""
    kept = q * keep
    return kept + (1 - kept.sum()) * rest


def sampling_mistakes(p: torch.Tensor, q: torch.Tensor):
    """(what the outputs follow, the hint) for each mistake readers make."""
    ratio = torch.where(q > 0, p / q.clamp_min(1e-12), torch.ones_like(p)).clamp(max=1)
    residual = (p - q).clamp_min(0)
    residual = residual / residual.sum() if residual.sum() > 0 else p
    return [
        (q, "every draft is kept: the outputs follow q, not p. Some drafts must be rejected."),
        (outputs_if(p, q, ratio, p), "after a rejection you drew from p itself, which counts the mass already "
                                     "accepted twice: the replacement must come only from what p has beyond q."),
        (outputs_if(p, q, (q / p.clamp_min(1e-12)).clamp(max=1), residual),
         "the acceptance probability is upside down: a token the drafter over-proposes must be kept LESS often."),
        (outputs_if(p, q, ratio, q), "after a rejection you drew from q again, the distribution that was just "
                                     "rejected: the replacement must come from what p has beyond q."),
    ]


@exercise("2.3")
def _speculative_sample(fn):
    for p_, q_ in SAMPLING_CASES:
        p, q = torch.tensor(p_, dtype=torch.float64), torch.tensor(q_, dtype=torch.float64)
        generator = torch.Generator().manual_seed(0)
        counts = torch.zeros(len(p), dtype=torch.float64)
        for x in torch.multinomial(q, DRAWS, replacement=True, generator=generator).tolist():
            token = run(fn, p.clone(), q.clone(), x, generator)
            if not isinstance(token, int) and not (torch.is_tensor(token) and token.numel() == 1):
                raise Wrong(f"return the emitted token as an int, got {type(token).__name__} for p = {list(p_)}.")
            if not 0 <= int(token) < len(p):
                raise Wrong(f"token {int(token)} is not in the vocabulary 0..{len(p) - 1} (p = {list(p_)}).")
            counts[int(token)] += 1
        if p_value(counts, p) >= THRESHOLD:
            continue
        seen = ", ".join(f"{c / DRAWS:.3f}" for c in counts.tolist())
        for follows, why in sampling_mistakes(p, q):
            if p_value(counts, follows) >= THRESHOLD:
                raise Wrong(f"for p = {list(p_)}, q = {list(q_)} your tokens came out with frequencies {seen}: {why}")
        raise Wrong(f"for p = {list(p_)}, q = {list(q_)} your tokens came out with frequencies {seen}, which is "
                    "not p. Check the two halves apart: how often a draft is kept, and what is drawn after a "
                    "rejection (chapter 2's proof says what each must be).")
    return (f"Correct: over {len(SAMPLING_CASES)} pairs (p, q) and {DRAWS:,} draws each, your tokens follow p "
            f"(chi-square p-value >= {THRESHOLD}): speculative sampling is lossless.")


# --- 3.3: the n-gram lookup -------------------------------------------------------------


def earliest_match(ids, k, min_n, max_n):
    """find_continuation with the OLDEST earlier match instead of the most recent: a mistake to diagnose."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        for start in range(len(ids) - n):
            if ids[start:start + n] == ids[-n:]:
                return ids[start + n:start + n + k]
    return []


def ngram_cases(count: int = 300):
    """(ids, k, min_n, max_n): hand-picked ones first, then random sequences over small vocabularies."""
    yield [5, 6, 7, 1, 2, 5, 6], 2, 1, 3  # exercise 3.1
    yield [1, 2, 3, 4], 3, 1, 2  # nothing repeats
    yield [7, 7, 7, 7], 3, 1, 3  # a match that runs into the suffix itself
    yield [1, 2, 9, 3, 1, 2, 8, 3, 1, 2], 2, 1, 3  # two earlier matches: the most recent wins
    rng = random.Random(0)
    for _ in range(count):
        min_n = rng.randint(1, 2)
        yield ([rng.randrange(rng.randint(2, 5)) for _ in range(rng.randint(1, 16))], rng.randint(1, 5), min_n,
               rng.randint(min_n, 4))


@exercise("3.3")
def _ngram_propose(fn):
    from .drafters.ngram import find_continuation
    for ids, k, min_n, max_n in ngram_cases():
        expected = find_continuation(ids, k, min_n, max_n)
        got = run(fn, list(ids), k, min_n, max_n)
        if got is None or list(got) != expected:
            got = got if got is None else list(got)
            why = ("take the MOST RECENT earlier occurrence: scan from right to left."
                   if got == earliest_match(ids, k, min_n, max_n) else
                   "try the longest n first (up to max_n, and at most len(ids) - 1), then shorter ones down to min_n; "
                   "copy up to k tokens after an EARLIER occurrence of the last n tokens.")
            raise case(f"ngram_propose({ids}, k={k}, min_n={min_n}, max_n={max_n})", got, expected, why)
    return "Correct: your lookup agrees with find_continuation on every case, hand-picked and random."


# --- 5.4: the Gemma 4 assistant's centroid-masked logits ---------------------------------


def centroid_case(seed: int, hidden: int = 16, vocab: int = 64, num_centroids: int = 8, top_k: int = 3):
    """Random (d [H], centroids [C, H], token_ordering [V], lm_head [V, H], top_k), and transformers' logits."""
    from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantMaskedEmbedder

    torch.manual_seed(seed)
    text = SimpleNamespace(hidden_size=hidden, vocab_size=vocab)
    config = SimpleNamespace(centroid_intermediate_top_k=top_k, num_centroids=num_centroids,
                             get_text_config=lambda: text)
    embedder = Gemma4AssistantMaskedEmbedder(config)
    torch.nn.init.normal_(embedder.centroids.weight)
    embedder.token_ordering = torch.randperm(vocab)
    d, lm_head = torch.randn(hidden), torch.randn(vocab, hidden)
    with torch.no_grad():
        out = embedder(d[None, None], lm_head)[0, 0]  # [V]; outside the top groups: min - 1
    expected = out.masked_fill(out == out.min(), float("-inf"))  # no probability at all, as vLLM and the drafter
    return (d, embedder.centroids.weight.detach().clone(), embedder.token_ordering.clone(), lm_head, top_k), expected


@exercise("5.4")
def _centroid_logits(fn):
    for seed in range(5):
        args, expected = centroid_case(seed)
        got = run(fn, *[a.clone() if torch.is_tensor(a) else a for a in args])
        if not torch.is_tensor(got) or got.shape != expected.shape:
            raise Wrong(f"return the logits as a tensor of shape {list(expected.shape)} (one per token), "
                        f"got {getattr(got, 'shape', type(got).__name__)}.")
        outside = torch.isneginf(expected)
        if not torch.isneginf(got).any():
            raise Wrong("every token got a score: the tokens outside the top_k centroids' groups get -inf "
                        "(no probability at all).")
        if not torch.equal(torch.isneginf(got), outside):
            raise Wrong(f"case {seed}: you kept the wrong tokens. Group c is token_ordering[c * V/C:(c + 1) * V/C] "
                        "(the ordering puts the tokens of one centroid side by side); keep the groups of the top_k "
                        "centroid scores d @ centroids.T.")
        if not torch.allclose(got[~outside].double(), expected[~outside].double(), atol=1e-4, rtol=1e-4):
            raise Wrong(f"case {seed}: the kept tokens are right but their scores are not: a kept token's logit is "
                        "d @ lm_head[token], the same dot product the dense head computes.")
    return "Correct: your logits equal the assistant's own masked embedder on every case, -inf outside the groups."


# --- 6.4: one EAGLE-3 fuse-and-step ------------------------------------------------------


def tiny_eagle3(seed: int = 0):
    """A random EAGLE-3 drafter: H = 32, 4 heads, a target vocabulary of 50, a draft vocabulary of 24."""
    from .drafters.eagle3 import Eagle3Model
    from .formats.speculators import Eagle3Config

    torch.manual_seed(seed)
    layer = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
             "head_dim": 8, "rope_theta": 1e4, "max_position_embeddings": 256, "intermediate_size": 64,
             "vocab_size": 50, "num_hidden_layers": 1, "rms_norm_eps": 1e-6}
    model = Eagle3Model(Eagle3Config(layer, 24, (1, 4, 7))).eval()
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.3)
    model.embed_tokens = torch.nn.Embedding(50, 32)
    model.set_vocab(torch.randperm(50)[:24])
    return model


@torch.inference_mode()
def first_draft(model, taps, token: int) -> tuple[int, int]:
    """The library's first draft from fresh taps: (draft-vocabulary id, target id)."""
    layer = model.layers[0]
    g = model.fuse(torch.cat(taps, dim=-1))  # [1, H]
    emb = model.embed(torch.tensor([token]))  # [1, H]
    cos, sin = model.rope(torch.tensor([0]))
    q, k, v = layer.qkv(emb, g, cos, sin)
    x = layer.finish(g, layer.attend(q, k, v, torch.ones(1, 1, dtype=torch.bool)))  # [1, H]
    draft_id = int(model.logits(x)[0].argmax())
    return draft_id, int(model.draft_to_target[draft_id])


@exercise("6.4")
def _eagle3_first_draft(fn):
    model = tiny_eagle3()
    generator = torch.Generator().manual_seed(1)
    for i in range(20):
        taps = tuple(torch.randn(1, 32, generator=generator) for _ in range(3))  # low, middle, high
        token = int(torch.randint(50, (), generator=generator))
        draft_id, expected = first_draft(model, taps, token)
        with torch.inference_mode():
            got = run(fn, model, tuple(t.clone() for t in taps), token)
        got = int(got) if isinstance(got, int) or (torch.is_tensor(got) and got.numel() == 1) else got
        if got == expected:
            continue
        why = ("that is an id in the DRAFT vocabulary: map it to the target's, draft id + d2t[draft id]."
               if got == draft_id and draft_id != expected else
               "fuse the three taps with fc (concatenated low, middle, high), normalise embedding and fused state with "
               "their own norms, and remember that attention over a single position returns that position's value; "
               "the residual around attention is the fused state g.")
        raise case(f"case {i}: eagle3_first_draft(model, taps, token={token})", got, expected, why)
    return "Correct: your fuse-and-step drafts the same token as the library's EAGLE-3 drafter in every case."


# --- 8.4: the DSpark gate ----------------------------------------------------------------


def gate_cases(count: int = 200):
    yield torch.tensor([0.9, 0.8, 0.6, 0.95]), 0.5  # exercise 8.1
    yield torch.tensor([0.4, 0.99, 0.99]), 0.5  # the first draft already fails
    yield torch.tensor([0.5, 1.0, 1.0]), 0.5  # survival exactly at the threshold is kept
    yield torch.tensor([0.99, 0.99, 0.99]), 0.5  # all survive
    generator = torch.Generator().manual_seed(0)
    for _ in range(count):
        k = int(torch.randint(1, 9, (), generator=generator))
        yield torch.rand(k, generator=generator) * 0.5 + 0.5, float(torch.rand((), generator=generator)) * 0.8 + 0.1


@exercise("8.4")
def _survival_gate(fn):
    from .drafters.dspark import gated_length
    for confidence, threshold in gate_cases():
        expected = gated_length(confidence, threshold)
        got = run(fn, confidence.clone(), threshold)
        if got == expected:
            continue
        c = [round(v, 3) for v in confidence.tolist()]
        strict = int((torch.cumprod(confidence.double(), 0) > threshold).sum())
        why = ("every draft's own confidence is above the threshold, but a draft is only worth verifying if all before "
               "it survive: the gate looks at the running product." if got == int((confidence >= threshold).sum()) else
               "survival at exactly the threshold still counts (>=)." if got == strict else
               "count the longest prefix of drafts whose running product of confidences stays at or above the "
               "threshold.")
        raise case(f"survival_gate({c}, {threshold:.3f})", got, expected, why)
    return "Correct: your gate submits as many drafts as gated_length in every case."


# --- 13.3: the suffix match --------------------------------------------------------------


def match_cases(count: int = 200):
    """(trie, ids, min_match): random earlier outputs filed in a trie, and a context to match."""
    from .drafters.suffix import SuffixTrie
    rng = random.Random(0)
    for _ in range(count):
        trie, vocab = SuffixTrie(max_depth=rng.randint(2, 8)), rng.randint(2, 4)
        for _ in range(rng.randint(1, 3)):
            trie.add([rng.randrange(vocab) for _ in range(rng.randint(1, 12))])
        yield trie, [rng.randrange(vocab) for _ in range(rng.randint(1, 10))], rng.randint(1, 2)


def matched_anywhere(trie, ids, min_match):
    """The longest suffix the trie has seen at all (continued or not): a mistake to diagnose."""
    for n in range(min(trie.max_depth // 2, len(ids)), min_match - 1, -1):
        if trie.find(ids[-n:]) is not None:
            return n
    return 0


@exercise("13.3")
def _longest_match(fn):
    from .drafters.suffix import match
    for trie, ids, min_match in match_cases():
        expected = match(trie, ids, min_match)[1]
        got = run(fn, trie, list(ids), min_match)
        if got == expected:
            continue
        why = ("a suffix the trie saw only at the very end of an output, with nothing after it, gives nothing to "
               "draft: it must have children." if got == matched_anywhere(trie, ids, min_match) else
               f"patterns are at most max_depth // 2 = {trie.max_depth // 2} tokens, so that as many remain below "
               "them to draft." if got > trie.max_depth // 2 else
               "try the longest suffix first (at most max_depth // 2 tokens), down to min_match; 0 when none fits.")
        raise case(f"longest_match(trie with max_depth={trie.max_depth}, {ids}, min_match={min_match})", got,
                   expected, why)
    return "Correct: your match finds the same pattern length as drafters.suffix.match on every case."


# --- 14.3 and 14.4: the accepting walk and the tree mask ----------------------------------


def random_tree(rng: random.Random, vocab: int = 4) -> tuple[list[int], list[int]]:
    """(drafts, parents): up to 8 nodes, each a child of an earlier node or of the root, siblings distinct."""
    drafts, parents = [], []
    for i in range(rng.randint(0, 8)):
        parent = rng.randint(-1, i - 1)
        taken = {d for d, p in zip(drafts, parents) if p == parent}
        free = [t for t in range(vocab) if t not in taken]
        if free:
            drafts.append(rng.choice(free))
            parents.append(parent)
    return drafts, parents


def first_child_walk(drafts, parents, picks):
    """The walk that only ever tries a node's first child: a mistake to diagnose."""
    path, node = [], -1
    while True:
        kids = [i for i, p in enumerate(parents) if p == node]
        if not kids or drafts[kids[0]] != picks[node + 1]:
            return path, picks[node + 1]
        path.append(kids[0])
        node = kids[0]


@exercise("14.3")
def _accept_walk(fn):
    from .verify import greedy_accept
    rng = random.Random(0)
    for _ in range(300):
        drafts, parents = random_tree(rng)
        picks = [rng.randrange(4) for _ in range(len(drafts) + 1)]  # the target's argmax at the root and each node
        path, nxt = greedy_accept(drafts, torch.nn.functional.one_hot(torch.tensor(picks), 4).float(), parents)
        got = run(fn, list(drafts), list(parents), list(picks))
        try:
            got_path, got_next = list(got[0]), int(got[1])
        except (TypeError, ValueError, IndexError):
            raise Wrong(f"return a pair (accepted node indices, next token), got {got!r}.") from None
        if (got_path, got_next) == (path, nxt):
            continue
        why = ("at each step keep the child that holds the target's pick there, whichever rank the drafter gave it: "
               "not only the first child." if (got_path, got_next) == first_child_walk(drafts, parents, picks) else
               "after a kept node, the walk goes on from THAT node's row (row 1 + its index), among its children."
               if got_path == path[:len(got_path)] and len(got_path) < len(path) else
               "the next token is the target's pick in the row where the walk stopped: the last kept node's, or the "
               "root's if none was kept." if got_path == path else
               "at each step keep the child that holds the target's pick there, whichever rank the drafter gave it.")
        raise case(f"accept_walk(drafts={drafts}, parents={parents}, picks={picks})", (got_path, got_next),
                   (path, nxt), why)
    return "Correct: your walk keeps the same nodes and the same next token as verify.greedy_accept on every tree."


@exercise("14.4")
def _tree_visibility(fn):
    from .tree import tree_mask
    rng = random.Random(1)
    for _ in range(200):
        _, parents = random_tree(rng)
        past = rng.randint(0, 5)
        expected = tree_mask(parents, past, torch.float32, "cpu")[0, 0] == 0  # [n+1, past+n+1] True: may attend
        got = run(fn, list(parents), past)
        if not torch.is_tensor(got) or got.shape != expected.shape:
            raise Wrong(f"return a bool tensor of shape [n + 1, past + n + 1] = {list(expected.shape)} for "
                        f"parents={parents}, past={past}; got {getattr(got, 'shape', type(got).__name__)}.")
        if torch.equal(got.bool(), expected):
            continue
        row = int((got.bool() != expected).any(-1).nonzero()[0])
        why = ("every row sees the whole cache and the root." if not got.bool()[:, :past + 1].all() else
               "a node sees its ancestors and itself, not every node drafted before it: this is not a causal mask."
               if torch.equal(got.bool()[1:, past + 1:], torch.ones_like(got.bool()[1:, past + 1:]).tril()) else
               "row 1 + i is node i: it sees what its parent's row sees, and itself.")
        raise Wrong(f"tree_visibility(parents={parents}, past={past}): row {row} is {got.bool()[row].int().tolist()}, "
                    f"expected {expected[row].int().tolist()}. {why}")
    return "Correct: your mask lets each node see exactly what tree.tree_mask lets it see, on every tree."
