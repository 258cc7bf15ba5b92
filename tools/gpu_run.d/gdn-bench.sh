#!/usr/bin/env bash
# gdn-bench LOGDIR: one Gated DeltaNet layer's prefill on the GPU (bench/cuda/gdn_bench.c): the
# token walk against the chunked form on the Qwen3.5 shapes (GDN_BENCH_T, default 512,4096),
# then, with GB_NCU=1, each kernel's time of the T=4096 run under ncu. Writes LOGDIR/gdn_bench.json
# and the table in LOGDIR/gdn_bench.txt. Env from tools/gpu_run: B.
L=${1:?usage: gdn-bench.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
: "${B:?B (build dir) not set}"
X=$B/bench/gdn_bench
[ -x "$X" ] || { echo "gdn_bench: NOT BUILT"; exit 1; }
timeout 120 "$X" "$L/gdn_bench.json" >"$L/gdn_bench.txt" 2>&1
echo "gdn_bench rc $?"
cat "$L/gdn_bench.txt"
if [ "${GB_NCU:-0}" = 1 ]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    GDN_BENCH_T=4096 timeout 150 "$NCU" --clock-control none --kernel-name regex:gdn --metrics gpu__time_duration.sum \
        --csv "$X" >"$L/ncu.csv" 2>"$L/ncu.log"
    echo "ncu rc $?: per kernel (us, summed over its launches; both forms, 16 runs each, two shapes)"
    python3 - "$L/ncu.csv" <<'PY'
import csv, sys, collections
tot, n = collections.defaultdict(float), collections.Counter()
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head = rows[0]
for r in rows[1:]:
    d = dict(zip(head, r))
    if d.get("Metric Name") != "gpu__time_duration.sum":
        continue
    k = d["Kernel Name"].split("(")[0]
    v = float(d["Metric Value"].replace(",", ""))
    tot[k] += v / 1000.0 if d.get("Metric Unit") == "nsecond" else v
    n[k] += 1
for k in sorted(tot, key=lambda k: -tot[k]):
    print(f"  {k:40s} {n[k]:5d} launches {tot[k]:10.1f} us  ({tot[k] / n[k]:.1f} each)")
PY
fi
