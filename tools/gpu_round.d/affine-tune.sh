#!/usr/bin/env bash
# affine-tune LOGDIR: the generic affine GEMV's variants on the H200 (cuda_gemv_affine.cu):
# test_cuda first (test_gemv_affine on the kernels as built), then gemv_bench on MLX 8-bit
# and Q5_K shapes and 8B decode rows (MLX 8-bit, Q5_K_M) for the default (PDL) and
# HEARTH_CUDA_PDL=0, alternated (round 21 call 3 also timed 4 against 8 chunks in flight through
# a HEARTH_CUDA_AFF_U switch, since replaced by the per-width choice aff_depth). Env from tools/gpu_round
# (GR_MODELS with m8 q5_k_m). Budget: AT_BUDGET (s, default 420). Usage: affine-tune.sh LOGDIR
L=${1:?usage: affine-tune.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${AT_BUDGET:-420}
. tools/gpu_round.d/base.inc
test_cuda_run 150 6 "^\[  FAILED|y\["
for v in default nopdl; do
  case $v in default) E="" ;; nopdl) E="HEARTH_CUDA_PDL=0" ;; esac
  env $E GEMV_BENCH_FORMATS=mlx,Q5_K GEMV_BENCH_MLX_BITS=8 timeout 60 $B/bench/gemv_bench $L/gemv_$v.json >$L/gemv_$v.txt 2>&1
  echo "gemv $v: $(grep -E '^(U32|Q5_K)' $L/gemv_$v.txt | awk '{printf "%s %s %s GB/s; ", $1, $3, $7}')"
done
for i in $(seq 1 150); do [ -f $M8/.done ] && [ -f $G8/llama8b-q5_k_m.gguf ] && break; sleep 1; done
for round in $(seq 1 ${AT_ROUNDS:-2}); do
  for v in default nopdl; do
    case $v in default) E="" ;; nopdl) E="HEARTH_CUDA_PDL=0" ;; esac
    for m in $M8 $G8/llama8b-q5_k_m.gguf; do
      [ $(left) -gt 70 ] || continue
      n=$(basename $m)
      env $E timeout 100 $H bench $m --device cuda -p 512 -n 128 -r 3 --json >$L/b_${n}_${v}_$round.json 2>$L/b_${n}_${v}_$round.log
      echo "$n $v (round $round): $(tps $L/b_${n}_${v}_$round.json)"
    done
  done
done
