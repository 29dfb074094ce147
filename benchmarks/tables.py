"""Every generated table in the project's Markdown, made from the committed JSON it shows.

A table sits between `<!-- table: NAME -->` and `<!-- end table -->`; NAME is one of TABLES below,
each a function from the results folder to Markdown. `python benchmarks/tables.py` rewrites every
such block; `--check` says which are out of date (tests/test_tables.py runs it), never writing.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", ROOT / "docs" / "TESTING.md", ROOT / "benchmarks" / "README.md",
        ROOT / "book" / "teaching.md"]
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def ci_times(results: Path) -> str:
    """The last committed CI run: each step's time and each pytest call's, with its machine."""
    run = json.loads((results / "ci" / "ci_run.json").read_text())
    m = run["machine"]
    cpu = f"{m['cpu']}, {m['cores']} cores, " + ("bf16 instructions" if m["bf16_instructions"] else "no bf16 instructions")
    lines = [f"`.ci/run`, {run['label']}; {cpu} (`benchmarks/results/ci/ci_run.json`).", "",
             "| step | minutes |", "|---|---:|"]
    lines += [f"| {'**all**' if name == 'all' else f'`{name}`'} | {s / 60:.1f} |" for name, s in run["steps_s"].items()]
    lines += ["", "| pytest call | tests | minutes | slowest file |", "|---|---:|---:|---|"]
    for name, call in run["pytest"].items():
        file, seconds = next(iter(call["by_file_s"].items()), ("", 0.0))
        lines.append(f"| {name} | {call['tests']} | {call['wall_s'] / 60:.1f} | {file} ({seconds:.0f} s) |")
    return "\n".join(lines) + "\n"


def chapter_times(results: Path) -> str:
    """Each chapter's time in quick and full mode, as notebooks/execute.py filed it, with the machines."""
    path = results / "chapter_times.json"
    times = json.loads(path.read_text())["chapters"] if path.exists() else {}
    chapters = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    machines = sorted({(e["cpu"], e["cores"], e["cpu_bf16"]) for c in times.values() for e in c.values()})

    def cell(chapter, mode):
        entry = times.get(chapter, {}).get(mode)
        if entry is None:
            return "not measured yet"
        mark = f" ({machines.index((entry['cpu'], entry['cores'], entry['cpu_bf16'])) + 1})" if len(machines) > 1 else ""
        return f"{entry['seconds'] / 60:.1f}{mark}"

    lines = ["| chapter | quick mode, minutes | full mode, minutes |", "|---|---:|---:|"]
    lines += [f"| {c} | {cell(c, 'quick')} | {cell(c, 'full')} |" for c in chapters]
    bf16 = {True: "bf16 instructions", False: "no bf16 instructions", None: "bf16 instructions unknown"}
    named = [f"{'(' + str(i + 1) + ') ' if len(machines) > 1 else ''}{cpu}, {cores} cores, {bf16[b]}"
             for i, (cpu, cores, b) in enumerate(machines)]
    lines += ["", "Each chapter run alone, top to bottom, by `notebooks/execute.py` on an otherwise idle machine "
              f"({'; '.join(named) or 'none yet'}; `benchmarks/results/chapter_times.json`)."]
    return "\n".join(lines) + "\n"


def reference(results: Path) -> str:
    """The book's reference run (benchmarks/reference.py): every method at its chapter's k, beside AR, per run."""
    paths = sorted(results.glob("reference_*.json"))
    if not paths:
        return "No reference run is committed yet: `make reference` makes one.\n"
    out = []
    for path in paths:
        data = json.loads(path.read_text())
        m, runs = data["machine"], data["runs"]
        ks = {r["method"]: r["k"] for r in runs[-1]["results"]}  # the last run has each method at one k
        cells = {}
        for run in runs:
            for r in run["results"]:
                if ks.get(r["method"]) == r["k"] and r.get("tree") is None:
                    cells[r["method"], run["workload"], run["sampling"]] = r
        bf16 = "bf16 instructions" if m.get("cpu_bf16") else "no bf16 instructions"
        kernels = "" if m.get("row_invariant") else " with torch's own kernels"
        first = runs[0]
        out += [f"`make reference`: {first['num_prompts']} held-out prompts x {first['max_new_tokens']} new tokens "
                f"per run, {m['dtype']}{kernels}, batch 1; {m['cpu']} ({bf16}), {m['cores']} cores, otherwise idle "
                f"(`benchmarks/results/{path.name}`). Cell: speedup over AR in the same run "
                "(mean acceptance length).", "",
                "| method | k | " + " | ".join(f"{r['workload']}, {r['sampling']}" for r in runs) + " |",
                "|---|---:|" + "---|" * len(runs)]
        for method, k in ks.items():
            if method == "ar":
                continue
            row = [cells.get((method, r["workload"], r["sampling"])) for r in runs]
            shown = [f"{c['speedup']:.2f}× ({c['mean_acceptance_length']:.2f})" if c else "–" for c in row]
            out.append(f"| `{method}` | {k} | " + " | ".join(shown) + " |")
        ar = [next(r for r in run["results"] if r["method"] == "ar")["tok_per_s"] for run in runs]
        out += ["| AR, tok/s | | " + " | ".join(f"{t:.1f}" for t in ar) + " |", ""]
    return "\n".join(out)


