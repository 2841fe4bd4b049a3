#!/usr/bin/env python3
"""GPU time of a Chrome trace (`dspine-bench step --profile-trace`) by the code that launched it.

Each kernel is charged to the operator that launched it (the trace's "External id") and to that
operator's enclosing scope on the same thread: the innermost `dspine.*` scope of the forward or an
autograd node of the backward ("autograd::engine::evaluate_function: SliceBackward0"). A kernel
that no operator claims (one of the project's own, launched inside a custom autograd function) is
charged to the innermost operator or scope around its launch, found by its correlation id.
--category elementwise,reduction keeps the kernels of those categories (the rules of
src/bench/kernel_profile.cpp); --gaps charges each idle stretch of the GPU longer than 20 us to
the operator that launched the kernel after it (the host was late with that launch); --syncs lists
every host synchronisation (a read of a GPU value: the host waits until the GPU's queue is empty)
with the operator that asked for it, how long the host waited and how long the GPU then sat idle;
--gemms sums the GEMM kernels by launching scope, operator and input shapes (the trace records
shapes) with their rate in TFLOP/s where the operator is a matrix product.
Usage: scripts/profile_by_op.py TRACE.json[.gz] [--top N] [--category C[,C...]]
       [--gaps | --syncs | --gemms]
"""
import argparse
import bisect
import collections
import gzip
import json

# kernel_category() of src/bench/kernel_profile.cpp, first match wins.
CATEGORIES = [
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
    ("gemm", ("gemm", "cutlass", "xmma", "cublas", "nvjet", "splitk", "sm90_")),
    ("reduction", ("reduce", "softmax", "norm", "topk", "sort", "scan", "argmax",
                   "cross_entropy", "radix", "sum")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "copy", "fill", "index", "gather",
                     "scatter", "cat", "where", "embedding", "swiglu", "rope")),
]
GAP_US = 20.0
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def short(name, width=60):
    name = name.replace("(anonymous namespace)::", "").replace("void ", "")
    return name.split("(")[0].split("<")[0].rsplit("::", 1)[-1][:width]


def category(name):
    lower = name.lower()
    if "nccl" in lower:
        return "nccl"
    for label, needles in CATEGORIES:
        if any(n in lower for n in needles):
            return label
    return "other"


def scopes(ops):
    """The scope of every operator, from one pass over each thread's nesting."""
    per_thread = collections.defaultdict(list)
    for op in ops:
        per_thread[op["tid"]].append(op)
    scope_of = {}
    for thread_ops in per_thread.values():
        thread_ops.sort(key=lambda e: (e["ts"], -e["dur"]))
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
    return scope_of


def launch_sites(ops, runtime):
    """The innermost operator or scope around each CUDA runtime call, by its correlation id: the
    launcher of a kernel that no operator claims (the project's own kernels, launched inside a
    custom autograd function rather than an ATen operator)."""
    site = {}
    per_thread = collections.defaultdict(list)
    for op in ops:
        per_thread[op["tid"]].append((op["ts"], 0, -op["dur"], op))
    for call in runtime:
        per_thread[call["tid"]].append((call["ts"], 1, 0, call))
    for items in per_thread.values():
        items.sort(key=lambda item: item[:3])  # at one time: operators (outer first), then calls
        stack = []
        for ts, kind, _, event in items:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < ts:
                stack.pop()
            correlation = event.get("args", {}).get("correlation")
            if kind == 0:
                stack.append(event)
            elif correlation is not None and stack:
                site[correlation] = stack[-1]
    return site


def print_gaps(kernels, launcher, top):
    """Idle stretches of the GPU between consecutive kernels, by the launch that ended them."""
    table = collections.defaultdict(lambda: [0.0, 0])
    kernels = sorted(kernels, key=lambda e: e["ts"])
    end = kernels[0]["ts"] + kernels[0]["dur"] if kernels else 0
    total = 0.0
    for kernel in kernels[1:]:
        gap = kernel["ts"] - end
        if gap > GAP_US:
            table[launcher(kernel)[:2]][0] += gap / 1e3
            table[launcher(kernel)[:2]][1] += 1
            total += gap / 1e3
        end = max(end, kernel["ts"] + kernel["dur"])
    print(f"GPU idle in gaps over {GAP_US:.0f} us: {total:.2f} ms\n")
    print("| scope | operator launched after the gap | ms | gaps |\n|---|---|---:|---:|")
    for (where, op), (ms, count) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {where} | {op} | {ms:.2f} | {count} |")


def print_syncs(events, gpu, scope_of):
    """Each synchronisation's time from the first GPU activity, the host's wait (the innermost
    operator around it, which holds the copy that waits as well), the GPU's idle time until its
    next activity, and that operator."""
    gpu = sorted(gpu, key=lambda e: e["ts"])
    starts = [e["ts"] for e in gpu]
    first = starts[0] if starts else 0
    ops_by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation"):
            ops_by_thread[e["tid"]].append(e)
    syncs = sorted((e for e in events if e.get("cat") == "cuda_runtime" and e["name"] in SYNC_CALLS),
                   key=lambda e: e["ts"])
    print("| at ms (host) | host waited ms | GPU idle after ms | scope | operator |\n"
          "|---:|---:|---:|---|---|")
    idle_total = 0.0
    for sync in syncs:
        end = sync["ts"] + sync["dur"]
        following = bisect.bisect_left(starts, end)
        idle = (starts[following] - end) / 1e3 if following < len(starts) else 0.0
        idle_total += max(idle, 0.0)
        around = [o for o in ops_by_thread[sync["tid"]] if o["ts"] <= sync["ts"] <= o["ts"] + o["dur"]]
        inner = max(around, key=lambda o: o["ts"]) if around else None
        scope = (scope_of.get(id(inner)) or "(no scope)") if inner else "(none)"
        waited = (inner or sync)["dur"] / 1e3
        print(f"| {(sync['ts'] - first) / 1e3:.2f} | {waited:.2f} | {idle:.2f} | {scope} | "
              f"{inner['name'] if inner else '(none)'} |")
    print(f"\n{len(syncs)} synchronisations; the GPU idle after them: {idle_total:.2f} ms")


