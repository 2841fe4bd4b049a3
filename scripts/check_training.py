#!/usr/bin/env python3
"""Checks a metrics.jsonl written by dspine-train: the loss falls and the accuracy rises.

Compares the mean of the first and last `--window` records; prints both and exits 1 if either
trend is missing. Used by ctest (tiny_config_trains) and handy after any run.
"""
import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("metrics", help="metrics.jsonl of a run")
    parser.add_argument("--window", type=int, default=3, help="records averaged at each end")
    args = parser.parse_args()
    with open(args.metrics) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    if len(records) < 2 * args.window:
        print(f"{args.metrics}: only {len(records)} records; need {2 * args.window}")
        return 1

    def mean(key, part):
        return sum(r[key] for r in part) / len(part)

    first, last = records[: args.window], records[-args.window:]
    ok = True
    for key, should_fall in (("loss", True), ("accuracy", False)):
        start, end = mean(key, first), mean(key, last)
        good = end < start if should_fall else end > start
        ok &= good
        trend = "falls" if should_fall else "rises"
        print(f"{key}: {start:.4f} -> {end:.4f} ({trend}: {'yes' if good else 'NO'})")
    print(f"steps {records[0]['step']}..{records[-1]['step']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
