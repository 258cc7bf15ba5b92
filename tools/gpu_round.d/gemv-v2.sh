#!/usr/bin/env bash
# gemv-v2: the v2 int8-activation decode GEMVs (HEARTH_CUDA_GEMV=v2, cuda_gemv_v2.cu) against
# the default ones: test_cuda's test_gemv_v2 (CPU-reference oracle, odd shapes, invariance,
# PDL chain) and, with v2 on, test_gemv / test_gemv_batch_invariant; gemv_bench Q8_0 / Q4_K /
# Q6_K GB/s v1 vs v2 in one run; then the 8B Q4_K_M and Q8_0 decode rows, default vs v2, back
# to back. Env from tools/gpu_round (H, B, G8). Budget: GV_BUDGET (60 s; ~130 s runs all).
# Usage: gemv-v2.sh LOGDIR
L=${1:?usage: gemv-v2.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${GV_BUDGET:-60}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
tps() { python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('%.1f tok/s %.3f' % (j['decode_tps'], j['roofline_fraction']))" $1 2>/dev/null || echo "no result"; }
# PASS only when the named test itself ran and passed (not a skip, not a filter matching none)
res() { if grep -q "skipped: no CUDA device" $2; then echo "SKIPPED (no device: NOT a pass)";
  elif [ $1 -eq 0 ] && grep -q "OK \] $3\$" $2; then echo PASS;
  elif [ $1 -ge 124 ]; then echo "TIMEOUT(rc=$1)"; else echo "FAIL(rc=$1)"; fi; }
utest() { # name env-prefix timeout
  local t=$1 tag=$2 to=$3; [ $(left) -lt $((to / 2)) ] && { echo "$t ($tag): NOT RUN (time)"; return; }
  env ${4:-} HEARTH_TEST_FILTER=$t timeout $to $B/tests/test_cuda >$L/${t}_$tag.log 2>&1
  local r=$?; echo "$t ($tag): $(res $r $L/${t}_$tag.log $t)"
  [ $r -ne 0 ] && grep -m3 -i "error\|fail\|y\[" $L/${t}_$tag.log | cut -c1-240
}
utest test_gemv_v2 forced 25
HEARTH_CUDA_PDL=0 HEARTH_CUDA_GEMV=v2 GEMV_BENCH_FORMATS=Q8_0,Q4_K,Q6_K timeout 25 $B/bench/gemv_bench $L/gemv_ab.json >$L/gemv_ab.log 2>&1 \
  || echo "gemv_bench: rc $? (see gemv_ab.log)"
python3 bench/cuda/gemv_ab_summary.py $L/gemv_ab.json 2>/dev/null || echo "gemv_bench: no result (see gemv_ab.log)"
for i in $(seq 1 60); do [ -f $G8/.done ] && break; [ $(left) -lt 30 ] && break; sleep 1; done
for m in q4_k_m q8_0; do
  for v in v2 default; do
    [ $(left) -lt 14 ] && { echo "8B ${m^^} decode $v: NOT RUN (time)"; continue; }
    [ -f $G8/llama8b-$m.gguf ] || { echo "8B ${m^^} decode $v: NOT RUN (no model)"; continue; }
    env $([ $v = v2 ] && echo HEARTH_CUDA_GEMV=v2) timeout $(( $(left) > 27 ? 25 : $(left) - 2 )) $H bench $G8/llama8b-$m.gguf --device cuda -p 512 -n 128 -r 3 --json >$L/${m}_$v.json 2>$L/${m}_$v.log
    echo "8B ${m^^} decode $v: $(tps $L/${m}_$v.json)"
  done
done
utest test_gemv v2env 20 HEARTH_CUDA_GEMV=v2
utest test_gemv_batch_invariant v2env 15 HEARTH_CUDA_GEMV=v2
