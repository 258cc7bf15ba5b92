#!/usr/bin/env bash
# mlx4-final LOGDIR: this tree against a base tree built beside it (BASE_SRC, a `git archive`
# tarball of the commit before; default build-base-src.tgz) on the MLX 4-bit v3 path: the whole
# test_cuda, 8B MLX 4-bit decode + prefill rows of both binaries alternated, batched decode
# (--batch 8) of both on MLX 4-bit and Q4_K_M, and greedy traces that size the float-order
# noise: the base binary with its v2 GEMV's lane order changed (HEARTH_CUDA_MLX4_SHFL=0)
# against itself, next to this tree (v3) against the base. Env from tools/gpu_round.
# Budget: MF_BUDGET (s, default 480). Usage: mlx4-final.sh LOGDIR
L=${1:?usage: mlx4-final.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${MF_BUDGET:-480}
. tools/gpu_round.d/base.inc
base_build
test_cuda_run 150 6 "^\[  FAILED|error|mismatch|y\["
wait
[ -x $HB ] || { echo "base build FAILED"; tail -5 $L/base_build.log; }
row() { # label binary model [bench flags]
  [ $(left) -lt 90 ] && { echo "$1: NOT RUN (time)"; return; }
  local l=$1 b=$2 m=$3; shift 3
  timeout 70 $b bench $m --device cuda -p 512 -n 128 ${@:--r 3} --json >$L/$l.json 2>$L/$l.log
  echo "$l: $(tps $L/$l.json)"
}
Q=$G8/llama8b-q4_k_m.gguf
for i in $(seq 1 60); do [ -f $M4/.done ] && break; sleep 1; done
row m4_new $H $M4; row m4_base $HB $M4; row m4_new2 $H $M4; row m4_base2 $HB $M4
row m4_b8_new $H $M4 --batch 8 -r 1; row m4_b8_base $HB $M4 --batch 8 -r 1
[ -f $Q ] && { row q4km_b8_new $H $Q --batch 8 -r 1; row q4km_b8_base $HB $Q --batch 8 -r 1; }
IDS='[128000,791,6864,315,9822,374,12366,13,578,6864,315,9635,374]'
for v in new base base_noshfl; do
  [ $(left) -lt 30 ] && { echo "trace $v: NOT RUN (time)"; continue; }
  bin=$H; env=""; [ $v != new ] && bin=$HB; [ $v = base_noshfl ] && env=HEARTH_CUDA_MLX4_SHFL=0
  env $env timeout $(( $(left) - 5 )) $bin trace $M4 --ids "$IDS" --steps 8 --step-top 3 --top 3 --last 1 --device cuda >$L/trace_$v.json 2>$L/trace_$v.log
done
echo "MLX 4-bit 8B traces:"
trace_cmp $L/trace_new.json $L/trace_base.json "v3 (new) vs v2 (base)"
trace_cmp $L/trace_base.json $L/trace_base_noshfl.json "v2 vs v2 with the other lane order (base, SHFL=0)"
