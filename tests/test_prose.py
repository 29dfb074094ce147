"""The chapters' prose never drifts from their numbers.

Every figure a chapter's text states (a decimal number, outside math and
code) must appear in that chapter's own outputs or code, where a rerun
changes it, or be a quotation listed with its source in book/quoted.yml.
Measured figures that prose needs are written by a code cell from the
results they describe (a computed Markdown cell, `remove-input` in the book),
so the text and the numbers come from the same run.
"""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the book extra is not installed: `make setup`")
yaml = pytest.importorskip("yaml", reason="the book extra is not installed: `make setup`")

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
QUOTED = yaml.safe_load((ROOT / "book" / "quoted.yml").read_text())

FIGURE = re.compile(r"(?<![\w./-])(\d+\.\d+)(?![\d.]*\d)")
NOT_PROSE = [
    re.compile(r"\$\$.*?\$\$", re.S),  # display math
    re.compile(r"\$[^$]*\$"),  # inline math (it may wrap a line)
    re.compile(r"```.*?```", re.S),  # code blocks
    re.compile(r"`[^`\n]*`"),  # inline code
    re.compile(r"\(https?://[^)]*\)|<https?://[^>]*>"),  # link targets
    re.compile(r"arXiv \d{4}\.\d{4,5}"),  # paper ids
]


def prose_figures(text: str) -> list[str]:
    for pattern in NOT_PROSE:
        text = pattern.sub(" ", text)
    return FIGURE.findall(text)


def shown(nb) -> str:
    """What the chapter's cells print, display and contain: where a stated figure must be found."""
    parts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.extend(v for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def quoted(chapter: str) -> set[str]:
    return {figure for entry in QUOTED.get(chapter, []) for figure in entry["figures"]}


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_figure_in_the_prose_is_in_the_outputs_or_quoted(path):
    nb = nbformat.read(path, as_version=4)
    outputs = shown(nb)
    stated = [(i, f) for i, c in enumerate(nb.cells) if c.cell_type == "markdown" for f in prose_figures(c.source)]
    unbacked = [(i, f) for i, f in stated if f not in outputs and f not in quoted(path.stem)]
    assert not unbacked, (
        f"{path.name}: the prose states {unbacked} (cell, figure), which no output of the chapter shows. "
        "Write the sentence from the result (a computed Markdown cell), or, for a figure quoted from a source, "
        "list it with the source in book/quoted.yml.")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_quotation_is_still_in_the_prose(path):
    nb = nbformat.read(path, as_version=4)
    prose = {f for c in nb.cells if c.cell_type == "markdown" for f in prose_figures(c.source)}
    stale = quoted(path.stem) - prose
    assert not stale, f"book/quoted.yml lists {sorted(stale)} for {path.stem}, whose prose no longer states them"


def test_quotations_name_their_source():
    assert set(QUOTED) <= {p.stem for p in CHAPTERS}
    for chapter, entries in QUOTED.items():
        for entry in entries:
            assert entry["figures"] and len(entry["source"]) > 10, (chapter, entry)


def test_the_checker_sees_a_drifted_figure():
    """The check itself: a sentence whose number no output shows is caught, math and code are not prose."""
    assert prose_figures("the head's README measured 1.38 at $k = 1.5$ and `x = 2.5`, see arXiv 2607.05147") == ["1.38"]
    assert prose_figures("Qwen3.5 and 3.6 GB at 0.87x, v1.2.3") == ["3.6", "0.87"]


# --- claims of direction -----------------------------------------------------------------
# A sentence that says a method is faster or slower, pays or does not, is a claim about a
# measurement. Beside a ratio (1.31x) the ratio must agree with it; without one, a claim about
# this book's own runs ("here", "above", "on this CPU") must be conditional or general, since the
# live runs differ from machine to machine: a measured direction is written by a code cell from
# the figure it describes.
UP = r"faster|speeds? up|pays off|it pays|still pays"
DOWN = r"slower|slows? down|does not pay|doesn't pay|no faster|no gain"
DIRECTION = re.compile(rf"\b(?:(?P<up>{UP})|(?P<down>{DOWN})|stops paying)\b", re.I)
RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?[x×](?!\w)")
CONDITIONAL = re.compile(r"\b(if|when|whenever|where|unless|whether|would|can|cannot|could|may|might|until|"
                         r"expect|usually|typically)\b", re.I)
OURS = re.compile(r"\b(here|above|below|this run|these prompts|this CPU|this machine|on this|measured)\b", re.I)
SENTENCE = re.compile(r"(?<=[.!?:;])\s+(?=[A-Z*(])|\n\s*\n|\n\s*[*-] ")


def sentences(text: str) -> list[str]:
    for pattern in (re.compile(r"```.*?```", re.S), re.compile(r"\$\$.*?\$\$", re.S)):
        text = pattern.sub(" ", text)
    return [s.replace("\n", " ") for s in SENTENCE.split(text) if s.strip()]


def disagreements(sentence: str) -> list[str]:
    """Each direction word whose nearest ratio in the sentence says the opposite."""
    ratios = [(m.start(), float(m.group(1))) for m in RATIO.finditer(sentence)]
    wrong = []
    for claim in DIRECTION.finditer(sentence):
        if not ratios or not (claim.group("up") or claim.group("down")):
            continue
        _, ratio = min(ratios, key=lambda r: abs(r[0] - claim.start()))
        if (claim.group("up") and ratio <= 1.0) or (claim.group("down") and ratio >= 1.0):
            wrong.append(f"{claim.group(0)!r} beside {ratio}x")
    return wrong


def bare_claim(sentence: str) -> bool:
    """A direction about this book's own runs with no figure beside it and nothing conditional about it."""
    return bool(DIRECTION.search(sentence) and OURS.search(sentence) and not RATIO.search(sentence)
                and not CONDITIONAL.search(sentence))


def prose_and_computed(nb):
    """(cell, text, computed?) for every Markdown cell and every Markdown a code cell displays."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            yield i, cell.source, False
        for out in cell.get("outputs", []):
            if "text/markdown" in out.get("data", {}):
                yield i, out["data"]["text/markdown"], True


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_claim_of_direction_agrees_with_its_figure(path):
    nb = nbformat.read(path, as_version=4)
    wrong = [(i, w, s[:120]) for i, text, _ in prose_and_computed(nb) for s in sentences(text) for w in disagreements(s)]
    assert not wrong, f"{path.name}: a sentence says the opposite of the ratio beside it (cell, claim, sentence): {wrong}"
    bare = [(i, s[:160]) for i, text, computed in prose_and_computed(nb) if not computed
            for s in sentences(text) if bare_claim(s)]
    assert not bare, (
        f"{path.name}: these sentences say which way this book's runs went with no figure beside them (cell, "
        f"sentence): {bare}. Write them from the result (a computed Markdown cell) or say what decides it.")


def test_the_direction_checker_sees_a_contradiction():
    assert disagreements("MTP here is slower than plain decoding, at 1.25x.") == ["'slower' beside 1.25x"]
    assert disagreements("n-gram ran at 1.31x, faster than plain decoding; EAGLE-3 at 0.84x, slower.") == []
    assert disagreements("DSpark ran between 1.15x and 1.63x faster on Qwen3-8B.") == []
    assert bare_claim("So MTP here is *slower* than plain decoding.")
    assert not bare_claim("Where acceptance is low, MTP is slower than plain decoding.")
    assert not bare_claim("A tree pays for that with a wider verify pass.")  # no run of ours named
