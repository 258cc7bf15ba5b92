#!/usr/bin/env bash
# mlx4-v3 LOGDIR: the MLX 4-bit v3 decode GEMV (chunked layout, cuda_gemv_mlx4.cu; the default)
# against v2 (tiled, HEARTH_CUDA_MLX4=v2): the whole test_cuda (v3 is the default mode, so
# test_gemv / _multi / _pdl_chain / _batch_invariant / test_dequant run on it; test_gemv_mlx4_v2
# and test_dequant force both layouts), gemv_bench's v1 / v2 / v3 GB/s at the 8B shapes, the
# 8B MLX 4-bit decode rows back to back (ab.sh), then 16 greedy tokens of the 8B Llama MLX
# 4-bit model on the GPU in both modes and on the CPU. Env from tools/gpu_round.
# Budget: MV_BUDGET (s, default 420). Usage: mlx4-v3.sh LOGDIR
L=${1:?usage: mlx4-v3.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${MV_BUDGET:-420}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
timeout 150 $B/tests/test_cuda >$L/test_cuda.log 2>&1; r=$?
echo "test_cuda rc $r: $(grep -c 'OK \]' $L/test_cuda.log) ok, $(grep -c 'FAILED \]' $L/test_cuda.log) failed"
grep -m6 -iE "^\[  FAILED|error|mismatch|y\[" $L/test_cuda.log | cut -c1-240
GEMV_BENCH_FORMATS=mlx4 timeout 90 $B/bench/gemv_bench $L/gemv_mlx4.json >$L/gemv_mlx4.log 2>&1 || echo "gemv_bench: rc $?"
python3 bench/cuda/gemv_ab_summary.py $L/gemv_mlx4.json 2>/dev/null || tail -5 $L/gemv_mlx4.log
AB_BUDGET=$(( $(left) - 70 )) AB_ROWS="${MV_ROWS:-m4_v3=m4 m4_v2=m4,HEARTH_CUDA_MLX4=v2 m4_v3_nopdl=m4,HEARTH_CUDA_MLX4_PDL=0 m4_v3_again=m4 q3_v3=q3m4 q3_v2=q3m4,HEARTH_CUDA_MLX4=v2}" \
  tools/gpu_round.d/ab.sh $L/ab
for v in v3 v2 cpu; do
  [ $(left) -lt 25 ] && { echo "greedy $v: NOT RUN (time)"; continue; }
  dev=cuda; [ $v = cpu ] && dev=cpu
  env HEARTH_CUDA_MLX4=$([ $v = v2 ] && echo v2 || echo v3) timeout $(( $(left) - 3 )) $H generate $M4 "The capital of France is" \
    --device $dev --max-tokens 16 --temp 0 --no-chat-template >$L/greedy_$v.txt 2>$L/greedy_$v.log
  echo "greedy $v rc $?: $(od -An -c $L/greedy_$v.txt | tr -s ' ' | head -c 160 | tr '\n' ' ')"
done
cmp -s $L/greedy_v3.txt $L/greedy_v2.txt && echo "greedy: v3 = v2" || echo "greedy: v3 differs from v2"
cmp -s $L/greedy_v3.txt $L/greedy_cpu.txt && echo "greedy: v3 = cpu" || echo "greedy: v3 differs from cpu"
