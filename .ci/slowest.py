#!/usr/bin/env python3
"""Where a test run's time went: each JUnit XML file that `make test` and `make test-newest` keep
(results/ci/*.xml), summed by test file, slowest first, then its slowest tests.

    python3 .ci/slowest.py [results/ci] [--top N]
"""

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def cases(xml_path: Path) -> list[tuple[str, str, float]]:
    """(file, test name, seconds) for every test case in one JUnit XML report."""
    out = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        # pytest's classname is the test's dotted module path ("tests.test_dflash"), a class appended if any
        file = case.get("file") or case.get("classname", "?")
        out.append((file, case.get("name", "?"), float(case.get("time") or 0.0)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="results/ci", help="where the XML reports are")
    ap.add_argument("--top", type=int, default=25, help="how many files and tests to list (default 25)")
    args = ap.parse_args()
    reports = sorted(Path(args.folder).glob("*.xml"))
    if not reports:
        print(f"{args.folder}: no JUnit XML reports; run make test first", file=sys.stderr)
        return 1
    for report in reports:
        rows = cases(report)
        by_file: dict[str, float] = defaultdict(float)
        for file, _, seconds in rows:
            by_file[file] += seconds
        total = sum(by_file.values())
        print(f"\n== {report}: {len(rows)} tests, {total / 60:.1f} min of test time (summed over workers)")
        for file, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{seconds:8.1f} s {100 * seconds / max(total, 1e-9):5.1f} %  {file}")
        print("   slowest tests:")
        for file, name, seconds in sorted(rows, key=lambda r: -r[2])[: args.top]:
            print(f"{seconds:8.1f} s  {file}::{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
