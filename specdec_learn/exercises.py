"""The book's exercises, checked: say whether an answer is right, and if not, what went wrong.

Each exercise is two cells in its chapter: the reader's (`answer = None`, or
for a coding lab a function whose body raises NotImplementedError) and a
one-line check,

    check("2.1", answer)
    check("2.3", speculative_sample)          # a lab: the reader's function

The expected value is computed here, from the exercise's own fixed data
(`given`) and from the library (`find_continuation`, the shipped
checkpoints, ...), never from what the reader passes besides the answer, and
never written in the notebook. An exercise not answered yet says so and
raises nothing, so running a chapter top to bottom answers nothing and fails
nothing. A wrong answer raises `Wrong` with a hint that names the mistake
readers actually make (a known wrong value gets its own diagnosis) without
handing over the formula; tolerances are the precision the chapter's text
uses. The labs (labs.py) run the reader's function through the library's
own harness and report the first case it gets wrong.

The solutions live outside the package, in book/solutions.py: the
instructor edition of the book (`make book-instructor`) shows them, and
tests/test_exercises.py checks each one, and planted wrong answers, here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import lru_cache

from .limits import round_speedup  # chapter 3's cost model, everything in plain decoding passes

CHECKS: dict[str, Callable] = {}
NOT_YET = "Not answered yet: {what}, then run this cell again."


class Wrong(AssertionError):
    """A wrong answer. Jupyter shows only the hint, not a traceback."""

    def _render_traceback_(self):  # IPython's hook for how an exception is displayed
        return [f"Not yet: {self}"]


class Unanswered(Exception):
    """A lab whose function still raises NotImplementedError (labs.py raises this for it)."""


def check(exercise: str, answer) -> str:
    """Check `answer` to `exercise` ("2.1"); print and return the verdict, or raise Wrong.

    No answer yet (None, or a lab function that still raises
    NotImplementedError) prints "Not answered yet" and raises nothing.
    """
    if exercise not in CHECKS:
        raise KeyError(f"No exercise {exercise!r}: the book has {', '.join(CHECKS)}.")
    if answer is None:
        verdict = NOT_YET.format(what="put your answer in `answer`")
    else:
        try:
            verdict = CHECKS[exercise](answer)
        except Unanswered:
            verdict = NOT_YET.format(what="write the function's body (it still raises NotImplementedError)")
    print(verdict)
    return verdict


def given(exercise: str):
    """The fixed data an exercise is about, for the chapter to show (a copy: changing it changes no check)."""
    import copy

    if exercise not in GIVEN:
        raise KeyError(f"Exercise {exercise!r} has no data of its own: {', '.join(GIVEN)} do.")
    return copy.deepcopy(GIVEN[exercise])


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


# --- what the exercises are about ------------------------------------------------------

# Fixed data the exercises ask about; `given(name)` hands the chapters a copy to show.
GIVEN = {
    "0.2": "Write a haiku about tea.",  # the prompt whose template overhead is asked for
    "8.2": dict(words=["of", "course", "no", "problem", "."],  # chapter 8's toy Markov drafter
                base=[[2.0, 0.0, 1.9, 0.0, 0.0], [0.0, 1.9, 0.0, 2.0, 0.0]],  # slot 0, slot 1 logits
                raises={"of": "course", "no": "problem"}, anchor="."),  # the bias each word puts on slot 1
    "9.2": dict(ks=[1, 2, 3, 4, 6, 8], lengths=[1.74, 2.21, 2.55, 2.70, 2.90, 3.08]),  # an example sweep
    "11.3": ["math/m001", "math/m002", "math/m005", "math/m006", "humaneval/HumanEval/0",
             "humaneval/HumanEval/13"],
    "13.1": "the cat sat on the mat . the cat ran . the cat sat on",  # chapter 13's toy trie's text
}


@lru_cache(maxsize=1)
def smollm2():
    """The book's target, loaded here: the checks read the model, never an object the reader passes."""
    from .target import load

    return load("smollm2-135m")


@lru_cache(maxsize=None)
def shipped_drafter(method: str):
    """The drafter this package ships for SmolLM2-135M, as the chapters load it."""
    from .zoo import make_drafter

    return make_drafter(method, smollm2())


# --- chapter 0: setup ------------------------------------------------------------------


