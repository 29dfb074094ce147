"""Magpie prompts: the target writes the user requests itself.

A drafter learns the target's answers, and answers are only as varied as the
questions. Our own prompt lists (prompts.py, the workloads' train split) give
about 1,300 questions; ten times more data needs ten times more questions.
Magpie (Xu et al., 2024, "Magpie: Alignment Data Synthesis from Scratch by
Prompting Aligned LLMs with Nothing", arXiv:2406.08464) gets them from the
model: an instruct model has seen thousands of conversations that begin

    <|im_start|>system ... <|im_end|>\\n<|im_start|>user\\n

so given that prefix and nothing else, it continues with something a user
would plausibly ask, and stops at the end-of-turn token. Sampling it many
times (temperature 1.0, top-p 0.99, as the paper does) gives a stream of
requests in the model's own idea of what users want.

A small model also writes junk: a request cut off at the token limit, the
same word over and over, an empty line, the exact question it wrote a minute
ago. So every sample is cleaned, dropped when too short or degenerate, and
deduplicated on a normalised form of its text (case, punctuation and spacing
ignored). And, as for every training prompt, no benchmark prompt gets in:

* by text: a request whose normalised text equals a benchmark prompt's is dropped;
* by id: each request's id is the hash of its normalised text, salted until
  `workloads.is_benchmark_prompt(id)` is False, so every id lies in the train split.

    prefix = user_prefix(tokenizer)            # "<|im_start|>system\\n...<|im_start|>user\\n"
    texts  = sample_requests(engine, n)        # raw samples that ended at the end of the turn
    kept   = keep_new(texts, seen, held_out)   # cleaned, deduplicated, benchmark-free Prompts

`grow_prompt_file` repeats that, a round at a time, until the prompt file
holds enough requests; the file is rewritten atomically after every round, so
the job can be killed at any moment and continued.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from ..workloads import Prompt, is_benchmark_prompt

SENTINEL = "\x00MAGPIE-USER-CONTENT\x00"  # stands in for the user's message while we render the template

# The paper's sampling for the instruction step; requests are short, so a short limit.
TEMPERATURE, TOP_P, MAX_TOKENS = 1.0, 0.99, 96
MIN_CHARS, MIN_WORDS, MAX_CHARS = 20, 4, 600
PREFIX = "magpie/"  # every Magpie request's prompt id starts with it; the templated prompts' ids never do


# --- the prefix the model continues --------------------------------------------------


def user_prefix(tokenizer) -> str:
    """What the chat template renders before a user message's content (derived, not hard-coded).

    We render a one-message conversation whose content is a sentinel and cut at
    the sentinel: everything before it (the default system turn, if the template
    adds one, and the user header) is the prefix.
    """
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    if SENTINEL not in rendered:
        raise ValueError("The chat template does not render the user's message verbatim; Magpie needs it to.")
    return rendered[: rendered.index(SENTINEL)]


def end_of_turn_ids(tokenizer) -> list[int]:
    """The token(s) that close a user turn: the first token the template puts after the content."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    after = rendered[rendered.index(SENTINEL) + len(SENTINEL):]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("The chat template puts nothing after a user message: no end-of-turn token to stop at.")
    stops = {ids[0]}
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    return sorted(stops)


# --- cleaning -----------------------------------------------------------------------------


