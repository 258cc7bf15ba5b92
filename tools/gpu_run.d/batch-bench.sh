#!/usr/bin/env bash
# batch-bench LOGDIR: `hearth bench --batch` on the 8B GGUFs (B requests of 512 distinct prompt
# tokens + 128 generated, through the batch scheduler: aggregate decode tok/s and the step time,
# as llama-batched-bench reports them), the single-stream bench beside it, then one decode step
# of BB_PROFILE_T rows (and of one row) under the profilers: nsys (real timings, graph nodes
# traced, --capture-range cudaProfilerApi) when it is there, and ncu per kernel (eager
# launches, caches not flushed). A part of tools/gpu_run (env: H, G8).
# Env: BB_MODELS (default "q4_k_m f16"), BB_B (default 1,8,32,64), BB_PROFILE (models to
# profile, default q4_k_m), BB_PROFILE_T (default 8), BB_BUDGET (s, default 200).
set -u
L=${1:?usage: batch-bench.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
BUDGET=${BB_BUDGET:-200}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
: "${H:?H (the hearth binary) is not set}" "${G8:?G8 (the GGUF folder) is not set}"
for _ in $(seq 1 240); do [ -f "$G8/.done" ] && break; sleep 1; done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
NSYS=$(command -v nsys || for n in /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys; do [ -x "$n" ] && echo "$n"; done | head -1)
echo "nsys: ${NSYS:-none}; ncu: $NCU"
for m in ${BB_MODELS:-q4_k_m f16}; do
    f=$G8/llama8b-$m.gguf
    [ -f "$f" ] || { echo "$m: NOT RUN (no model)"; continue; }
    [ "$(left)" -lt 40 ] && { echo "$m: NOT RUN ($(left) s left)"; continue; }
    timeout $(($(left) - 5)) "$H" bench "$f" --device cuda -p 512 -n 128 -r 1 --json >"$L/single_$m.json" 2>"$L/single_$m.log"
    timeout $(($(left) - 5)) "$H" bench "$f" --device cuda --batch "${BB_B:-1,8,32,64}" -p 512 -n 128 -r 1 --json \
        >"$L/batch_$m.jsonl" 2>"$L/batch_$m.log"
    echo "$m: rc $?"
    python3 - "$L/single_$m.json" "$L/batch_$m.jsonl" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(f"  single stream: decode {s['decode_tps']:.1f} tok/s ({1e3 / s['decode_tps']:.2f} ms/token), prefill {s['prefill_tps']:.0f}")
except Exception as e:
    print("  single stream: no result", e)
for line in open(sys.argv[2]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    print(f"  B={r['batch']:>3}: decode {r['decode_tps']:8.1f} tok/s, step {r['decode_step_ms']:.2f} ms, "
          f"prefill {r['prefill_tps']:.0f} tok/s, roofline {r['roofline_fraction']:.3f}")
EOF
done
PT=${BB_PROFILE_T:-8}
for m in ${BB_PROFILE:-q4_k_m}; do
    f=$G8/llama8b-$m.gguf
    [ -f "$f" ] || continue
    for t in $PT 1; do
        [ "$(left)" -lt 40 ] && { echo "profile $m T=$t: NOT RUN ($(left) s left)"; continue; }
        args=(--batch "$t")
        [ "$t" = 1 ] && args=()
        if [ -n "$NSYS" ]; then
            # the whole short run (prefill and 16 decode steps), every graph node traced
            timeout $(($(left) / 2)) "$NSYS" profile --cuda-graph-trace=node --trace=cuda \
                -o "$L/nsys_${m}_t$t" --force-overwrite true "$H" bench "$f" --device cuda "${args[@]}" -p 512 -n 16 -r 1 \
                --json >"$L/nsys_${m}_t$t.json" 2>"$L/nsys_${m}_t$t.log"
            echo "nsys $m T=$t: rc $?"
            timeout 60 "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$L/nsys_${m}_t$t" "$L/nsys_${m}_t$t.nsys-rep" \
                >>"$L/nsys_${m}_t$t.log" 2>&1
            python3 - "$L/nsys_${m}_t${t}_cuda_gpu_kern_sum.csv" <<'EOF'
import csv, re, sys
try:
    rows = list(csv.DictReader(open(sys.argv[1])))
except OSError as e:
    print("  no nsys summary:", e); sys.exit()
tot = sum(float(r["Total Time (ns)"]) for r in rows)
print(f"  kernels {tot / 1e3:.1f} us in all")
for r in rows[:14]:
    n = re.sub(r"<.*>", "", re.sub(r"\(.*$", "", r["Name"])).replace("void ", "")
    print(f"  {n[:34]:<34} {int(r['Instances']):>5} {float(r['Total Time (ns)']) / 1e3:>9.1f} us {float(r['Total Time (ns)']) / tot:>6.1%}")
EOF
        fi
        [ "$(left)" -lt 30 ] && continue
        # about one decode step's kernels after the first few (graph nodes count one each)
        timeout $(($(left) - 5)) "$NCU" --graph-profiling node --launch-skip 3000 --launch-count 300 \
            --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw --log-file "$L/ncu_${m}_t$t.csv" \
            "$H" bench "$f" --device cuda "${args[@]}" -p 512 -n 16 -r 1 --json >"$L/ncu_${m}_t$t.json" 2>"$L/ncu_${m}_t$t.log"
        echo "ncu $m T=$t: rc $?"
        python3 bench/cuda/ncu_summary.py "$L/ncu_${m}_t$t.csv" >"$L/ncu_${m}_t$t.txt" 2>&1
        head -16 "$L/ncu_${m}_t$t.txt"
    done
done
