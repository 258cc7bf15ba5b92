#!/usr/bin/env bash
# cuda-prefill.sh LOGDIR: the device part of the tensor-core prefill attention work (issue
# #5): test_cuda_prefill, then 8B bf16 prefill 4096 / 512, Q4_K_M prefill 4096, greedy
# parity CUDA vs the scalar CPU on tiny models (40-token prompts: prefill attention runs),
# and an ncu summary of one prefill step if time is left. Budget: 100 s (stops itself).
# Env from tools/gpu_round: H, B, TINY, L8, G8; CP_SKIP_BENCH=1 skips the bf16 rows, CP_SKIP_Q4=1 the
# Q4_K_M row (a rerun that checks the tests and parity only). Prints a short summary last.
set -u
LOG=${1:?usage: cuda-prefill.sh LOGDIR}
mkdir -p "$LOG"
cd "$(dirname "$0")/../.."
T0=$(date +%s)
BUDGET=${CP_BUDGET:-100}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
SUM=$LOG/summary_rows.txt
: >"$SUM"
row() { printf '%-34s %s\n' "$1" "$2" | tee -a "$SUM" >/dev/null; }
# prefill tok/s and fraction of 743 TFLOP/s: 2 * params * tokens + causal attention
# (4 * n_layers * n_heads * head_dim * T^2 / 2: QK^T and PV), 8B shapes.
frac() { python3 - "$1" "$2" <<'PY'
import json, sys
try:
    j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception as e:
    print("no result (%s)" % type(e).__name__); sys.exit(0)
T, tps = int(sys.argv[2]), j["prefill_tps"]
params = 8.03e9  # Llama-3.1-8B incl. lm_head (only the last row's lm_head runs: small over-count)
att = 4 * 32 * 32 * 128 * T * T / 2
fl = 2 * (params - 128256 * 4096) * T + att
print("%8.0f tok/s  %.3f of 743 TFLOP/s  (step %.1f ms)" % (tps, fl / (T / tps) / 743e12, 1e3 * T / tps))
PY
}
wait_done() { # bounded wait for a model the driver writes in the background
    local f=$1 n=0
    while [ ! -f "$f" ] && [ $n -lt $2 ] && [ "$(left)" -gt 10 ]; do sleep 1; n=$((n + 1)); done
    [ -f "$f" ]
}

# 1. the unit test (the oracle: CPU double-precision attention over the same paged pool)
if [ -x "$B/tests/test_cuda_prefill" ]; then
    timeout 40 "$B/tests/test_cuda_prefill" >"$LOG/test_cuda_prefill.log" 2>&1
    rc=$?
    v=$([ $rc = 0 ] && echo PASS || echo "FAIL rc $rc")
    grep -q "skipped" "$LOG/test_cuda_prefill.log" && v="SKIPPED (did not run)"
    row "test_cuda_prefill" "$v $(grep -E 'cases checked|FAILED|PASSED' "$LOG/test_cuda_prefill.log" | tr '\n' ' ' | cut -c1-120)"
    [ $rc = 0 ] || grep -E 'error|Error|fail|rel' "$LOG/test_cuda_prefill.log" | head -4 | cut -c1-300 | tee -a "$SUM" >/dev/null
else
    row "test_cuda_prefill" "NOT BUILT ($B/tests/test_cuda_prefill missing)"
fi

# test_cuda covers cuda_matmul (dequant8 / to_bf16x4 / cuBLAS workspace changed here)
if [ -x "$B/tests/test_cuda" ]; then
    timeout 30 "$B/tests/test_cuda" >"$LOG/test_cuda.log" 2>&1
    rc=$?
    row "test_cuda (gemm changed)" "$([ $rc = 0 ] && echo PASS || echo "FAIL rc $rc") $(grep -E '^\[  (PASSED|FAILED) \]' "$LOG/test_cuda.log" | tr '\n' ' ' | cut -c1-100)"
    [ $rc = 0 ] || grep -E 'FAILED|fail|error' "$LOG/test_cuda.log" | head -3 | cut -c1-300 | tee -a "$SUM" >/dev/null
fi

