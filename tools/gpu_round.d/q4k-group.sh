#!/usr/bin/env bash
# q4k-group LOGDIR: this tree against a base tree built beside it (BASE_SRC, a `git archive`
# tarball of the commit before; default build-base-src.tgz): the whole test_cuda, gemv_bench
# Q4_K and MLX 4-bit, 8B decode rows of both binaries alternated
# (Q4_K_M, MLX 4-bit Llama), and greedy traces of the 8B Q4_K_M and MLX 4-bit models (this
# tree on the GPU, the base on the GPU, this tree on the CPU) compared token by token.
# Env from tools/gpu_round. Budget: QG_BUDGET (s, default 480). Usage: q4k-group.sh LOGDIR
L=${1:?usage: q4k-group.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${QG_BUDGET:-480}
. tools/gpu_round.d/base.inc
base_build
test_cuda_run 150 6 "^\[  FAILED|error|mismatch|y\["
GEMV_BENCH_FORMATS=Q4_K,mlx4 timeout 120 $B/bench/gemv_bench $L/gemv.json >$L/gemv.log 2>&1 || echo "gemv_bench: rc $?"
tail -12 $L/gemv.log
wait
[ -x $HB ] || { echo "base build FAILED"; tail -5 $L/base_build.log; }
row() { # label binary model
  [ $(left) -lt 100 ] && { echo "$1: NOT RUN (time)"; return; }
  timeout 60 $2 bench $3 --device cuda -p 512 -n 128 -r 3 --json >$L/$1.json 2>$L/$1.log
  echo "$1: $(tps $L/$1.json)"
}
Q=$G8/llama8b-q4_k_m.gguf
for i in $(seq 1 60); do [ -f $Q ] && [ -f $M4/.done ] && break; sleep 1; done
row q4km_new $H $Q; row q4km_base $HB $Q; row m4_new $H $M4; row m4_base $HB $M4; row q4km_new2 $H $Q
IDS='[128000,791,6864,315,9822,374,12366,13,578,6864,315,9635,374]'
for m in q4km m4; do
  mp=$([ $m = q4km ] && echo $Q || echo $M4)
  for v in new base cpu; do
    [ $(left) -lt 35 ] && { echo "trace $m $v: NOT RUN (time)"; continue; }
    bin=$H; dev=cuda; [ $v = base ] && bin=$HB; [ $v = cpu ] && dev=cpu
    timeout $(( $(left) - 5 )) $bin trace $mp --ids "$IDS" --steps 8 --step-top 3 --top 3 --last 1 --device $dev >$L/trace_${m}_$v.json 2>$L/trace_${m}_$v.log
  done
  echo "$m:"
  trace_cmp $L/trace_${m}_new.json $L/trace_${m}_base.json "new vs base (GPU)"
  trace_cmp $L/trace_${m}_new.json $L/trace_${m}_cpu.json "new GPU vs CPU"
  trace_cmp $L/trace_${m}_base.json $L/trace_${m}_cpu.json "base GPU vs CPU"
done
