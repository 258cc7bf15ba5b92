#!/usr/bin/env bash
# fuse-norm LOGDIR: the decode norms done by the residual GEMV's last block (round 19,
# cuda_norm_tail.cuh; opt-in, HEARTH_CUDA_FUSE_NORM=1; 0 launches them as before). In order: the CUDA unit
# tests (test_cuda's test_gemv_norm compares the fused kernels with GEMV + norm byte for byte),
# the tiny traces at both levels byte for byte, then 8B traces (16 ids, 6 decode steps; Q4_K_M
# and bf16, FN_TRACE8 overrides) at both levels byte for byte, tiny parity (parity.sh; FN_PARITY=0
# skips it), the deterministic serve test,
# and last the 8B decode rows with the levels alternated (ab.sh). Env from tools/gpu_round;
# FN_ROWS overrides the rows. Usage: fuse-norm.sh LOGDIR
L=${1:?usage: fuse-norm.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${FN_BUDGET:-540}
. tools/gpu_round.d/units.inc
run_units test_cuda test_cuda_graph test_cuda_kv test_cuda_ragged
F=HEARTH_CUDA_FUSE_NORM
trace_pair() { # name model ids steps: the two levels' traces, byte for byte
  for e in 0 1; do
    env $F=$e timeout 60 $H trace $2 --ids "$3" --last 4 --top 8 --steps $4 --step-top 8 --device cuda \
      >$L/t_$1_$e.json 2>>$L/trace.log
  done
  [ -s $L/t_$1_0.json ] && cmp -s $L/t_$1_0.json $L/t_$1_1.json
}
IDS=$(python3 -c "import random; random.seed(5); print(str([random.randrange(1,600) for _ in range(40)]).replace(' ',''))")
same=0 differ=""
for n in llama-bf16 qwen3-bf16 llama-f32 qwen3-q4g64 gemma3-bf16 llama-q8g32; do
  if trace_pair $n $TINY/$n "$IDS" 24; then same=$((same + 1)); else differ="$differ $n"; fi
done
echo "tiny traces (top-8 logits, 24 decode steps) FUSE_NORM=0 vs 1 byte-identical: $same of 6; differ:${differ:- none}"
for i in $(seq 1 120); do [ -f $G8/.done ] && [ -f $L8/.done ] && break; sleep 1; done
IDS8=$(python3 -c "import random; random.seed(7); print(str([random.randrange(1,30000) for _ in range(16)]).replace(' ',''))")
same=0 differ=""
for m in ${FN_TRACE8:-q4km:$G8/llama8b-q4_k_m.gguf bf16:$L8}; do
  [ $(left) -lt 280 ] && { differ="$differ ${m%%:*}(NOT RUN: time)"; continue; }
  if trace_pair 8b_${m%%:*} ${m#*:} "$IDS8" 6; then same=$((same + 1)); else differ="$differ ${m%%:*}"; fi
done
echo "8B traces (top-8 logits, 6 decode steps) FUSE_NORM=0 vs 1 byte-identical: $same; differ:${differ:- none}"
[ "${FN_PARITY:-1}" = 1 ] && PA_BUDGET=40 tools/gpu_round.d/parity.sh $L/parity | tail -3
(cd tests/api && HEARTH_BIN="$H" HEARTH_CACHE="$(dirname "$TINY")" timeout 90 python3 -m pytest -q -rs \
  test_cuda_deterministic.py) >$L/deterministic.log 2>&1
echo "deterministic serve rc $?: $(tail -1 $L/deterministic.log | cut -c1-120)"
grep -m2 -E '^E .*(differs|assert)' $L/deterministic.log | cut -c1-250
rows="q4-f0=q4km,$F=0 q4-f1=q4km,$F=1 q4-f0b=q4km,$F=0 q4-f1b=q4km,$F=1 q4-skip1=q4km,HEARTH_CUDA_PROFILE_SKIP=1 bf-f0=l8,$F=0 bf-f1=l8,$F=1"
rows="$rows q8-f0=q8,$F=0 q8-f1=q8,$F=1 m4-f0=m4,$F=0 m4-f1=m4,$F=1 bf-f0b=l8,$F=0 bf-f1b=l8,$F=1"
AB_BUDGET=$(left) AB_ROWS="${FN_ROWS:-$rows}" tools/gpu_round.d/ab.sh $L/ab