# 2. 8B bf16 prefill
if [ -z "${CP_SKIP_BENCH:-}" ] && wait_done "$L8/.done" 60; then
    for p in 4096 512; do
        [ "$(left)" -lt 20 ] && { row "l8 bf16 p$p" "NOT RUN (time)"; continue; }
        r=3; [ $p = 4096 ] && r=2
        timeout 30 $H bench "$L8" --device cuda -p $p -n 1 -r $r --json >"$LOG/l8_p$p.json" 2>"$LOG/l8_p$p.log"
        row "l8 bf16 p$p (rc $?)" "$(frac "$LOG/l8_p$p.json" $p) $(tail -1 "$LOG/l8_p$p.log" | cut -c1-100)"
    done
else
    row "l8 bf16" "NOT RUN: $L8/.done missing"
fi

# 3. Q4_K_M prefill 4096
if [ "$(left)" -gt 25 ] && [ -z "${CP_SKIP_Q4:-}" ] && wait_done "$G8/.done" 30 && [ -f "$G8/llama8b-q4_k_m.gguf" ]; then
    timeout 30 $H bench "$G8/llama8b-q4_k_m.gguf" --device cuda -p 4096 -n 1 -r 1 --json \
        >"$LOG/q4km_p4096.json" 2>"$LOG/q4km_p4096.log"
    row "q4_k_m p4096 (rc $?)" "$(frac "$LOG/q4km_p4096.json" 4096) $(tail -1 "$LOG/q4km_p4096.log" | cut -c1-100)"
else
    row "q4_k_m p4096" "NOT RUN (time or model missing)"
fi

# 4. greedy parity on tiny models: CUDA (exact f32 GEMMs, so the f32 prefill attention too)
# vs the scalar CPU tier
IDS=$(python3 -c "import random; random.seed(5); print(str([random.randrange(1,600) for _ in range(40)]).replace(' ',''))")
ok=0 bad=""
for n in llama-f32 gemma3-f32 qwen3-bf16 llama-q8g64; do
    m=$TINY/$n
    [ -d "$m" ] || continue
    [ "$(left)" -lt 12 ] && break
    HEARTH_CPU=scalar timeout 10 $H trace "$m" --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cpu \
        >"$LOG/p_${n}_cpu.json" 2>>"$LOG/parity.log"
    HEARTH_CUDA_GEMM=f32 timeout 10 $H trace "$m" --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cuda \
        >"$LOG/p_${n}_cuda.json" 2>>"$LOG/parity.log"
    r=$(python3 tools/cuda_check_parity.py "$LOG/p_${n}_cpu.json" "$LOG/p_${n}_cuda.json" 2>&1 | tail -1)
    echo "$n $r" >>"$LOG/parity.log"
    case "$r" in *'"greedy_identical": true'*) ok=$((ok + 1)) ;; *) bad="$bad $n" ;; esac
done
row "tiny greedy CUDA==CPU (gemm f32)" "$ok identical; differ:${bad:- none}"

# 5. ncu: one 4096-token prefill step (step 2: step 1 is bench's 32-token warm-up)
L=$(left)
if [ "$L" -gt 25 ] && [ -f "$L8/.done" ]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    HEARTH_CUDA_PROFILE_PREFILL=2 timeout $((L - 5)) $NCU --clock-control none --profile-from-start off \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw --log-file "$LOG/ncu_prefill.csv" \
        $H bench "$L8" --device cuda -p 4096 -n 1 -r 1 --json >"$LOG/ncu_bench.json" 2>"$LOG/ncu_bench.log"
    rc=$?
    python3 bench/cuda/ncu_summary.py "$LOG/ncu_prefill.csv" >"$LOG/ncu_summary.txt" 2>&1
    row "ncu prefill 4096 step (rc $rc)" "$(awk '/^total/ {printf "total %s us; ", $(NF)} NR>=2 && NR<=5 && !/^total/ {printf "%s %s %.0fus; ", $1, $4, $3}' "$LOG/ncu_summary.txt" | cut -c1-230)"
else
    row "ncu prefill step" "NOT RUN (time: $L s left)"
fi
echo "cuda-prefill: $(($(date +%s) - T0)) s of $BUDGET"
cat "$SUM"