def product_flops(op):
    """2·M·K·N (times the batch) of a product from its operator's input shapes, or None."""
    dims = op.get("args", {}).get("Input Dims") if op else None
    operands = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1),
                "aten::baddbmm": (1, 2)}.get(op["name"]) if op else None
    if not dims or operands is None:
        return None
    try:
        a, b = dims[operands[0]], dims[operands[1]]
        batch = a[0] if len(a) == 3 else 1
        return 2 * batch * a[-2] * a[-1] * b[-1]
    except (IndexError, TypeError):
        return None


def print_gemms(kernels, launching_op, launcher, top):
    """GEMM kernels by (scope, operator, input shapes): time, calls and rate."""
    table = collections.defaultdict(lambda: [0.0, 0, 0])
    counted = set()  # operators whose FLOPs are in (a product may launch more than one kernel)
    total_ms = 0.0
    for kernel in kernels:
        if category(kernel["name"]) != "gemm":
            continue
        op = launching_op(kernel)
        where, name, _ = launcher(kernel)
        shapes = json.dumps(op.get("args", {}).get("Input Dims", [])) if op else "?"
        row = table[(where, name, shapes.replace(" ", ""))]
        row[0] += kernel["dur"] / 1e3
        row[1] += 1
        flops = product_flops(op)
        if flops is None or row[2] is None:
            row[2] = None
        elif id(op) not in counted:
            row[2] += flops
            counted.add(id(op))
        total_ms += kernel["dur"] / 1e3
    print(f"GEMM kernel time {total_ms:.1f} ms\n\n| scope | operator | input shapes | ms | calls "
          "| TFLOP/s |\n|---|---|---|---:|---:|---:|")
    for (where, name, shapes), (ms, calls, flops) in sorted(table.items(),
                                                            key=lambda kv: -kv[1][0])[:top]:
        rate = f"{flops / (ms * 1e9):.0f}" if flops and ms > 0 else "-"
        print(f"| {where} | {name} | {shapes} | {ms:.2f} | {calls} | {rate} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--category", default="", help="comma-separated kernel categories")
    parser.add_argument("--gaps", action="store_true", help="idle GPU stretches by launch")
    parser.add_argument("--syncs", action="store_true", help="host synchronisations, in order")
    parser.add_argument("--gemms", action="store_true", help="GEMM kernels by operator shapes")
    args = parser.parse_args()
    events = [e for e in load(args.trace) if e.get("ph") == "X"]
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    by_external = {}
    for op in ops:
        external = op.get("args", {}).get("External id")
        if external is not None and op.get("cat") == "cpu_op":
            by_external.setdefault(external, op)
    scope_of = scopes(ops)

    site = launch_sites(ops, [e for e in events if e.get("cat") == "cuda_runtime"])

    def launching_op(kernel):
        kernel_args = kernel.get("args", {})
        return by_external.get(kernel_args.get("External id")) or site.get(
            kernel_args.get("correlation"))

    def launcher(kernel):
        op = launching_op(kernel)
        where = (scope_of.get(id(op)) or "(no scope)") if op else "(unlinked)"
        return where, op["name"] if op else "?", short(kernel["name"])

    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if args.gaps:
        print_gaps(gpu, launcher, args.top)
        return
    if args.syncs:
        print_syncs(events, gpu, scope_of)
        return
    if args.gemms:
        print_gemms([e for e in gpu if e.get("cat") == "kernel"], launching_op, launcher, args.top)
        return
    wanted = {c for c in args.category.split(",") if c}
    table = collections.defaultdict(lambda: [0.0, 0])
    scopes_ms = collections.defaultdict(float)
    total = 0.0
    for kernel in (e for e in events if e.get("cat") == "kernel"):
        if wanted and category(kernel["name"]) not in wanted:
            continue
        key = launcher(kernel)
        table[key][0] += kernel["dur"] / 1e3
        table[key][1] += 1
        scopes_ms[key[0]] += kernel["dur"] / 1e3
        total += kernel["dur"] / 1e3
    what = f" ({', '.join(sorted(wanted))})" if wanted else ""
    print(f"kernel time{what} {total:.1f} ms\n\n| scope | ms |\n|---|---:|")
    for name, ms in sorted(scopes_ms.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {name} | {ms:.2f} |")
    print("\n| scope | operator | kernel | ms | calls |\n|---|---|---|---:|---:|")
    for (where, op, kernel), (ms, calls) in sorted(table.items(), key=lambda kv: -kv[1][0])[
        : args.top * 3
    ]:
        print(f"| {where} | {op} | {kernel} | {ms:.2f} | {calls} |")


if __name__ == "__main__":
    main()
