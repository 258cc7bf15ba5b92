#!/usr/bin/env bash
# cuda-decode: the batch-1 decode work of issue #5 on the H200, inside tools/gpu_round
# (which exports H, B, TINY, L8, G8, M4). In order: the two CUDA unit binaries, then each 8B
# decode row (`hearth bench -p 512 -n 128 -r 3`), CUDA-vs-CPU-scalar greedy
# parity on six tiny models between the quantized and the bf16/MLX rows, then, if time is
# left, ncu per-kernel times of one Q4_K_M decode step. Stops starting phases before its
# budget (CD_BUDGET, default 110 s) and always prints the summary (<= 15 lines) last.
# Usage: tools/gpu_parts/cuda-decode.sh LOGDIR
L=${1:?usage: cuda-decode.sh LOGDIR}
mkdir -p "$L"
cd "$(dirname "$0")/../.."
BUDGET=${CD_BUDGET:-110}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
cap() { # a command's timeout: at most $1 s and never past the budget (bash runs the TERM trap only between commands)
    local l=$(($(left) - 3))
    [ $l -lt 1 ] && l=1
    [ $l -lt $1 ] && echo $l || echo $1
}
S=$L/summary_lines.txt
: >"$S"
say() { echo "$*" >>"$S"; }
finish() {
    trap - EXIT TERM INT
    echo "cuda-decode: $(($(date +%s) - T0)) s of $BUDGET"
    head -15 "$S"
    exit 0
}
trap finish EXIT TERM INT

# 1. unit tests (failing assertions land in the logs; their first lines in the summary)
for t in test_cuda test_cuda_graph; do
    if [ ! -x "$B/tests/$t" ]; then say "$t: NOT BUILT"; continue; fi
    timeout $(cap 45) "$B/tests/$t" >"$L/$t.log" 2>&1
    rc=$?
    ok=$(grep -c '^\[       OK \]' "$L/$t.log")
    bad=$(grep -E '^\[  (FAILED|ERROR) \]' "$L/$t.log" | head -3 | tr '\n' ' ')
    if grep -q 'skipped:' "$L/$t.log"; then say "$t SKIPPED (no device or no CUDA build): $(grep -m1 skipped: "$L/$t.log" | cut -c1-120)"
    elif [ $rc = 0 ]; then say "$t PASS ($ok ok)"; else say "$t FAIL rc $rc ($ok ok) $bad $(grep -m1 -E 'y\[|x\[|xn\[|q\[|k\[|rope|chain' "$L/$t.log" | cut -c1-160)"; fi
done

# 2. decode rows
wait_done() { # bounded wait for the driver's background model writers
    for i in $(seq 1 "$2"); do [ -f "$1/.done" ] && return 0; sleep 1; done
    return 1
}
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.1f %.2f' % (d['decode_tps'], d['roofline_fraction']))" "$1" 2>/dev/null; }
bench_row() { # name model
    local name=$1 model=$2 new
    if [ "$(left)" -lt 30 ]; then say "$name: NOT RUN (time)"; return; fi
    timeout $(cap 40) "$H" bench "$model" --device cuda -p 512 -n 128 -r 3 --json >"$L/bench_${name}_new.json" 2>"$L/bench_${name}_new.log"
    new=$(field "$L/bench_${name}_new.json")
    say "$name decode: ${new:-FAIL} (tok/s roofline-fraction)"
}
parity() { # greedy ids, CUDA (new path; f32 GEMM prefill) vs the CPU scalar reference, a few tiny models
    if [ "$(left)" -lt 25 ] || [ ! -d "$TINY" ]; then say "parity: NOT RUN (time or no \$TINY)"; return; fi
    local IDS same=0 differ="" m n r
    IDS=$(python3 -c "import random; random.seed(5); print(str([random.randrange(1,600) for _ in range(40)]).replace(' ',''))")
    for n in ${CD_PARITY:-llama-bf16 qwen3-bf16 gemma3-bf16 qwen3-q4g64 gemma3-q8g32 llama-f32}; do
        m=$TINY/$n
        [ -d "$m" ] || { differ="$differ $n(missing)"; continue; }
        [ "$(left)" -lt 8 ] && { differ="$differ (stopped: time)"; break; }
        HEARTH_CPU=scalar timeout $(cap 20) $H trace "$m" --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cpu \
            >"$L/p_${n}_cpu.json" 2>>"$L/parity.log"
        HEARTH_CUDA_GEMM=f32 timeout $(cap 20) $H trace "$m" --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cuda \
            >"$L/p_${n}_cuda.json" 2>>"$L/parity.log"
        r=$(python3 tools/cuda_check_parity.py "$L/p_${n}_cpu.json" "$L/p_${n}_cuda.json" 2>&1)
        echo "$n $r" >>"$L/parity.log"
        case "$r" in *'"greedy_identical": true'*) same=$((same + 1)) ;; *) differ="$differ $n" ;; esac
    done
    say "tiny greedy CUDA==CPU scalar: $same identical; differ:${differ:- none}"
}

# The quantized rows first (the fused int8 path and PDL matter most there), then parity
# (so it runs whatever the 8B loads cost), then bf16 and MLX.
if wait_done "$G8" 20; then
    bench_row q4_k_m "$G8/llama8b-q4_k_m.gguf"
    bench_row q8_0 "$G8/llama8b-q8_0.gguf"
else
    say "GGUF 8B models not ready"
fi
parity
if wait_done "$L8" 10; then bench_row bf16 "$L8"; else say "bf16 8B not ready"; fi
if wait_done "$M4" 10; then bench_row mlx4 "$M4"; else say "MLX 8B not ready"; fi

# 4. ncu: one Q4_K_M decode step, eager launches, per-kernel groups
if [ "$(left)" -gt 35 ] && [ -f "$G8/llama8b-q4_k_m.gguf" ]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    HEARTH_CUDA_GRAPH=0 HEARTH_CUDA_PROFILE_STEP=10 timeout $(($(left) - 5)) $NCU --clock-control none \
        --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw \
        --log-file "$L/ncu_step.csv" $H bench "$G8/llama8b-q4_k_m.gguf" --device cuda -p 512 -n 16 -r 1 --json \
        >"$L/ncu_bench.json" 2>"$L/ncu_bench.log"
    python3 bench/cuda/ncu_summary.py "$L/ncu_step.csv" >"$L/ncu_summary.txt" 2>&1
    say "ncu Q4_K_M step: $(tail -1 "$L/ncu_summary.txt" | tr -s ' ' | cut -c1-80); top: $(sed -n 2,5p "$L/ncu_summary.txt" | awk '{printf "%s %s/%sus; ", $1, $2, $3}' | cut -c1-200)"
else
    say "ncu: NOT RUN (time)"
fi
