#!/usr/bin/env python3
"""The table of an ablation's results.jsonl (one line per finished run: "run", "seconds" and the
measures), as Markdown: one row per run name in order of first appearance, each measure as
mean ± standard error over the run's seeds (the mean alone for one seed), and the mean seconds.

    scripts/results_table.py RESULTS KEY=HEADER [KEY=HEADER ...]

Used by scripts/gspo_testbed_ablation.sh and scripts/decoding_ablation.sh.
"""
import json
import math
import sys
from collections import OrderedDict


def cell(rows, key):
    v = [r[key] for r in rows]
    m = sum(v) / len(v)
    if len(v) < 2:
        return f"{m:.3f}"
    se = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v))
    return f"{m:.3f} ± {se:.3f}"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    columns = [spec.split("=", 1) for spec in sys.argv[2:]]
    runs = OrderedDict()
    for r in map(json.loads, open(sys.argv[1])):
        runs.setdefault(r["run"], []).append(r)
    print("| run | seeds | " + " | ".join(header for _, header in columns) + " | s per run |")
    print("|---|---:|" + "---:|" * len(columns) + "---:|")
    for name, rows in runs.items():
        secs = sum(r["seconds"] for r in rows) / len(rows)
        cells = " | ".join(cell(rows, key) for key, _ in columns)
        print(f"| {name} | {len(rows)} | {cells} | {secs:.0f} |")


if __name__ == "__main__":
    main()