@exercise("0.1")
def _embedding_share(answer):
    model = smollm2().model
    total = sum(p.numel() for p in model.parameters())  # parameters() lists a tied tensor once
    embedding = model.get_input_embeddings().weight.numel()
    share = embedding / total
    expect(answer, share, tol=0.005, hint="a fraction between 0 and 1: the embedding matrix's numbers over every "
                                          "parameter of target.model.",
           mistakes=[(embedding / (total + embedding), "the output head is the SAME tensor as the embedding (tied): "
                                                       "count it once in the total."),
                     (2 * embedding / (total + embedding), "the output head is the embedding matrix itself (tied), "
                                                           "not a second matrix: count it once."),
                     (share * 100, "a fraction, not a percentage.")])
    return (f"Correct: {share:.1%} of {total / 1e6:.1f} M parameters; the same matrix scores every token "
            "as the output head.")


@exercise("0.2")
def _template(answer):
    target, prompt = smollm2(), GIVEN["0.2"]
    templated, own = target.encode(prompt), target.encode(prompt, chat=False)
    before = next(i for i in range(len(templated)) if templated[i:i + len(own)] == own)
    expect(answer, before, hint="print target.pieces(target.encode(prompt)) and count the pieces before 'Write'.",
           mistakes=[(len(templated) - len(own), "that is every token the template adds, before AND after the "
                                                 "message: count only those before it."),
                     (before - 1, "count every piece before 'Write', the first '<|im_start|>' too.")])
    return (f"Correct: {before} tokens (a system message and the user's role marker) come before the message, "
            f"{len(templated) - len(own) - before} after it.")


# --- chapter 1: autoregressive decoding ------------------------------------------------


@exercise("1.1")
def _four_bit_bytes(answer):
    params = smollm2().model.num_parameters()
    megabytes = params * 0.5 / 1e6
    expect(answer, megabytes, tol=1.0, hint="every weight is read once per token, half a byte each. Answer in MB "
                                            "(1e6 bytes).",
           mistakes=[(params / 1e6, "that is 8 bits (one byte) a weight; 4 bits is half a byte."),
                     (params * 2 / 1e6, "that is bf16's 2 bytes a weight; 4 bits is half a byte."),
                     (params * 4 / 1e6, "that is fp32's 4 bytes a weight; 4 bits is half a byte.")])
    return f"Correct: {megabytes:.0f} MB per token, an eighth of fp32's."


@exercise("1.2")
def _free_drafting(answer):
    expected = round_speedup(2.5, k=3, c=0.0, verify=1.25)
    expect(answer, expected, tol=0.01, hint="a speedup compares tokens gained with time spent: what does one "
                                            "round yield, and what does it cost in plain passes?",
           mistakes=[(2.5 * 1.25, "more cost per round means less speedup: divide, do not multiply.")])
    return f"Correct: 2.5 tokens for the price of 1.25 passes, {expected:.1f}x."


# --- chapter 2: draft and verify -------------------------------------------------------

P_TARGET, Q_DRAFT = (0.5, 0.35, 0.15), (0.2, 0.3, 0.5)  # exercises 2.1 and 2.2


