"""The chapters as files: what nbval cannot see for itself.

nbval (`make test` runs it on notebooks/ in quick mode) compares each cell's
fresh output with the stored one, but it silently skips cells that were never
executed, and it cannot tell a chapter that re-implements the library from
one that imports it. These fast checks read the stored notebooks.
"""

import inspect
import re
from pathlib import Path

import pytest

import specdec_learn

nbformat = pytest.importorskip("nbformat", reason="the book extra is not installed: `make setup`")
yaml = pytest.importorskip("yaml", reason="the book extra is not installed: `make setup`")

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def library_names() -> set[str]:
    """Every function and class defined in specdec_learn's modules."""
    import importlib
    import pkgutil

    names = set()
    for mod in pkgutil.walk_packages(specdec_learn.__path__, "specdec_learn."):
        try:
            module = importlib.import_module(mod.name)
        except Exception:  # optional back ends (vLLM, training) may not import here
            continue
        names |= {n for n, obj in vars(module).items()
                  if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == mod.name}
    return names


def test_there_are_chapters():
    assert len(CHAPTERS) >= 5, f"expected the chapters in notebooks/, found {[c.name for c in CHAPTERS]}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_cell_was_executed_cleanly(path):
    """nbval skips never-executed cells: a stored notebook must have run top to bottom."""
    nb = nbformat.read(path, as_version=4)
    counts = [c.execution_count for c in code_cells(nb) if not c.source.startswith("check(")]  # stored unrun: see below
    assert None not in counts, f"{path.name}: cells {[i for i, n in enumerate(counts) if n is None]} were never executed; run notebooks/execute.py"
    assert counts == sorted(counts), f"{path.name}: cells ran out of order {counts}"
    errors = [o for c in code_cells(nb) for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: stored outputs hold an error: {errors[0].get('ename')}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_shape(path):
    """Imports the library, reads quick mode, uses nbval tags not comments, ends with a summary and exercises."""
    nb = nbformat.read(path, as_version=4)
    source = "\n".join(c.source for c in nb.cells)
    assert "import specdec_learn as sd" in source
    assert 'os.environ.get("SPECDEC_QUICK")' in source, "every chapter must honour quick mode"
    assert not re.search(r"#\s*NBVAL_", source), "use the nbval-* cell tags, not comments (they show in the book)"
    assert "## Summary" in source and "## Exercises" in source
    checks = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("check(")]
    assert checks, "a chapter ends with exercises, each checked (test_exercises.py)"
    assert not [c for c in checks if c.outputs], "a check cell's stored verdict would give the answer away"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_does_not_redefine_the_library(path):
    nb = nbformat.read(path, as_version=4)
    defined = {m for c in code_cells(nb) for m in re.findall(r"^(?:def|class)\s+(\w+)", c.source, flags=re.M)}
    clash = defined & library_names()
    assert not clash, f"{path.name} redefines {sorted(clash)}: import them from specdec_learn instead"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_outputs_hold_no_machine_paths(path):
    text = path.read_text()
    for leak in (str(ROOT), str(Path.home()) + "/", "site-packages/"):
        assert leak not in text, f"{path.name} stores {leak!r} in its outputs; run notebooks/execute.py, which scrubs them"
    assert "../shared/" not in text, f"{path.name} names a path outside the repository, which readers do not have"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapters_write_into_temporary_directories_not_mkdtemp(path):
    """What a chapter writes goes into a tempfile.TemporaryDirectory, removed when its kernel shuts down; a mkdtemp
    folder would stay behind, one more with every Run All (chapter 11's held 77 MB)."""
    nb = nbformat.read(path, as_version=4)
    assert not [c for c in code_cells(nb) if "mkdtemp(" in c.source], \
        f"{path.name}: use tempfile.TemporaryDirectory, not mkdtemp, for what the chapter writes"


def test_toc_lists_exactly_the_chapters():
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    listed = [ch["file"] for part in toc["parts"] for ch in part["chapters"] if ch["file"].startswith("chapters/")]
    assert sorted(listed) == [f"chapters/{p.stem}" for p in CHAPTERS], "book/_toc.yml and notebooks/ disagree"
    assert len(set(listed)) == len(listed), "a chapter listed twice"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_headings_hold_no_math(path):
    """A heading is also an entry of the page's contents sidebar, where MathJax renders hidden or badly."""
    nb = nbformat.read(path, as_version=4)
    headings = [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("#")]
    assert not [h for h in headings if "$" in h], f"{path.name}: write these headings without $...$ math"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_fits_the_page(path):
    """Code cells and the prose's code blocks are wrapped at 88 columns, which the book's column shows whole."""
    nb = nbformat.read(path, as_version=4)
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    code += [(i, block) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
             for block in re.findall(r"```.*?```", c.source, flags=re.S)]
    long = [(i, line) for i, text in code for line in text.splitlines() if len(line) > 88]
    assert not long, f"{path.name}: code lines over 88 columns (cell, line): {long[:3]}"


def test_citations_point_into_the_bibliography():
    """A chapter cites a paper as [text](bib-label); every label it uses is one book/bibliography.md defines."""
    bibliography = (ROOT / "book" / "bibliography.md").read_text()
    labels = set(re.findall(r"^\((bib-[\w-]+)\)=", bibliography, re.M))
    cited = {}
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                for label in re.findall(r"\]\((bib-[\w-]+)\)", cell.source):
                    cited.setdefault(label, path.stem)
    assert cited, "the chapters cite nothing"
    assert not {label: ch for label, ch in cited.items() if label not in labels}, "labels the bibliography lacks"
