"""Worked solutions to the book's exercises and labs: for teachers, the instructor edition and the tests.

The student chapters hold no solution. `make book-instructor` builds the
book with each of these shown after its exercise (book/build.py
--instructor), and tests/test_exercises.py checks every one against
specdec_learn/exercises.py and labs.py.

An exercise's solution is `solution_<chapter>_<n>`; its parameters, when
it has any, are the chapter's own variables of the same names (the
instructor edition calls it with them). A lab's solution has the name of
the function the reader writes.
"""

from __future__ import annotations

import torch

# --- chapter 0 --------------------------------------------------------------------------


def solution_0_1(target):
    """The embedding matrix over all parameters; parameters() lists the tied output head once."""
    total = sum(p.numel() for p in target.model.parameters())
    return target.model.get_input_embeddings().weight.numel() / total


def solution_0_2(target, prompt):
    """Where the message's own tokens start inside the templated prompt."""
    templated, own = target.encode(prompt), target.encode(prompt, chat=False)
    return next(i for i in range(len(templated)) if templated[i:i + len(own)] == own)


# --- chapter 1 --------------------------------------------------------------------------


def solution_1_1(target):
    """Every weight is read once per token, half a byte each at 4 bits."""
    return target.model.num_parameters() * 0.5 / 1e6


def solution_1_2():
    """Tokens per round over the round's cost in plain passes."""
    return 2.5 / 1.25


# --- chapter 2 --------------------------------------------------------------------------


def solution_2_1():
    """Acceptance = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)), the overlap of p and q."""
    p, q = [0.5, 0.35, 0.15], [0.2, 0.3, 0.5]
    return sum(min(a, b) for a, b in zip(p, q))


def solution_2_2():
    """Rejected draws come from what p has beyond q: max(p - q, 0), normalised."""
    p, q = [0.5, 0.35, 0.15], [0.2, 0.3, 0.5]
    residual = [max(a - b, 0.0) for a, b in zip(p, q)]
    return [r / sum(residual) for r in residual]


def speculative_sample(p, q, x, generator):
    """Keep the draft x with probability min(1, p(x)/q(x)); else draw from the normalised residual."""
    if torch.rand((), generator=generator, dtype=torch.float64) * q[x] <= p[x]:
        return x
    residual = (p - q).clamp_min(0)
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


# --- chapter 3 --------------------------------------------------------------------------


def solution_3_1():
    """n = 3 ([2, 5, 6]) never occurred before; n = 2 ([5, 6]) did, at the start, followed by 7, 1."""
    return [7, 1]


def solution_3_2():
    """L / (k c + T(k+1)/T(1)) with L = 3.2, k = 4, c = 0.1, T(5)/T(1) = 1.1."""
    return 3.2 / (4 * 0.1 + 1.1)


def ngram_propose(ids, k, min_n, max_n):
    """Longest n first; the most recent EARLIER occurrence of the last n tokens; up to k tokens after it."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + k]
    return []


# --- chapter 4 --------------------------------------------------------------------------


def solution_4_1():
    """The state that predicted `last` (position 18) with last's own embedding (position 19)."""
    return (18, 19)


def solution_4_2():
    """L = 1 + 0.85, k = 1, c = 1/61, a 2-row verify costing one pass."""
    return (1 + 0.85) / (1 / 61 + 1.0)


def solution_4_3(head, target_cost):
    """The MTP layer and fc only, over the same target pass."""
    from specdec_learn.limits import matmul_weights

    return matmul_weights(head.layers[0], head.fc) / target_cost


# --- chapter 5 --------------------------------------------------------------------------


def solution_5_1():
    """The cache holds ids[:-1] (39 positions); every step queries one before `last`, at 38."""
    return (39, 38)