def row_invariance(results: Path) -> str:
    """benchmarks/row_invariance.py: plain decoding with rows computed alike, torch's kernels and HF generate;
    verify cost against rows; every method's greedy match, per dtype."""
    paths = sorted(results.glob("row_invariance_*.json"))
    if not paths:
        return "No run of `make row-invariance` is committed yet.\n"
    out = []
    for path in paths:
        data = json.loads(path.read_text())
        c = data["config"]
        m = data["runs"][0]["machine"]
        bf16 = "bf16 instructions" if m.get("cpu_bf16") else "no bf16 instructions"
        disturbed = [r["dtype"] for r in data["runs"] if (r["conditions"] or {}).get("disturbed")
                     or (r["methods_conditions"] or {}).get("disturbed")]
        out += [f"`make row-invariance`: {c['num_prompts']} held-out mixed prompts x {c['max_new_tokens']} new tokens, "
                f"greedy, batch 1; {m['cpu']} ({bf16}), {m['cores']} cores, "
                + (f"disturbed ({', '.join(disturbed)})" if disturbed else "otherwise idle")
                + f" (`benchmarks/results/{path.name}`). Plain decoding's tok/s with rows computed alike, and "
                "the others as a ratio of it; a verify pass over n rows in one-row passes; the lowest greedy "
                "match of every method (each at its book k) and every tree, against plain decoding.", "",
                "| dtype | AR tok/s, rows alike | torch's kernels | HF generate | verify 4 rows: alike / torch's "
                "| verify 9 rows: alike / torch's | greedy match, lowest |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for r in data["runs"]:
            ar, v = r["plain_decoding"], r["verify_cost"]
            cost = {n: f"{v['invariant']['over_one_row'][str(n)]:.2f} / {v['torch_kernels']['over_one_row'][str(n)]:.2f}"
                    for n in (4, 9)}
            worst = min(x["greedy_match"] for x in r["methods"])
            out.append(f"| {r['dtype']} | {ar['invariant']['tok_per_s']:.1f} | "
                       f"{ar['torch_kernels']['over_invariant']:.2f}× | {ar['hf_generate']['over_invariant']:.2f}× | "
                       f"{cost[4]} | {cost[9]} | {worst:.2f} |")
        out.append("")
    return "\n".join(out)


TABLES = {"ci-times": ci_times, "chapter-times": chapter_times, "reference": reference,
          "row-invariance": row_invariance}


def render(text: str, results: Path = RESULTS) -> str:
    """`text` with every table block made anew; an unknown table name is an error."""
    def fill(m: re.Match) -> str:
        if m["name"] not in TABLES:
            raise KeyError(f"unknown table {m['name']!r}: known are {', '.join(TABLES)}")
        return m.group(1) + TABLES[m["name"]](results) + m.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only say which files are out of date (exit 1 if any)")
    args = ap.parse_args(argv)
    stale = []
    for doc in DOCS:
        if not doc.exists():
            continue
        text = doc.read_text()
        new = render(text)
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                tmp = doc.with_suffix(doc.suffix + ".tmp")
                tmp.write_text(new)
                tmp.replace(doc)
    for doc in stale:
        print(f"{doc}: {'out of date: run python benchmarks/tables.py' if args.check else 'rewritten'}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
