#!/usr/bin/env python3
"""Per-kernel GPU time table from an `ncu --metrics gpu__time_duration.sum --print-summary per-kernel` report.

Usage: python3 tools/device/ncu_table.py REPORT [TOP]  -- kernels sorted by total time (invocations x average),
with each one's share of the sum, so the run.sh profile modes print where the time goes instead of a raw report.
"""
import re
import sys

SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
header = re.compile(r"^\s{2}(\S.*?)\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_table.py REPORT [TOP]")
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    rows, name, calls = {}, None, 1
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            m = header.match(line)
            if m:
                inv = re.search(r"Invocations\s+(\d+)", line)
                name, calls = m.group(1), int(inv.group(1)) if inv else 1
                continue
            if name and "gpu__time_duration.sum" in line:
                parts = line.split()
                unit = parts[1]
                if unit not in SCALE:
                    continue
                avg_us = float(parts[-1].replace(",", "")) * SCALE[unit]
                short = re.sub(r"\(.*", "", name)[:90]
                c, t = rows.get(short, (0, 0.0))
                rows[short] = (c + calls, t + calls * avg_us)
                name = None
    total = sum(t for _, t in rows.values())
    if not total:
        sys.exit(f"ncu_table.py: no gpu__time_duration.sum rows in {sys.argv[1]}")
    print(f"{'total us':>10} {'share':>6} {'calls':>6} {'avg us':>9}  kernel   (sum {total:.0f} us)")
    for short, (c, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{t:10.1f} {100 * t / total:5.1f}% {c:6d} {t / c:9.2f}  {short}")


if __name__ == "__main__":
    main()
