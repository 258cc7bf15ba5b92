#!/usr/bin/env python3
"""gemv_ab_summary.py: one line per format of a gemv_bench JSON (bench/cuda/gemv_bench.c)
holding v1 and v2 rows: "FORMAT GEMV GB/s v2/v1: NxK v2/v1, ...", shapes ordered by k then n,
after the run's copy bandwidth. Usage: gemv_ab_summary.py GEMV_BENCH.json"""
import json
import sys


def main():
    j = json.load(open(sys.argv[1]))
    by = {}
    for x in j["rows"]:
        by.setdefault(x["format"], {}).setdefault((x["n"], x["k"]), {})[x["path"]] = x["gbs"]
    print("copy %.0f GB/s" % j["copy_gbs"])
    gbs = lambda p, k: "%.0f" % p[k] if k in p else "-"  # noqa: E731
    for f, shapes in by.items():
        cells = ["%dx%d %s/%s" % (n, k, gbs(p, "v2"), gbs(p, "v1"))
                 for (n, k), p in sorted(shapes.items(), key=lambda s: (s[0][1], s[0][0]))]
        print("%s GEMV GB/s v2/v1: %s" % (f, ", ".join(cells)))


if __name__ == "__main__":
    main()
