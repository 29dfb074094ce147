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
