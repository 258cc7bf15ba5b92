#!/usr/bin/env bash
# att-early LOGDIR: the decode attention's early loads (HEARTH_CUDA_ATT_EARLY, cuda_ops.cu:
# 0 the loads as before, 1 values with the keys and the merge's partials with its weights,
# 2 the default: also the first tile's rows of earlier steps before pdl_wait). In order: the
# CUDA unit tests, the tiny greedy tokens of levels 0 and 2 compared byte for byte (every
# level must give the same bits), tiny parity (parity.sh), the deterministic serve test, then
# 8B decode rows with the levels back to back (ab.sh), and attention + merge left out
# (HEARTH_CUDA_PROFILE_SKIP=12) for its cost per layer. Env from tools/gpu_round; AE_ROWS
# overrides the rows. Usage: att-early.sh LOGDIR
L=${1:?usage: att-early.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${AE_BUDGET:-480}
. tools/gpu_round.d/units.inc
run_units test_cuda_kv test_cuda test_cuda_graph test_cuda_ragged
IDS=$(python3 -c "import random; random.seed(5); print(str([random.randrange(1,600) for _ in range(40)]).replace(' ',''))")
same=0 differ=""
for n in llama-f32 qwen3-q4g64 gemma3-bf16 llama-q8g32; do
  for e in 0 2; do
    HEARTH_CUDA_ATT_EARLY=$e timeout 20 $H trace $TINY/$n --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 \
      --device cuda >$L/t_${n}_$e.json 2>>$L/trace.log
  done
  if [ -s $L/t_${n}_0.json ] && cmp -s $L/t_${n}_0.json $L/t_${n}_2.json; then same=$((same + 1)); else differ="$differ $n"; fi
done
echo "tiny traces (top-8 logits, 24 decode steps) EARLY=0 vs 2 byte-identical: $same of 4; differ:${differ:- none}"
PA_BUDGET=75 tools/gpu_round.d/parity.sh $L/parity | tail -3
(cd tests/api && HEARTH_BIN="$H" HEARTH_CACHE="$(dirname "$TINY")" timeout 90 python3 -m pytest -q -rs \
  test_cuda_deterministic.py) >$L/deterministic.log 2>&1
echo "deterministic serve rc $?: $(tail -1 $L/deterministic.log | cut -c1-120)"
grep -m2 -E '^E .*(differs|assert)' $L/deterministic.log | cut -c1-250
A=HEARTH_CUDA_ATT_EARLY S=HEARTH_CUDA_PROFILE_SKIP=12
rows="q4-e0=q4km,$A=0 q4-e2=q4km q4-e1=q4km,$A=1 q4-e0b=q4km,$A=0 q4-e2b=q4km q4-skip12=q4km,$S"
rows="$rows q8-e0=q8,$A=0 q8-e2=q8 bf-e0=l8,$A=0 bf-e2=l8 bf-skip12=l8,$S m4-e0=m4,$A=0 m4-e2=m4"
AB_BUDGET=$(left) AB_ROWS="${AE_ROWS:-$rows}" tools/gpu_round.d/ab.sh $L/ab
