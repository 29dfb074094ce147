"""The import rules of docs/ARCHITECTURE.md, checked on the source (no module is imported).

* drafters/ never import train/, the CLI, bench, the zoo or the vLLM backend:
  a method file is read on its own, and training depends on drafting, not
  the other way round;
* formats/ import nothing of the library but formats/ and models: a format
  module translates files, it never builds a network or a drafter;
* every import runs down the floors below, lazy imports inside functions too
  (ast.walk sees them): a module may import its own floor and those beneath;
* no module imports another module's private (underscored) names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_learn"


def module_name(file: Path) -> str:
    parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(file: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) for every import in `file`, relative ones resolved."""
    tree = ast.parse(file.read_text(encoding="utf-8"))
    package = module_name(file).split(".")
    if file.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((module, [alias.name for alias in node.names]))
    return found


def library_files(folder: str = "") -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


FORBIDDEN = {
    "drafters": ("specdec_learn.train", "specdec_learn.cli", "specdec_learn.bench", "specdec_learn.zoo",
                 "specdec_learn.vllm_backend"),
    "formats": ("specdec_learn.drafters", "specdec_learn.train", "specdec_learn.cli", "specdec_learn.bench",
                "specdec_learn.zoo", "specdec_learn.vllm_backend", "specdec_learn.checkpoints",
                "specdec_learn.target", "specdec_learn.decode"),
}


# The floors, lowest first (docs/ARCHITECTURE.md, "Import rules"). The core decodes; the vLLM backend decodes
# the same recipes faster; training runs both to make its data; the zoo names drafters (and counts a cut
# vocabulary in the training corpus); the bench runs them; the book's modules show them; the CLI drives all.
FLOORS = [
    ("core", ("methods", "sampling", "stats", "limits", "quiet", "tree", "verify", "models", "compat", "speedups",
              "invariant", "kv_cache", "target", "vocab", "formats", "checkpoints", "drafters", "decode", "workloads")),
    ("vllm", ("vllm_backend",)),
    ("train", ("train",)),
    ("zoo", ("zoo",)),
    ("bench", ("bench",)),
    ("book", ("plots", "widgets", "exercises", "labs")),
    ("cli", ("cli",)),
]


def floor_of(module: str) -> int | None:
    """The floor of `specdec_learn.<top>...`; None for the package itself and for other packages."""
    parts = module.split(".")
    if parts[0] != "specdec_learn" or len(parts) < 2:
        return None
    found = [i for i, (_, tops) in enumerate(FLOORS) if parts[1] in tops]
    assert found, f"{module} is on no floor: add it to FLOORS and to docs/ARCHITECTURE.md"
    return found[0]


def test_imports_run_down_the_floors():
    bad = []
    for file in library_files():
        here = floor_of(module_name(file))
        if here is None:
            continue
        for module, names in imports(file):
            there = floor_of(module)
            if there is None and module == "specdec_learn":  # from specdec_learn import x
                there = max((floor_of(f"specdec_learn.{n}") or 0) for n in names)
            if there is not None and there > here:
                bad.append(f"{file.relative_to(PACKAGE)} ({FLOORS[here][0]}) imports {module} "
                           f"({FLOORS[there][0]})")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_layers_import_only_downwards(folder):
    bad = []
    for file in library_files(folder):
        for module, names in imports(file):
            targets = [module] + [f"{module}.{n}" for n in names]
            if any(t == f or t.startswith(f + ".") for t in targets for f in FORBIDDEN[folder]):
                bad.append(f"{file.relative_to(PACKAGE)} imports {module} {names}")
    assert not bad, "\n".join(bad)


def test_no_module_imports_private_names():
    bad = []
    for file in library_files():
        for module, names in imports(file):
            if module.startswith("specdec_learn"):
                bad += [f"{file.relative_to(PACKAGE)}: from {module} import {n}"
                        for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


def test_the_rules_see_a_violation(tmp_path, monkeypatch):
    """The checker itself: a drafter importing a trainer, and a private import, are both found."""
    fake = tmp_path / "specdec_learn"
    (fake / "drafters").mkdir(parents=True)
    (fake / "drafters" / "bad.py").write_text("from ..train.eagle3 import _secret\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    with pytest.raises(AssertionError, match="imports specdec_learn.train.eagle3"):
        test_layers_import_only_downwards("drafters")
    with pytest.raises(AssertionError, match="_secret"):
        test_no_module_imports_private_names()
    (fake / "vocab.py").write_text("def counted():\n    from .train.corpus import load_split\n")
    (fake / "train").mkdir()
    (fake / "train" / "corpus.py").write_text("")
    with pytest.raises(AssertionError, match=r"vocab.py \(core\) imports specdec_learn.train.corpus \(train\)"):
        test_imports_run_down_the_floors()
