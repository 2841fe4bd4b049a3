#!/usr/bin/env python3
"""Plots the metrics.jsonl of one or more dspine-train runs as PNGs (headless).

    scripts/plot_metrics.py --run tiny=runs/tiny/metrics.jsonl [--run other=PATH ...] --out DIR

Writes DIR/<panel>.png for every panel some run has data for (loss terms, accuracy, tau,
acceptance by block position, lr, throughput, memory) and DIR/overview.png with all of them. Training records and the acceptance
evaluation's records (eval/..., training.eval_every) share the step axis; one colour per run.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the back end is chosen)

# panel -> (title, y label, [(metric key, label)] or a key prefix followed by k, y transform)
LOSS_TERMS = [
    ("loss", "loss"),
    ("dspine/backbone_ce", "backbone CE"),
    ("dspine/backbone_l1", "backbone L1"),
    ("dspine/refinement_loss", "refinement"),
    ("dspine/alignment_loss", "alignment"),
    ("gspo/kl", "GSPO KL"),
]
PANELS = {
    "loss": ("Loss terms", "loss", LOSS_TERMS, None),
    "accuracy": ("Accuracy", "accuracy",
                 [("accuracy", "train (window)"), ("eval/accuracy", "eval, teacher-forced")], None),
    "tau": ("Mean accepted length τ (accepted + 1)", "τ",
            [("eval/tau", "backbone argmax"), ("eval/tau_refine", "refinement walk"),
             ("eval/tau_sampled", "speculative sampling"), ("gspo/accepted_length", "GSPO rollout")],
            None),
    # Keys found in the records: eval/accept_<k>, k = 1..block_size-1 (backbone argmax).
    "acceptance": ("Blocks with the first k proposals accepted", "fraction", "eval/accept_", None),
    "lr": ("Learning rate", "lr", [("lr", "lr")], None),
    "throughput": ("Throughput", "tokens / s", [("tokens_per_s", "tokens/s")], None),
    "memory": ("Peak memory", "GiB", [("memory_bytes", "peak")], lambda v: v / 2**30),
}
STYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1))]


def read_run(path):
    """The records of a metrics JSONL file, in step order; a clear error for a bad file."""
    try:
        with open(path) as handle:
            lines = [(n, line) for n, line in enumerate(handle, 1) if line.strip()]
    except OSError as e:
        sys.exit(f"plot_metrics: cannot read {path}: {e.strerror}")
    records = []
    for number, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_metrics: {path}:{number}: not a JSON line ({e.msg})")
        if not isinstance(record, dict) or "step" not in record:
            sys.exit(f"plot_metrics: {path}:{number}: a record needs a 'step'")
        records.append(record)
    return sorted(records, key=lambda r: r["step"])


def series(records, key, transform):
    points = [(r["step"], r[key]) for r in records
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if transform:
        points = [(s, transform(v)) for s, v in points]
    return [s for s, _ in points], [v for _, v in points]


def position_keys(prefix, runs):
    """(key, label) of every prefix<k> key in the runs' records, by k."""
    ks = {int(key[len(prefix):]) for _, records in runs for r in records for key in r
          if key.startswith(prefix) and key[len(prefix):].isdigit()}
    return [(f"{prefix}{k}", f"k = {k}") for k in sorted(ks)]


def draw_panel(axis, panel, runs):
    """Draws one panel on `axis`; False when no run has any of its metrics."""
    title, ylabel, keys, transform = PANELS[panel]
    if isinstance(keys, str):
        keys = position_keys(keys, runs)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = False
    for r, (name, records) in enumerate(runs):
        for k, (key, label) in enumerate(keys):
            steps, values = series(records, key, transform)
            if not steps:
                continue
            legend = label if len(runs) == 1 else f"{name}: {label}"
            axis.plot(steps, values, linestyle=STYLES[k % len(STYLES)],
                      color=colours[r % len(colours)], marker="o" if len(steps) < 12 else None,
                      markersize=3, label=legend)
            drawn = True
    axis.set_title(title)
    axis.set_xlabel("step")
    axis.set_ylabel(ylabel)
    if panel == "loss" and drawn:
        axis.set_yscale("log")
    if drawn:
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    return drawn


def parse_runs(specs):
    runs = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:  # a bare path: named after its directory
            name, path = os.path.basename(os.path.dirname(os.path.abspath(spec))), spec
        if not name or not path:
            sys.exit(f"plot_metrics: --run {spec!r}: expected name=path/to/metrics.jsonl")
        runs.append((name, read_run(path)))
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="NAME=PATH",
                        help="a run's metrics.jsonl (repeat for several runs)")
    parser.add_argument("--out", required=True, help="directory for the PNGs")
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args()
    runs = parse_runs(args.run)
    os.makedirs(args.out, exist_ok=True)

    written = []
    for panel in PANELS:
        figure, axis = plt.subplots(figsize=(6, 4))
        if draw_panel(axis, panel, runs):
            figure.tight_layout()
            path = os.path.join(args.out, f"{panel}.png")
            figure.savefig(path, dpi=args.dpi)
            written.append(path)
        plt.close(figure)
    if not written:
        sys.exit("plot_metrics: no known metric in " + ", ".join(args.run))

    present = [p for p in PANELS if os.path.join(args.out, f"{p}.png") in written]
    columns = min(4, len(present))
    rows = math.ceil(len(present) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for axis, panel in zip(axes.flat, present):
        draw_panel(axis, panel, runs)
    for axis in list(axes.flat)[len(present):]:
        axis.set_visible(False)
    figure.tight_layout()
    overview = os.path.join(args.out, "overview.png")
    figure.savefig(overview, dpi=args.dpi)
    written.append(overview)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
