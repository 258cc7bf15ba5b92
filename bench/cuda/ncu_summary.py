#!/usr/bin/env python3
"""ncu_summary.py: per-kernel time of one profiled decode step from `ncu --csv --page raw`
output (metrics gpu__time_duration.sum and dram__bytes_read.sum): kernels grouped by
name (template arguments dropped), with launches, total microseconds, share of the step's
kernel time and achieved DRAM read bandwidth. Usage: ncu_summary.py NCU.csv [STEP_MS]"""
import csv
import json
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"<.*>", "", name)
    return name.replace("void ", "").strip()


def main():
    rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if r]
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    cols = rows[head]
    units = rows[head + 1] if head + 1 < len(rows) and rows[head + 1][0] == "" else None
    data = rows[head + (2 if units else 1):]
    ki, ti = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
    bi = cols.index("dram__bytes_read.sum") if "dram__bytes_read.sum" in cols else None
    tscale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(units[ti] if units else "nsecond", 1e-3)
    bscale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(units[bi] if units and bi else "byte", 1)
    agg = defaultdict(lambda: [0, 0.0, 0.0])
    for r in data:
        if len(r) <= ti:
            continue
        try:
            t = float(r[ti].replace(",", "")) * tscale
        except ValueError:
            continue
        a = agg[short(r[ki])]
        a[0] += 1
        a[1] += t
        if bi is not None:
            try:
                a[2] += float(r[bi].replace(",", "")) * bscale
            except ValueError:
                pass
    total = sum(a[1] for a in agg.values())
    out = []
    print(f"{'kernel':<34} {'launches':>8} {'us':>9} {'share':>6} {'GB/s':>7}")
    for k, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        gbs = b / (t * 1e-6) / 1e9 if t > 0 else 0
        print(f"{k[:34]:<34} {n:>8} {t:>9.1f} {t / total:>6.1%} {gbs:>7.0f}")
        out.append({"kernel": k, "launches": n, "us": round(t, 2), "dram_read_bytes": b})
    print(f"{'total kernel time':<34} {sum(a[0] for a in agg.values()):>8} {total:>9.1f}")
    if len(sys.argv) > 2:
        step = float(sys.argv[2]) * 1e3
        print(f"step time {step:.1f} us: kernels {total / step:.1%}, the rest (gaps, host) {step - total:.1f} us")
    json.dump(out, open(sys.argv[1] + ".json", "w"), indent=1)


if __name__ == "__main__":
    main()
