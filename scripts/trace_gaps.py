#!/usr/bin/env python3
"""Where the GPU waits for the host in a Kineto trace (`dspine-bench step --profile-trace F`,
with --profile-phase to trace one phase): the gaps between consecutive device activities longer
than 50 us, the longest ones with the kernels around them, and the gap time grouped by the host
operators running during each gap (docs/benchmarks.md, "GSPO RL step").
Usage: scripts/trace_gaps.py TRACE.json[.gz]"""
import collections
import gzip
import json
import sys

MIN_GAP_US = 50
SHOWN_GAP_US = 300
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
HOST = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def main(path):
    with (gzip.open if path.endswith(".gz") else open)(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    device = sorted((e for e in events if e.get("cat") in DEVICE and "dur" in e),
                    key=lambda e: e["ts"])
    host = [e for e in events if e.get("cat") in HOST and "dur" in e]
    if not device:
        sys.exit(f"{path}: no device activity in the trace")
    gaps = []
    busy_until = device[0]["ts"] + device[0]["dur"]
    for before, after in zip(device, device[1:]):
        busy_until = max(busy_until, before["ts"] + before["dur"])
        gap = after["ts"] - busy_until
        if gap > MIN_GAP_US:
            gaps.append((gap, busy_until, after["ts"], before["name"][:60], after["name"][:60]))
    gaps.sort(reverse=True)
    print(f"device activities {len(device)}; gaps over {MIN_GAP_US} us: "
          f"{sum(g[0] for g in gaps) / 1e3:.2f} ms in {len(gaps)}")
    by_host = collections.Counter()
    for gap, start, end, before, after in gaps:
        overlap = collections.Counter()
        for e in host:
            shared = min(end, e["ts"] + e["dur"]) - max(start, e["ts"])
            if shared > 0:
                overlap[e["name"][:50]] += shared
        names = [name for name, _ in overlap.most_common(6)]
        by_host[" / ".join(names[:3])] += gap
        if gap > SHOWN_GAP_US:
            print(f"{gap:.0f} us | after {before} | before {after} | host: {'; '.join(names)}")
    print("\nGap time by the host operators running during it:")
    for names, total in by_host.most_common(25):
        print(f"{total / 1e3:.2f} ms  {names}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
