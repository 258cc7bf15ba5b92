#!/usr/bin/env bash
# mlx4 LOGDIR: the MLX 4-bit v2 decode GEMV (HEARTH_CUDA_MLX4=v2, cuda_gemv_mlx4.cu) against
# the float kernel: test_cuda's test_gemv_mlx4_v2 (CPU-reference oracle on int8 activations,
# odd shapes, groups 32/64/128, alone vs among 13) and, with v2 on, test_gemv_batch_invariant;
# gemv_bench's v1 / v2 GB/s at the 8B shapes; then the 8B MLX 4-bit decode (Llama $M4, Qwen3
# $Q3M4 when written) default vs v2, back to back. Env from tools/gpu_round (H, B, M4, Q3M4).
# Budget: MX_BUDGET (s, default 200: the 8B MLX load alone took over 25 s on 2026-12-02). Usage: mlx4.sh LOGDIR
L=${1:?usage: mlx4.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${MX_BUDGET:-200}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
tps() { python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('decode %.1f tok/s %.3f, prefill %.0f tok/s' % (j['decode_tps'], j['roofline_fraction'], j['prefill_tps']))" $1 2>/dev/null || echo "no result"; }
utest() { # name tag timeout [env]
  local t=$1 tag=$2 to=$3
  [ $(left) -lt $((to / 2)) ] && { echo "$t ($tag): NOT RUN (time)"; return; }
  env ${4:-} HEARTH_TEST_FILTER=$t timeout $to $B/tests/test_cuda >$L/${t}_$tag.log 2>&1
  local r=$?
  if grep -q "skipped: no CUDA device" $L/${t}_$tag.log; then echo "$t ($tag): SKIPPED (no device: NOT a pass)";
  elif [ $r -eq 0 ] && grep -q "OK \] $t\$" $L/${t}_$tag.log; then echo "$t ($tag): PASS";
  else echo "$t ($tag): FAIL rc $r"; grep -m3 -i "error\|fail\|y\[" $L/${t}_$tag.log | cut -c1-240; fi
}
utest test_gemv_mlx4_v2 forced 25
utest test_gemv_batch_invariant v2env 15 HEARTH_CUDA_MLX4=v2
HEARTH_CUDA_MLX4=v2 GEMV_BENCH_FORMATS=mlx4 timeout 60 $B/bench/gemv_bench $L/gemv_mlx4.json >$L/gemv_mlx4.log 2>&1 \
  || echo "gemv_bench: rc $? (see gemv_mlx4.log)"
python3 bench/cuda/gemv_ab_summary.py $L/gemv_mlx4.json 2>/dev/null || echo "gemv_bench: no result (see gemv_mlx4.log)"
for m in M4 Q3M4; do
  d=${!m}
  for i in $(seq 1 40); do [ -f $d/.done ] && break; [ $(left) -lt 30 ] && break; sleep 1; done
  for v in default v1; do
    [ $(left) -lt 40 ] && { echo "8B $m decode $v: NOT RUN (time)"; continue; }
    [ -f $d/.done ] || { echo "8B $m decode $v: NOT RUN (no model)"; continue; }
    env $([ $v = v1 ] && echo HEARTH_CUDA_MLX4=v1) timeout $(( $(left) > 62 ? 60 : $(left) - 2 )) $H bench $d --device cuda -p 512 -n 128 -r 3 --json >$L/${m}_$v.json 2>$L/${m}_$v.log
    echo "8B $m $v: $(tps $L/${m}_$v.json)"
  done
done