def normalise(text: str) -> str:
    """The form two requests are compared in: lower case, letters and digits only, single spaces."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def is_degenerate(text: str) -> bool:
    """A sample a small model writes when it loops: few distinct words, or one line repeated."""
    words = normalise(text).split()
    if len(words) >= 8 and len(set(words)) / len(words) < 0.4:
        return True
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return len(lines) >= 3 and len(set(lines)) < len(lines) / 2


def clean(text: str) -> str | None:
    """The request as a user would send it, or None when it is not worth an answer."""
    text = text.strip()
    if "<|" in text or "|>" in text:  # a template marker leaked into the text
        return None
    if not (MIN_CHARS <= len(text) <= MAX_CHARS) or len(text.split()) < MIN_WORDS:
        return None
    if sum(c.isalpha() for c in text) < 0.5 * len(text):  # mostly digits, symbols or code debris
        return None
    if is_degenerate(text):
        return None
    return text


def train_split_id(text: str) -> str:
    """A stable id for a request: the hash of its normalised text, salted until it is in the train split."""
    digest = hashlib.sha1(normalise(text).encode("utf-8")).hexdigest()[:16]
    salt = 0
    while True:
        prompt_id = f"{PREFIX}{digest}" + (f".{salt}" if salt else "")
        if not is_benchmark_prompt(prompt_id):
            return prompt_id
        salt += 1


def keep_new(texts: list[str], seen: set[str], held_out: set[str]) -> list[Prompt]:
    """The cleaned requests among `texts` whose normalised text is neither in `seen` nor a benchmark prompt's.

    seen: normalised texts already kept (updated in place), held_out: normalised benchmark texts.
    """
    kept = []
    for raw in texts:
        text = clean(raw)
        if text is None:
            continue
        key = normalise(text)
        if key in seen or key in held_out:
            continue
        seen.add(key)
        kept.append(Prompt(train_split_id(text), text, "magpie"))
    return kept


# --- sampling from the target (vLLM) ---------------------------------------------------------


def sample_requests(engine, n: int, max_tokens: int = MAX_TOKENS) -> list[str]:
    """n user requests the target writes after the bare user prefix; only those that ended the turn.

    engine: a `vllm_backend.VllmEngine` (method "ar"). Samples come from the
    engine's seeded stream (no per-request seed; see VllmEngine.generate_batch).
    A request cut at max_tokens is dropped: it is unfinished.
    """
    from vllm import SamplingParams

    prefix_ids = engine.tokenizer(user_prefix(engine.tokenizer), add_special_tokens=False)["input_ids"]
    params = SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, max_tokens=max_tokens,
                            stop_token_ids=end_of_turn_ids(engine.tokenizer), skip_special_tokens=True)
    outputs = engine.llm.generate([{"prompt_token_ids": prefix_ids}] * n, params, use_tqdm=False)
    return [o.outputs[0].text for o in outputs if o.outputs[0].finish_reason == "stop"]


# --- the prompt file -------------------------------------------------------------------------


def read_prompts(path) -> list[Prompt]:
    """A prompt file's rows as Prompts (one {"id", "prompt", "workload"} object a line; a missing file is empty)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Prompt(row["id"], row["prompt"], row.get("workload", "magpie")) for row in rows]


def write_prompts(path, prompts: list[Prompt]) -> None:
    """Write a prompt file atomically: a temporary file in the same folder, then one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"id": p.id, "prompt": p.text, "workload": p.workload}, ensure_ascii=False) + "\n"
                   for p in prompts)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def grow_prompt_file(engine, path, n: int, others: list[Prompt], held_out_texts: set[str],
                     round_size: int = 2048, max_rounds: int | None = None, log=print) -> tuple[list[Prompt], bool]:
    """Sample rounds of requests until `path` holds n of them (or max_rounds are done); -> (prompts, saturated).

    others: prompts from elsewhere (the templated ones) that a request must not repeat.
    saturated: a round added almost nothing new (under 2 % of its samples), so more rounds would not help.
    Resumable: the file is the state.
    """
    prompts = read_prompts(path)
    seen = {normalise(p.text) for p in prompts + others}
    held_out = {normalise(t) for t in held_out_texts}
    rounds = 0
    while len(prompts) < n and (max_rounds is None or rounds < max_rounds):
        start = time.perf_counter()
        texts = sample_requests(engine, round_size)
        new = keep_new(texts, seen, held_out)[: n - len(prompts)]
        prompts += new
        write_prompts(path, prompts)
        rounds += 1
        log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} magpie: {round_size} samples, {len(texts)} finished, "
            f"{len(new)} new -> {len(prompts)}/{n} requests ({time.perf_counter() - start:.0f} s)")
        if len(new) < round_size // 50 and len(prompts) < n:
            log(f"magpie: a round added almost nothing; stopping at {len(prompts)} requests")
            return prompts, True
    return prompts, False
