#!/usr/bin/env python3
"""Where a CI run's time went: the step times `.ci/run` keeps (results/ci/steps.txt) and each JUnit XML
report that `make test` and `make test-newest` keep (results/ci/*.xml), summed by test file, slowest first.

    python3 .ci/slowest.py [results/ci] [--top N] [--json RECORD.json --label WHAT]

--json writes the run as one record (machine, steps, each pytest call's wall time and files) for
benchmarks/results/ci/, from which docs/TESTING.md's table is made.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def cases(xml_path: Path) -> list[tuple[str, str, float]]:
    """(file, test name, seconds) for every test case in one JUnit XML report."""
    out = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        # pytest's classname is the test's dotted module path ("tests.test_dflash"), a class appended if any
        file = case.get("file") or case.get("classname") or "?"
        out.append((file, case.get("name", "?"), float(case.get("time") or 0.0)))
    return out


def wall_seconds(xml_path: Path) -> float:
    """The pytest call's own wall time (the testsuite element's `time`)."""
    return sum(float(s.get("time") or 0.0) for s in ET.parse(xml_path).getroot().iter("testsuite"))


def by_file(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    """Seconds per test file, slowest first (summed over workers)."""
    sums: dict[str, float] = defaultdict(float)
    for file, _, seconds in rows:
        sums[file] += seconds
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]))


def steps(folder: Path) -> dict[str, int]:
    """{step: seconds} from the lines `== STEP: N s` that .ci/run appends to steps.txt."""
    out = {}
    file = folder / "steps.txt"
    for line in file.read_text().splitlines() if file.exists() else []:
        name, _, seconds = line.removeprefix("== ").rpartition(": ")
        if seconds.endswith(" s"):
            out[name] = int(seconds[:-2])
    return out


def machine() -> dict:
    """The CPU model, its cores and whether it has bf16 instructions, read from /proc/cpuinfo, and the instruction
    set oneDNN was capped at (ONEDNN_MAX_CPU_ISA, e.g. AVX2: the suite computing as on an AVX2-only CPU)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return {"cpu": model or platform.processor() or "unknown", "cores": os.cpu_count(),
            "bf16_instructions": "avx512_bf16" in flags or "amx_bf16" in flags, "amx": "amx_bf16" in flags,
            "avx512": "avx512f" in flags, "isa_cap": isa_cap()}


def isa_cap() -> str | None:
    """ONEDNN_MAX_CPU_ISA as specdec_learn.limits.isa_cap reads it (this script runs without the library)."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return None if cap in ("", "ALL", "DEFAULT") else cap


def record(folder: Path, label: str) -> dict:
    """One CI run as a JSON-able record."""
    calls = {}
    for report in sorted(folder.glob("*.xml")):
        rows = cases(report)
        calls[report.stem] = {"tests": len(rows), "wall_s": round(wall_seconds(report), 1),
                              "by_file_s": {f: round(s, 1) for f, s in by_file(rows).items() if s >= 0.05}}
    return {"label": label, "machine": machine(), "steps_s": steps(folder), "pytest": calls}


def write_json_atomic(file: Path, data: dict) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=file.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(data, tmp, indent=1)
        tmp.write("\n")
    os.replace(tmp.name, file)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="results/ci", help="where steps.txt and the XML reports are")
    ap.add_argument("--top", type=int, default=25, help="how many files and tests to list (default 25)")
    ap.add_argument("--json", type=Path, help="also write the run as one record to this file")
    ap.add_argument("--label", default="", help="what the record is (e.g. 'before the cut, clean clone')")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    reports = sorted(folder.glob("*.xml"))
    if not reports:
        print(f"{folder}: no JUnit XML reports; run make test (or .ci/run) first", file=sys.stderr)
        return 1
    for name, seconds in steps(folder).items():
        print(f"step {name}: {seconds} s")
    for report in reports:
        rows = cases(report)
        files = by_file(rows)
        print(f"\n== {report}: {len(rows)} tests in {wall_seconds(report) / 60:.1f} min "
              f"({sum(files.values()) / 60:.1f} min of test time, summed over workers)")
        for file, seconds in list(files.items())[: args.top]:
            print(f"{seconds:8.1f} s {100 * seconds / max(sum(files.values()), 1e-9):5.1f} %  {file}")
        print("   slowest tests:")
        for file, name, seconds in sorted(rows, key=lambda r: -r[2])[: args.top]:
            print(f"{seconds:8.1f} s  {file}::{name}")
    if args.json:
        write_json_atomic(args.json, record(folder, args.label))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