def solution_5_2():
    """2,048 centroid scores, then 32 groups of 262,144 / 2,048 = 128 tokens."""
    return 2048 + 32 * (262_144 // 2048)


def solution_5_3(text):
    """layers x (K and V) x K/V heads x head size x tokens x 2 bytes."""
    return text.num_hidden_layers * 2 * text.num_key_value_heads * text.head_dim * 4096 * 2


def centroid_logits(d, centroids, token_ordering, lm_head, top_k):
    """Score the centroids, keep the top_k groups of V / C tokens, score only their tokens; -inf elsewhere."""
    groups = token_ordering.view(centroids.shape[0], -1)  # [C, V/C] the tokens of each centroid
    kept = groups[(centroids @ d).topk(top_k).indices].reshape(-1)  # [top_k * V/C]
    logits = torch.full((lm_head.shape[0],), float("-inf"), dtype=d.dtype)
    logits[kept] = lm_head[kept] @ d
    return logits


# --- chapter 6 --------------------------------------------------------------------------


def solution_6_1():
    """(2, L // 2, L - 3) with L = 36."""
    return (2, 36 // 2, 36 - 3)


def solution_6_2():
    """d2t[i] = (target id of draft id i) - i."""
    return [t - i for i, t in enumerate([3, 7, 8, 20])]


def solution_6_3():
    """The same ratio L / cost of a round; the draft model's round costs 4 x 0.3 + 1.05 passes."""
    speedup = 3.2 / (4 * 0.05 + 1.05)
    return (speedup, speedup * (4 * 0.3 + 1.05))


def eagle3_first_draft(model, taps, token):
    """g = fc(cat taps); one layer step at one position (attention = o_proj(v)); argmax; draft id -> target id."""
    layer, attn = model.layers[0], model.layers[0].self_attn
    g = model.fc(torch.cat(taps, dim=-1))  # [1, H]
    e = model.embed(torch.tensor([token]))  # [1, H]
    z = torch.cat([layer.input_layernorm(e), layer.hidden_norm(g)], dim=-1)  # [1, 2H]
    x = g + attn.o_proj(attn.v_proj(z))  # one position: every head's softmax weight is 1
    h = layer.post_attention_layernorm(x)
    x = x + layer.mlp(h)  # gate, up, down: the layer type's own MLP
    draft_id = int(model.lm_head(model.norm(x))[0].argmax())
    return draft_id + int(model.d2t[draft_id])


# --- chapter 7 --------------------------------------------------------------------------


def solution_7_1():
    """Slot 0 holds the anchor; slots 1..B-1 are the drafts."""
    return 10 - 1


def solution_7_2():
    """DFlash's layer i is the OUTPUT of layer i, the stream entering layer i + 1."""
    return [i + 1 for i in [1, 9, 17, 25, 33]]


def solution_7_3():
    """k c > c_B, that is k > 0.16 / 0.05 = 3.2."""
    return next(k for k in range(1, 100) if k * 0.05 > 0.16)


# --- chapter 8 --------------------------------------------------------------------------


def solution_8_1():
    """Survival 0.9, 0.72, 0.432: the third falls below 0.5."""
    return 2


def solution_8_2():
    """Slot 0 now picks "no"; its Markov bias raises "problem" in slot 1."""
    return ["no", "problem"]


def solution_8_3(model):
    """W1 is V x r and W2 is r -> V: 2 V r at r = 16, against V^2 for a full table."""
    V = model.config.vocab_size
    return (2 * V * 16, V * V)


def survival_gate(confidence, threshold):
    """The longest prefix whose running product of confidences stays >= threshold."""
    survival, n = 1.0, 0
    for c in confidence.tolist():
        survival *= c
        if survival < threshold:
            break
        n += 1
    return n


# --- chapter 9 --------------------------------------------------------------------------


def solution_9_1():
    """The geometric sum 1 + a + ... + a^k with a = 0.6, k = 4."""
    return (1 - 0.6**5) / (1 - 0.6)


def solution_9_2():
    """Divide each gain by the drafts the step in k added; the smallest such gain ends the sweep's pair."""
    from specdec_learn.exercises import given

    sweep = given("9.2")
    ks, lengths = sweep["ks"], sweep["lengths"]
    gains = [(b - a) / (k2 - k1) for a, b, k1, k2 in zip(lengths, lengths[1:], ks, ks[1:])]
    return ks[1 + gains.index(min(gains))]


# --- chapter 10 -------------------------------------------------------------------------


def solution_10_1():
    """The MTP layers ship inside the target's checkpoint: no drafter `model` key."""
    return {"method": "mtp", "num_speculative_tokens": 3}


def solution_10_2():
    """Difference the counters, then 1 + accepted / drafts."""
    return 1 + (84 - 66) / (52 - 40)


def solution_10_3():
    """Each drafted step emits its accepted drafts plus the target's own token."""
    return 14 - sum(a + 1 for a in [3, 1, 0, 2])


# --- chapter 11 -------------------------------------------------------------------------


def solution_11_1():
    """TTT step weights 1, 0.8, 0.64: the first step's share."""
    return 1 / (1 + 0.8 + 0.8**2)


def solution_11_2(made):
    """1 (the target's own token) + the expected accepted drafts, a0 + a0 a1 + a0 a1 a2."""
    a0, a1, a2 = made["held_out"]["acc"][:3]
    return 1 + a0 + a0 * a1 + a0 * a1 * a2


def solution_11_3():
    """The benchmark split is decided by a hash of the id."""
    from specdec_learn.exercises import given
    from specdec_learn.workloads import is_benchmark_prompt

    return [i for i in given("11.3") if not is_benchmark_prompt(i)]


# --- chapter 12 -------------------------------------------------------------------------


def solution_12_1():
    """2 bytes per bf16 parameter, plus the drafter's file."""
    return 8.2e9 * 2 / 1e9 + 4.74


def solution_12_2():
    """DFlash's slot 0 is the anchor (B - 1 drafts); DSpark predicts from the anchor on (B drafts)."""
    return (8 - 1, 4)


def solution_12_3():
    """L / (c_B + T(k+1)/T(1)): one block pass drafts all 15, the verify pass costs 1 + 0.02 x 15."""
    return 6.5 / (0.15 + 1 + 0.02 * 15)


# --- chapter 13 -------------------------------------------------------------------------


def solution_13_1():
    """"mat sat on" never occurred; "sat on" did (n = 2), so at most 1.0 x 2 drafts: "the", then "mat"."""
    return ["the", "mat"]


def solution_13_2():
    """Start s adds one count per substring of at most 24 tokens starting there: min(24, 40 - s)."""
    return sum(min(24, 40 - s) for s in range(40))


def longest_match(trie, ids, min_match):
    """Longest suffix first, at most max_depth // 2 tokens, down to min_match; it must have been continued."""
    for n in range(min(trie.max_depth // 2, len(ids)), min_match - 1, -1):
        node = trie.root
        for t in ids[-n:]:
            node = node.children.get(t)
            if node is None:
                break
        if node is not None and node.children:
            return n
    return 0


# --- chapter 14 -------------------------------------------------------------------------


def solution_14_1():
    """The root's pick "a" is node 1; node 1's row picks "cat", its child node 4; node 4 has no children."""
    return [1, 4]


def solution_14_2():
    """The cache (10), the root, its parent node 0, and itself."""
    return 10 + 1 + 1 + 1


# --- chapter 15 -------------------------------------------------------------------------


def solution_15_1():
    """The largest speedup in the chat table, each method at its chapter's k."""
    from specdec_learn.bench import read_reference

    ks = {r["method"]: r["k"] for r in read_reference("humaneval", "temperature 1").rows if r["method"] != "ar"}
    chat = read_reference("chat", "greedy")
    return max(ks, key=lambda m: chat.get(m, ks[m])["speedup"])


def solution_15_2():
    """n-gram's acceptance length, greedy over temperature 1, both at its k (3), on HumanEval."""
    from specdec_learn.bench import read_reference

    return (read_reference("humaneval", "greedy").get("ngram", 3)["mean_acceptance_length"]
            / read_reference("humaneval", "temperature 1").get("ngram", 3)["mean_acceptance_length"])


def accept_walk(drafts, parents, picks):
    """From the root's row: keep the child holding the target's pick, go on from its row; stop where none does."""
    path, node = [], -1
    while True:
        token = picks[node + 1]
        kept = next((i for i, (d, p) in enumerate(zip(drafts, parents)) if p == node and d == token), None)
        if kept is None:
            return path, token
        path.append(kept)
        node = kept


def tree_visibility(parents, past):
    """Row 0 (the root) sees the cache and itself; node i's row sees what its parent's row sees, and itself."""
    n = len(parents)
    allowed = torch.zeros(n + 1, past + n + 1, dtype=torch.bool)
    allowed[:, :past + 1] = True
    for i, p in enumerate(parents):
        allowed[1 + i] = allowed[1 + p]  # p = -1 reads row 0, the root
        allowed[1 + i, past + 1 + i] = True
    return allowed
