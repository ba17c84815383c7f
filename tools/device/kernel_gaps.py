#!/usr/bin/env python3
"""Where a decode step's GPU time goes, from a kernel trace (tools/device/kernel_trace.cpp's CSV).

Usage: python3 tools/device/kernel_gaps.py TRACE.csv [GAP_US] [TOP]

The trace is cut into bursts wherever the GPU idles longer than GAP_US (default 20 us: the host's synchronization
between two tokens); the bursts of the kernel count that covers the most kernels in all are the decode steps (not the
~18-kernel layers of a prefill chunk; the first two, warm-up and graph capture, are left out when there are more than
four; KERNELS picks the steps of that many kernels instead, "longest" the bursts of the most kernels that occur 8
times or more: a `bench --sessions N` run's batched steps). For every step, each kernel in start order gets
  marginal  the busy time it adds: end - max(start, latest end before it), 0 when it ends earlier (a kernel launched
            early by programmatic dependent launch is counted from where the one before it ended);
  gap       idle GPU time before it starts: start - (latest end before it), when positive.
A step's marginals and gaps add up to its span. Memory copies count as kernels ("memcpy DtoH BYTES").
Between steps (the host's turn): from a step's last GPU activity to the next step's first, split at the host's
cudaGraphLaunch call ("api:" rows, host side, same clock): before the call (the wake-up from the synchronization and
the host's own work), the call itself, and from its return to the GPU's first activity.
Printed: the median step's span, busy (union of kernel intervals) and idle time, and per kernel name (demangled by
c++filt when present, parameters dropped) the calls per step, average duration, marginal and gap per step.
"""
import csv
import re
import shutil
import statistics
import subprocess
import sys


def short_names(mangled):
    """Readable names for the mangled kernel names: c++filt, then namespaces and the parameter list dropped."""
    names = list(mangled)
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
        if len(out) == len(names):
            names = out
    result = {}
    for m, n in zip(mangled, names):
        n = re.sub(r"^void ", "", n)
        n = n.replace("(anonymous namespace)::", "")
        n = re.sub(r"\b[a-z_][a-z0-9_]*::", "", n)  # lower-case namespaces: magnetar::cuda::detail::
        n = re.sub(r"\([A-Za-z_:]+\)(-?\d+)", r"\1", n)  # enum casts: (Type)12 -> 12
        depth, cut = 0, len(n)
        for i in range(len(n) - 1, -1, -1):  # the last top-level parameter list
            if n[i] == ")":
                depth += 1
            elif n[i] == "(":
                depth -= 1
                if depth == 0:
                    cut = i
                    break
        result[m] = n[:cut][:80]
    return result


def bursts(rows, gap_ns):
    out, cur, end = [], [], None
    for r in rows:
        if cur and r[0] - end > gap_ns:
            out.append(cur)
            cur, end = [], None
        cur.append(r)
        end = r[1] if end is None else max(end, r[1])
    if cur:
        out.append(cur)
    return out


def analyze(step):
    """(span, busy, [(name, duration, marginal, gap)]) of one step's kernels in start order."""
    t0 = step[0][0]
    latest = t0
    busy, per = 0, []
    for start, end, name in step:
        gap = max(0, start - latest)
        marginal = max(0, end - max(latest, start))
        busy += marginal
        per.append((name, end - start, marginal, gap))
        latest = max(latest, end)
    return latest - t0, busy, per


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: kernel_gaps.py TRACE.csv [GAP_US] [TOP] [KERNELS|longest]")
    gap_ns = float(sys.argv[2]) * 1e3 if len(sys.argv) > 2 else 20e3
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    rows, launches = [], []
    with open(sys.argv[1], newline="") as f:
        for r in csv.DictReader(f):
            row = (int(r["start_ns"]), int(r["end_ns"]), r["name"])
            if r["name"].startswith("api:"):
                if "GraphLaunch" in r["name"]:
                    launches.append(row)
            else:
                rows.append(row)
    if not rows:
        sys.exit(f"kernel_gaps.py: no kernels in {sys.argv[1]}")
    rows.sort()
    groups = bursts(rows, gap_ns)
    counts = [len(g) for g in groups if len(g) >= 16]  # not the load's weight copies, one burst each
    if not counts:
        sys.exit(f"kernel_gaps.py: no burst of 16 or more kernels in {sys.argv[1]}")
    mode = max(set(counts), key=lambda c: (counts.count(c) * c, c))  # most kernels in all: not a prefill's layers
    if len(sys.argv) > 4:  # the steps of several sessions: the longest bursts seen 8 times or more, or a given count
        mode = int(sys.argv[4]) if sys.argv[4] != "longest" else max(c for c in counts if counts.count(c) >= 8)
    steps = [g for g in groups if len(g) == mode]
    if len(steps) > 4:
        steps = steps[2:]
    names = short_names(sorted({r[2] for s in steps for r in s}))
    spans, busies, table = [], [], {}
    for s in steps:
        span, busy, per = analyze(s)
        spans.append(span)
        busies.append(busy)
        for name, dur, marginal, gap in per:
            t = table.setdefault(names[name], [0, 0, 0, 0])
            t[0] += 1
            t[1] += dur
            t[2] += marginal
            t[3] += gap
    n = len(steps)
    span, busy = statistics.median(spans) / 1e3, statistics.median(busies) / 1e3
    print(f"{len(groups)} bursts; {n} decode steps of {mode} kernels: span {span:.1f} us (median), busy {busy:.1f} us, "
          f"idle {span - busy:.1f} us")
    print(f"{'calls':>6} {'avg us':>8} {'marginal us':>12} {'share':>6} {'gap us':>8}  kernel (per step)")
    total = sum(t[2] for t in table.values())
    for name, (calls, dur, marginal, gap) in sorted(table.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"{calls / n:6.1f} {dur / calls / 1e3:8.2f} {marginal / n / 1e3:12.1f} {marginal / total:6.1%} "
              f"{gap / n / 1e3:8.1f}  {name}")
    between = []
    for a, b in zip(steps, steps[1:]):
        end, start = max(r[1] for r in a), b[0][0]
        call = [lr for lr in launches if end - 50_000 < lr[0] < start]
        if call and start - end < 10e6:
            between.append((start - end, call[-1][0] - end, call[-1][1] - call[-1][0], start - call[-1][1]))
    if between:
        med = [statistics.median(x[i] for x in between) / 1e3 for i in range(4)]
        print(f"between steps ({len(between)}, medians, us): {med[0]:.1f} = host before the graph launch {med[1]:.1f}"
              f" + the launch call {med[2]:.1f} + its return to the first GPU activity {med[3]:.1f}")


if __name__ == "__main__":
    main()
