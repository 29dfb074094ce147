"""Build the book: fetch the JavaScript it needs, copy the chapters in, run Jupyter Book.

    .venv/bin/python book/build.py                # -> book/_build/html/index.html
    .venv/bin/python book/build.py --instructor   # -> book/_instructor/_build/html/index.html
    .venv/bin/python book/build.py --repository https://github.com/OWNER/NAME   # the published book

The instructor edition is the same book with a worked solution after every
exercise and lab, from book/solutions.py (the student chapters hold none).

Jupyter Book 1 pages load MathJax, and pages with widget state also load
require.js and the ipywidgets embed script, by default from CDNs. A book must
work offline, so we fetch the three packages from the npm registry (with npm,
the ordinary client) into book/_vendor/, which Sphinx copies to the site root.
They are fetched at build time, never committed.

The chapters live in ../notebooks (one source of truth, executed in quick
mode); they are copied into book/chapters/ because Sphinx only reads files
under the book's folder. Warnings are errors.

`--repository URL` (the publishing workflow, .github/workflows/book.yml) links
the source from every page and from the landing page's `{{ repository }}`;
without it the landing page names the repository without a link.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

BOOK = Path(__file__).resolve().parent
NOTEBOOKS = BOOK.parent / "notebooks"
VENDOR = BOOK / "_vendor"

# npm package -> [(path inside the package, where it goes under _vendor/)]
PACKAGES = {
    "mathjax@3.2.2": [("es5", "mathjax")],
    "requirejs@2.3.8": [("require.js", "require.js")],
    "@jupyter-widgets/html-manager@1.0.15": [("dist", "html-manager")],
}

# The embed script's modules find their fonts next to their require.js module
# id, "@jupyter-widgets/html-manager/dist/...", a path that exists only on a
# CDN. This runs after require.js and before the embed script (_config.yml)
# and maps that id onto the folder the files were copied to.
ASSETS_PATH_JS = """\
// Written by book/build.py: embed-amd.js finds its fonts in this script's own folder.
(function () {
  var folder = document.currentScript.src.replace(/[^/]*$/, "");  // .../html-manager/
  window.__jupyter_widgets_assets_path__ = folder;
  require.config({paths: {"@jupyter-widgets/html-manager/dist": folder.replace(/\\/$/, "")}});
})();
"""


def fetch_assets() -> None:
    """npm pack each package and unpack the parts the pages load (skipped when present)."""
    stamp = VENDOR / ".fetched"
    if stamp.exists() and stamp.read_text() == repr(PACKAGES):
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("book/build.py needs npm to fetch MathJax, require.js and the ipywidgets embed script "
                 "(Debian: apt-get install npm; `make setup` does this).")
    shutil.rmtree(VENDOR, ignore_errors=True)
    VENDOR.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        for spec, parts in PACKAGES.items():
            out = subprocess.run([npm, "pack", "--silent", spec], cwd=tmp, capture_output=True, text=True)
            if out.returncode != 0:  # npm's own words (no network, no cache, a proxy), not a bare CalledProcessError
                sys.exit(f"book/build.py: `npm pack {spec}` failed (exit {out.returncode}); npm said:\n"
                         f"{(out.stderr or out.stdout).strip()[-2000:]}\n"
                         "The book fetches MathJax and the widget scripts from the npm registry once: build where "
                         "npm reaches it (or its cache holds them), then book/_vendor/ is reused offline.")
            tgz = Path(tmp) / out.stdout.strip().splitlines()[-1]
            with tarfile.open(tgz) as tar:
                tar.extractall(Path(tmp) / tgz.stem, filter="data")
            for src, dst in parts:
                src_path = Path(tmp) / tgz.stem / "package" / src
                if src_path.is_dir():
                    shutil.copytree(src_path, VENDOR / dst, ignore=shutil.ignore_patterns("*.map"))
                else:
                    shutil.copy2(src_path, VENDOR / dst)
    stamp.write_text(repr(PACKAGES))


def copy_chapters() -> None:
    """notebooks/NN_*.ipynb -> book/chapters/ (a fresh copy every build)."""
    chapters = BOOK / "chapters"
    shutil.rmtree(chapters, ignore_errors=True)
    chapters.mkdir()
    for nb in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        shutil.copy2(nb, chapters / nb.name)


def solution_cells(nb) -> int:
    """Put book/solutions.py's solution after each exercise of a chapter (nbformat notebook); -> how many.

    An exercise's reader cell gets a cell after it that defines its solution
    function and calls it with the chapter's variables; a lab's stub is
    replaced by the reference function of the same name.
    """
    import inspect
    import re

    import nbformat

    spec = importlib.util.spec_from_file_location("solutions", BOOK / "solutions.py")
    solutions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solutions)
    done, cells = 0, []
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type != "code" or not cells[-2:-1] or cells[-2].cell_type != "markdown":
            continue
        exercise = re.search(r"\*\*Exercise (\d+)\.(\d+)\.\*\*", cells[-2].source)
        if exercise is None:
            continue
        stub = re.match(r"def (\w+)\(", cell.source)
        if stub:  # a lab: the reference function in place of the stub
            cell.source = "# Solution (instructor edition)\n" + inspect.getsource(getattr(solutions, stub.group(1)))
        else:
            fn = getattr(solutions, f"solution_{exercise.group(1)}_{exercise.group(2)}")
            call = f"answer = {fn.__name__}({', '.join(inspect.signature(fn).parameters)})"
            cells.append(nbformat.v4.new_code_cell("# Solution (instructor edition)\n"
                                                   + inspect.getsource(fn) + "\n\n" + call))
        done += 1
    nb.cells = cells
    return done


def instructor_chapters() -> None:
    """The copies in book/chapters/ with their solutions in (the student notebooks stay as they are)."""
    import nbformat

    for path in sorted((BOOK / "chapters").glob("[0-9]*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        solution_cells(nb)
        nbformat.write(nb, path)


def published_config(url: str) -> Path:
    """_config.yml with the repository linked: its button on every page, and the landing page's substitution."""
    import yaml

    config = yaml.safe_load((BOOK / "_config.yml").read_text())
    config["repository"] = {"url": url, "branch": "main", "path_to_book": "book"}
    config["html"]["use_repository_button"] = True
    config.setdefault("parse", {}).setdefault("myst_substitutions", {})["repository"] = f"[its repository]({url})"
    path = BOOK / "_config.published.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def build(instructor: bool = False, repository: str | None = None) -> Path:
    fetch_assets()
    (VENDOR / "html-manager" / "assets-path.js").write_text(ASSETS_PATH_JS)
    copy_chapters()
    out = BOOK / ("_instructor" if instructor else ".")
    try:
        if instructor:
            instructor_chapters()
        jupyter_book = Path(sys.executable).parent / "jupyter-book"
        cmd = [str(jupyter_book), "build", str(BOOK), "--all", "--warningiserror", "--keep-going", "--quiet",
               "--path-output", str(out)]
        if repository:
            cmd += ["--config", str(published_config(repository))]
        done = subprocess.run(cmd)
    finally:
        (BOOK / "_config.published.yml").unlink(missing_ok=True)
        if instructor:  # the next student build must not find solutions in chapters/
            copy_chapters()
    if done.returncode != 0:  # jupyter-book printed its own errors above; say which step stopped
        sys.exit(f"book/build.py: jupyter-book build failed (exit {done.returncode}); its messages are above.")
    return out / "_build" / "html"


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instructor", action="store_true", help="with a worked solution after every exercise")
    parser.add_argument("--repository", metavar="URL", help="link the source repository (the published book)")
    args = parser.parse_args()
    print(f"built: {build(args.instructor, args.repository) / 'index.html'}")
