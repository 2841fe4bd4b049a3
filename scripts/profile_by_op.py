#!/usr/bin/env python3
"""GPU time of a Chrome trace (`dspine-bench step --profile-trace`) by the code that launched it.

Each kernel is charged to the operator that launched it (the trace's "External id") and to that
operator's enclosing scope on the same thread: the innermost `dspine.*` scope of the forward or an
autograd node of the backward ("autograd::engine::evaluate_function: SliceBackward0").
Usage: scripts/profile_by_op.py TRACE.json[.gz] [--top N]
"""
import argparse
import collections
import gzip
import json


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def short(name, width=60):
    name = name.split("(")[0].split("<")[0].replace("void ", "")
    return name.rsplit("::", 1)[-1][:width]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    events = [e for e in load(args.trace) if e.get("ph") == "X"]
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    by_external = {}
    per_thread = collections.defaultdict(list)
    for op in ops:
        external = op.get("args", {}).get("External id")
        if external is not None and op.get("cat") == "cpu_op":
            by_external.setdefault(external, op)
        per_thread[op["tid"]].append(op)
    for thread_ops in per_thread.values():
        thread_ops.sort(key=lambda e: (e["ts"], -e["dur"]))
    # The scope of every operator, from one pass over each thread's nesting.
    scope_of = {}
    for thread_ops in per_thread.values():
        stack = []  # (end, scope)
        for op in thread_ops:
            while stack and stack[-1][0] < op["ts"] + op["dur"]:
                stack.pop()
            outer = stack[-1][1] if stack else None
            name = op["name"]
            if outer and not outer.startswith("dspine."):
                mine = outer  # an autograd node is the outermost name worth keeping
            elif name.startswith("autograd::engine::evaluate_function"):
                mine = name.split(": ", 1)[-1]
            elif name.startswith("dspine."):
                mine = name  # the innermost scope of the forward
            else:
                mine = outer
            scope_of[id(op)] = mine
            stack.append((op["ts"] + op["dur"], mine))

    def scope(op):
        return scope_of.get(id(op)) or "(no scope)"

    table = collections.defaultdict(lambda: [0.0, 0])
    scopes = collections.defaultdict(float)
    total = 0.0
    for kernel in (e for e in events if e.get("cat") == "kernel"):
        op = by_external.get(kernel.get("args", {}).get("External id"))
        where = scope(op) if op else "(unlinked)"
        launcher = op["name"] if op else "?"
        key = (where, launcher, short(kernel["name"]))
        table[key][0] += kernel["dur"] / 1e3
        table[key][1] += 1
        scopes[where] += kernel["dur"] / 1e3
        total += kernel["dur"] / 1e3
    print(f"kernel time {total:.1f} ms\n\n| scope | ms |\n|---|---:|")
    for name, ms in sorted(scopes.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {name} | {ms:.2f} |")
    print("\n| scope | operator | kernel | ms | calls |\n|---|---|---|---:|---:|")
    for (where, launcher, kernel), (ms, calls) in sorted(table.items(), key=lambda kv: -kv[1][0])[
        : args.top * 3
    ]:
        print(f"| {where} | {launcher} | {kernel} | {ms:.2f} | {calls} |")


if __name__ == "__main__":
    main()
