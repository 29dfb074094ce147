"""Re-run chapters in quick mode and store their outputs (what nbval compares and the book shows).

    .venv/bin/python notebooks/execute.py                   # every chapter
    .venv/bin/python notebooks/execute.py 02_draft_and_verify
    .venv/bin/python notebooks/execute.py --full 09_tuning_k    # time full mode; stores no outputs

Runs each notebook top to bottom in a fresh kernel with SPECDEC_QUICK=1,
keeps the ipywidgets state, and replaces machine-specific paths in the
outputs (the repository, the home directory, site-packages) by placeholders,
so that stored notebooks do not leak where they were made.

Each run's time goes to benchmarks/results/chapter_times.json, per chapter
and mode, with the machine, unless other processes disturbed it
(specdec_learn/quiet.py): the teachers' page states the times from there.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from specdec_learn.quiet import conditions, snapshot

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TIMES = REPO / "benchmarks" / "results" / "chapter_times.json"


def scrub(text: str) -> str:
    """Machine-specific paths -> placeholders."""
    text = re.sub(r"/[^\s'\"]*/site-packages/", "<site-packages>/", text)
    text = text.replace(str(REPO), "<repo>")
    return text.replace(str(Path.home()), "~")


def scrub_outputs(nb) -> None:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = scrub(out["text"])
            for mime, value in out.get("data", {}).items():
                if isinstance(value, str) and not mime.startswith("image/"):
                    out["data"][mime] = scrub(value)


def clear_checks(nb) -> None:
    """Exercise check cells are stored without output: their verdict would give the answer away."""
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("check("):
            cell.outputs, cell.execution_count = [], None


def execute(path: Path, timeout: int = 900, full: bool = False) -> float:
    """Run a chapter; store its outputs (quick mode), or with full=True only time it (full mode)."""
    nb = nbformat.read(path, as_version=4)
    if full:
        os.environ.pop("SPECDEC_QUICK", None)
    else:
        os.environ["SPECDEC_QUICK"] = "1"
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}},
                   store_widget_state=True).execute()
    if full:  # the stored chapters are quick mode, what nbval compares
        return time.perf_counter() - t0
    scrub_outputs(nb)
    clear_checks(nb)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # written whole, then renamed: never half a chapter
    nbformat.write(nb, tmp)
    os.replace(tmp, path)
    return time.perf_counter() - t0


def record_time(chapter: str, mode: str, seconds: float, conditions: dict) -> str:
    """File a chapter's time under its mode in TIMES (with the machine); a disturbed run is not filed."""
    from specdec_learn.bench import machine_info
    from specdec_learn.formats.io import write_text_atomic
    from specdec_learn.quiet import warning

    if conditions["disturbed"]:
        return warning(conditions)
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {"chapters": {}}
    machine = machine_info()
    entry = {"seconds": round(seconds), "cpu": machine["cpu"], "cores": machine["cores"],
             "cpu_bf16": machine["cpu_bf16"], "cpu_amx": machine["cpu_amx"],
             "others_cpu_share": conditions["others_cpu_share"]}
    times["chapters"].setdefault(chapter, {})[mode] = entry
    times["chapters"] = dict(sorted(times["chapters"].items()))
    write_text_atomic(TIMES, json.dumps(times, indent=2) + "\n")
    return f"filed in {TIMES.relative_to(REPO)}"


def main(names: list[str]) -> None:
    full = "--full" in names
    names = [n for n in names if n != "--full"]
    paths = [HERE / f"{n}.ipynb" for n in names] if names else sorted(HERE.glob("[0-9]*.ipynb"))
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        sys.exit(f"No chapter {', '.join(missing)} in {HERE}.")
    failed = []
    for path in paths:
        try:
            start = snapshot()
            seconds = execute(path, timeout=3600 if full else 900, full=full)
            filed = record_time(path.stem, "full" if full else "quick", seconds, conditions(start, snapshot()))
            print(f"{path.name}: {seconds:.0f} s" + (" (full mode, outputs not stored)" if full else "")
                  + f"; {filed}", flush=True)
        except Exception as e:  # report, and go on with the other chapters
            print(f"{path.name}: FAILED, stored notebook left as it was\n{e}", flush=True)
            failed.append(path.name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
