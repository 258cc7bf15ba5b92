#!/usr/bin/env python3
"""bench/ab/run.py: an A/B of two hearth binaries on the same model files, interleaved.

Each round runs `hearth bench <model> -p P -n N -t T -r 1 --json` once with each binary
(fresh processes; which goes first alternates by round), so both see the same machine load;
the table gives the medians over rounds and after/before ratios for prefill and decode,
plus the spread of the ratio over rounds (min..max of per-round ratios) as the noise.

usage: bench/ab/run.py BEFORE_BIN AFTER_BIN MODEL... [-p 512] [-n 128] [-t 2] [-r 5] [--out FILE.md]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def bench(binary, model, a):
    cmd = [binary, "bench", model, "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        sys.exit(f"ab: {' '.join(cmd)} failed: {out.stderr.strip()[-400:]}")
    j = json.loads(out.stdout)
    return j["prefill_tps"], j["decode_tps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("models", nargs="+")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    load0 = open("/proc/loadavg").read().split()[:3]
    t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rows = []
    for model in a.models:
        res = {"before": [], "after": []}
        for r in range(a.r):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for which in order:
                res[which].append(bench(getattr(a, which), model, a))
        pr = [x[0] / y[0] for x, y in zip(res["after"], res["before"])]
        dr = [x[1] / y[1] for x, y in zip(res["after"], res["before"])]
        med = lambda v, i: statistics.median(x[i] for x in v)
        row = (os.path.basename(model.rstrip("/")), med(res["before"], 0), med(res["after"], 0),
               statistics.median(pr), min(pr), max(pr), med(res["before"], 1), med(res["after"], 1),
               statistics.median(dr), min(dr), max(dr))
        rows.append(row)
        print("%s prefill %.1f -> %.1f (x%.3f, %.3f..%.3f) decode %.1f -> %.1f (x%.3f, %.3f..%.3f)" % row, flush=True)
    load1 = open("/proc/loadavg").read().split()[:3]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    lines = [f"# A/B: {a.after} against {a.before} (prompt {a.p}, generate {a.n}, {a.t} threads, {a.r} interleaved rounds)", "",
             "Ratios are after / before (median of per-round ratios; min..max over rounds is the noise).", "",
             "| model | prefill before | prefill after | ratio | range | decode before | decode after | ratio | range |",
             "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append("| %s | %.1f | %.1f | %.3f | %.3f..%.3f | %.1f | %.1f | %.3f | %.3f..%.3f |" % r)
    lines += ["", f"Machine: {cpu}, {os.cpu_count()} logical CPUs; /proc/loadavg before {' '.join(load0)}, after {' '.join(load1)}.",
              f"Run {t0} .. {time.strftime('%Y-%m-%dT%H:%M:%S%z')}; command: `{' '.join(sys.argv)}`."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        open(a.out, "w").write(text)


if __name__ == "__main__":
    main()