@exercise("2.1")
def _acceptance(answer):
    overlap = sum(min(p, q) for p, q in zip(P_TARGET, Q_DRAFT))
    expect(answer, overlap, tol=0.005, hint="for each token: how likely it is to be drafted AND then kept by the "
                                            "rule of this chapter; then add over the tokens.",
           mistakes=[(sum(p * q for p, q in zip(P_TARGET, Q_DRAFT)), "that is the chance that two independent "
                      "draws agree, not that a draft survives verification: it is kept by the chapter's rule."),
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
    expect(answer, expected, tol=0.01, hint="count a round's cost in target passes, the drafting and the verify "
                                            "pass both, against what the round yields (chapter 3's cost model).",
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
    expect(answer, expected, tol=0.01, hint="what does a round yield, and what does it cost in target passes, "
                                            "drafting and verifying both?",
           mistakes=[(round_speedup(0.85, k=1, c=1 / 61, verify=1.0), "a round yields the accepted draft AND the "
                                                                "target's own token: L = 1 + 0.85.")])
    return f"Correct: {expected:.2f}x, close to the 1.8x measured: a cheap, accurate drafter is nearly free speed."


@exercise("4.3")
def _mtp_without_head(answer):
    from .limits import matmul_weights
    target, head = smollm2(), shipped_drafter("mtp").head
    target_cost = matmul_weights(target.decoder.layers, target.lm_head)
    c_mtp = matmul_weights(head.layers[0], head.fc, target.lm_head) / target_cost
    expected = matmul_weights(head.layers[0], head.fc) / target_cost
    expect(answer, expected, tol=5e-4, hint="which modules does an MTP step multiply by, once the output head is "
                                            "free? Divide their weights by the target pass's (target_cost).",
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
def _assistant_cache(answer):
    text = shipped_drafter("gemma4_mtp").assistant.config.get_text_config()
    expected = text.num_hidden_layers * 2 * text.num_key_value_heads * text.head_dim * 4096 * 2
    expect(answer, expected, hint="the cache holds one vector per layer, per kind, per KV head, per "
                                  "token: read each count off the config, and mind the bytes per number.",
           mistakes=[(expected // 2, "count both keys and values."),
                     (expected * 2, "bf16 is 2 bytes a number, not 4.")])
    return f"Correct: {expected:,} bytes ({expected / 2**20:.0f} MiB) that the assistant never allocates."


# --- chapter 6: EAGLE-3 ----------------------------------------------------------------


@exercise("6.1")
def _eagle3_taps(answer):
    from .drafters.eagle3 import default_taps
    expect(answer, default_taps(36), hint="one tap low, one in the middle, one high, by the rule the chapter "
                                          "gives for a target of L layers: apply it to L = 36.",
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
    expect(pair[0], s, tol=0.01, hint="the cost model of chapter 3, with this drafter's k and c: what "
                                      "does a round cost?",
           mistakes=[(3.2 / 1.05, "do not forget the drafting: 4 steps at 0.05 passes each.")])
    expect(pair[1], need, tol=0.02, hint="work backwards: what does the draft model's round cost, and how many "
                                         "tokens must it yield for the same speedup?")
    return (f"Correct: {s:.2f}x. The draft model would need L = {need:.2f}, more than the k + 1 = 5 tokens a round "
            "can ever yield: at k = 4 no drafter that slow can match a one-layer head.")


# --- chapter 7: DFlash -----------------------------------------------------------------


@exercise("7.1")
def _dflash_k(answer):
    block = 10
    expect(answer, block - 1, hint="a block of B slots holds the anchor and B - 1 masks.",
           mistakes=[(block, "slot 0 is the anchor, a token the target already committed: it is not a draft.")])
    return f"Correct: {block - 1} drafts per round; the anchor takes slot 0 of the {block}."


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
def toy_markov():
    """Chapter 8's toy: two slots over five words, and a rank-2 Markov head that links "of" to "course" and
    "no" to "problem" -> (base logits [2, 5], anchor id, MarkovHead, words)."""
    import torch

    from .drafters.dspark import MarkovHead
    toy = GIVEN["8.2"]
    words = toy["words"]
    head = MarkovHead(vocab_size=len(words), rank=len(toy["raises"]))
    with torch.no_grad():
        head.markov_w1.weight.zero_()
        head.markov_w2.weight.zero_()
        for direction, (word, raised) in enumerate(toy["raises"].items()):
            head.markov_w1.weight[words.index(word), direction] = 1.0
            head.markov_w2.weight[words.index(raised), direction] = 1.0
    return torch.tensor(toy["base"]), words.index(toy["anchor"]), head, words


@exercise("8.2")
def _markov(answer):
    from .drafters.dspark import markov_draft
    base, anchor, toy, words = toy_markov()
    swapped = base.clone()
    swapped[0, 0], swapped[0, 2] = base[0, 2], base[0, 0]
    expected = [words[t] for t in markov_draft(swapped, anchor, toy, lambda row: int(row.argmax()))[0]]
    without = [words[t] for t in markov_draft(swapped, anchor, None, lambda row: int(row.argmax()))[0]]
    expect(list(answer), expected, hint="pick slot 0 first, then add the bias row of that word to slot 1's logits.",
           mistakes=[(without, "that is the draft with the Markov head OFF: slot 1 gets the bias of slot 0's word.")])
    return "Correct: " + " ".join(expected)


RANK_8_3 = 16


@exercise("8.3")
def _markov_size(answer):
    model = shipped_drafter("dspark").model
    V, r = model.config.vocab_size, model.config.markov_rank
    markov = sum(p.numel() for p in model.markov_head.parameters()) * RANK_8_3 // r  # the head, at rank 16
    pair = list(answer) if isinstance(answer, (tuple, list)) else []
    if len(pair) != 2:
        raise Wrong("a pair: (markov, full).")
    expect(pair[0], markov, hint="count the Markov head's matrices and their shapes (chapter 8 names them), with "
                                 "V from model.config and the rank 16.",
           mistakes=[(V * RANK_8_3, "there are two matrices (W1 and W2), each V x r."),
                     (markov * r // RANK_8_3, f"at rank {RANK_8_3}, not the shipped rank {r}.")])
    expect(pair[1], V * V, hint="a full bigram table has one entry per (previous, next) pair.")
    return f"Correct: {markov:,} parameters instead of {V * V:,} ({V * V / markov:.0f}x fewer)."


# --- chapter 9: tuning k ---------------------------------------------------------------


@exercise("9.1")
def _geometric(answer):
    alpha, k = 0.6, 4
    expected = sum(alpha**i for i in range(k + 1))
    expect(answer, expected, tol=0.05, hint="the chapter's model of one round: how likely is each position to "
                                            "survive, and what does a round yield on average?",
           mistakes=[(expected - 1, "count the target's own token too: the sum starts at alpha**0 = 1."),
                     (sum(alpha**i for i in range(k)), "the sum has k + 1 terms, alpha**0 to alpha**k: "
                                                       "k drafts plus the target's own token.")])
    return f"Correct: {expected:.2f} tokens per round, inside the guide's '2 to 3'."


@exercise("9.2")
def _sweep(answer):
    ks, lengths = GIVEN["9.2"]["ks"], GIVEN["9.2"]["lengths"]
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
    expect(answer, expected, tol=0.005, hint="vLLM's definition (this chapter): from the counters, but for "
                                             "this call only.",
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
    expect(answer, weights[0] / sum(weights), tol=0.005, hint="write down each step's weight first; step 0's share "
                                                              "is its part of the total.",
           mistakes=[(1 / defaults.ttt_steps, "the steps are not weighted equally: step i has weight decay**i.")])
    return (f"Correct: {weights[0] / sum(weights):.2f} of the weight is on the first step, which also decides "
            "whether any draft survives.")


@exercise("11.2")
def _predicted_length(answer):
    from .checkpoints import shipped
    made = json.loads((shipped("eagle3", "smollm2-135m") / "recipe.json").read_text())
    a0, a1, a2 = made["held_out"]["acc"][:3]
    predicted = 1 + a0 + a0 * a1 + a0 * a1 * a2
    expect(answer, predicted, tol=0.005, hint="a draft counts only if every draft before it was right: "
                                              "how likely is that at each step?",
           mistakes=[(predicted - 1, "mean acceptance length counts the target's own token too: add 1."),
                     (1 + a0 + a1 + a2, "a later draft counts only if every draft before it was accepted: "
                                        "multiply along the prefix.")])
    return f"Correct: about {predicted:.2f}; compare the acceptance length at k = 3 that section 8 shows."


@exercise("11.3")
def _training_ids(answer):
    from .workloads import is_benchmark_prompt
    candidates = GIVEN["11.3"]
    if isinstance(answer, str) or not hasattr(answer, "__iter__"):
        raise Wrong("a list of prompt ids, a sublist of the candidates.")
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
    expect(answer, expected, tol=0.1, hint="how many bytes does one bf16 parameter take? And the drafter sits in memory too.",
           mistakes=[(params * 4 / 1e9 + drafter_gb, "bf16 is 2 bytes per parameter, not 4."),
                     (params * 2 / 1e9, "add the drafter's 4.74 GB.")])
    return f"Correct: about {expected:.1f} GB of weights, a small part of an MI300X's 192 GB; the KV cache comes on top."


@exercise("12.2")
def _largest_k(answer):
    dflash_block, dspark_block = 8, 4
    expected = (dflash_block - 1, dspark_block)  # DFlash's slot 0 is the anchor; DSpark's anchor is a prediction
    pair = tuple(answer) if isinstance(answer, (tuple, list)) else ()
    if len(pair) == 2 and pair[0] == dflash_block:
        raise Wrong("DFlash's first slot holds the anchor, a token already known: it drafts B - 1.")
    expect(pair, expected, hint="DSpark's anchor slot is itself a prediction (sample_from_anchor): every one of "
                                "its B slots is a draft.")
    return (f"Correct: {expected[0]} and {expected[1]}: the same block size buys DSpark one draft more, since its "
            "anchor slot predicts too.")


@exercise("12.3")
def _block_speedup(answer):
    length, c_block, k, slope = 6.5, 0.15, 15, 0.02  # L at k = 15, one block pass, T(k+1)/T(1) = 1 + slope k
    verify = 1 + slope * k
    expected = round_speedup(length, k=1, c=c_block, verify=verify)  # one block pass drafts all k
    expect(answer, expected, tol=0.01, hint="tokens per round over the round's cost: one block pass plus a verify "
                                            "pass over k + 1 rows, both in target passes.",
           mistakes=[(round_speedup(length, k=k, c=c_block, verify=verify), "DFlash drafts the whole block in ONE "
                                                                           "pass: c_B once, not k times."),
                     (round_speedup(length, k=1, c=c_block, verify=1.0), "the verify pass over 16 rows costs "
                                                                         f"{verify:.2f} plain passes, not 1.")])
    return f"Correct: {expected:.2f}x: a cheap block and a flat verify curve are what make DFlash fast on a GPU."


# --- chapter 13: suffix decoding -------------------------------------------------------


@exercise("13.1")
def _suffix_draft(answer):
    from .drafters.suffix import SuffixTrie, speculate
    words = GIVEN["13.1"].split()
    vocab = sorted(set(words))
    trie = SuffixTrie(max_depth=6)
    trie.add([vocab.index(w) for w in words])
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
    expect(answer, expected, hint="each start position adds one count per substring that starts there: how "
                                  "long can those substrings be, at the start and near the end of the output?",
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


# --- chapter 15: every method, side by side --------------------------------------------


def _reference_rows(workload: str, sampling: str) -> dict[str, dict]:
    """Each method's row of the reference run at its chapter's k (the k its temperature-1 run used)."""
    from .bench import read_reference

    ks = {r["method"]: r["k"] for r in read_reference("humaneval", "temperature 1").rows if r["method"] != "ar"}
    results = read_reference(workload, sampling)
    return {m: results.get(m, k) for m, k in ks.items()}


@exercise("15.1")
def _fastest_on_chat(answer):
    chat, code = _reference_rows("chat", "greedy"), _reference_rows("humaneval", "greedy")
    fastest = max(chat, key=lambda m: chat[m]["speedup"])
    longest = max(chat, key=lambda m: chat[m]["mean_acceptance_length"])
    if answer not in chat:
        raise Wrong(f"one of the methods in the table: {', '.join(chat)} (plain decoding, ar, is the baseline).")
    expect(answer, fastest, hint="read the speedup column of the chat table, at each method's k.",
           mistakes=[(max(code, key=lambda m: code[m]["speedup"]), "that is the fastest on HumanEval: this asks "
                                                                   "about the chat prompts."),
                     (longest, "the longest rounds are not the fastest: a round's cost differs by method.")])
    return f"Correct: {fastest}, at {chat[fastest]['speedup']:.2f}x plain decoding on chat."


@exercise("15.2")
def _sampling_costs_acceptance(answer):
    greedy = _reference_rows("humaneval", "greedy")["ngram"]["mean_acceptance_length"]
    sampled = _reference_rows("humaneval", "temperature 1")["ngram"]["mean_acceptance_length"]
    expect(answer, greedy / sampled, tol=0.01, hint="two numbers from the acc.len column: n-gram's row in the "
                                                    "greedy HumanEval table and in the temperature-1 table.",
           mistakes=[(sampled / greedy, "upside down: greedy over temperature 1.")])
    return (f"Correct: {greedy:.2f} against {sampled:.2f} tokens a round: a fixed guess matches a sampled token "
            "less often than the argmax.")


from . import labs  # noqa: E402,F401  the coding labs register their checks here too
