#!/usr/bin/env python3
"""gemv_ab_summary.py: one line per format of a gemv_bench JSON (bench/cuda/gemv_bench.c)
holding rows of several paths: "FORMAT GEMV GB/s v2/v1: NxK v2/v1, ..." (and v3 first where the
format has it: "v3/v2/v1"), shapes ordered by k then n, after the run's copy bandwidth.
Usage: gemv_ab_summary.py GEMV_BENCH.json"""
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
        paths = [q for q in ("v3", "v2", "v1") if any(q in p for p in shapes.values())] or ["v2", "v1"]
        cells = ["%dx%d %s" % (n, k, "/".join(gbs(p, q) for q in paths))
                 for (n, k), p in sorted(shapes.items(), key=lambda s: (s[0][1], s[0][0]))]
        print("%s GEMV GB/s %s: %s" % (f, "/".join(paths), ", ".join(cells)))


if __name__ == "__main__":
    main()
