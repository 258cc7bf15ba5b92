#!/usr/bin/env bash
# parity: CUDA greedy tokens against the scalar CPU tier (the oracle: exact dequantization,
# f32 activations, double accumulation) on the tiny models, with a 40-token prompt so the
# prefill kernels run: --cuda-exact (the exact tier: f32 GEMMs and f32 attention)
# must be identical; the default fast tier (bf16 GEMMs, bf16 tensor-core prefill
# attention) is reported beside it. Env from tools/gpu_run. Usage: parity.sh LOGDIR
L=${1:?usage: parity.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s); BUDGET=${PA_BUDGET:-40}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
IDS=$(python3 -c "import random; random.seed(5); print(str([random.randrange(1,600) for _ in range(40)]).replace(' ',''))")
declare -A ok bad
n_models=0
for m in "$TINY"/*/; do
  n=$(basename "$m")
  [ "$(left)" -lt 4 ] && break
  HEARTH_CPU=scalar timeout 15 "$H" trace "$m" --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cpu >"$L"/p_"${n}"_cpu.json 2>>"$L"/parity.log
  for mode in f32 bf16; do
    exact=(); [ "$mode" = f32 ] && exact=(--cuda-exact)
    timeout 15 "$H" trace "$m" --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cuda "${exact[@]}" >"$L"/p_"${n}"_$mode.json 2>>"$L"/parity.log
    r=$(python3 tools/cuda_check_parity.py "$L"/p_"${n}"_cpu.json "$L"/p_"${n}"_$mode.json 2>&1); echo "$n $mode $r" >>"$L"/parity.log
    case "$r" in *'"greedy_identical": true'*) ok[$mode]=$((${ok[$mode]:-0} + 1)) ;; *) bad[$mode]="${bad[$mode]:-} $n" ;; esac
  done
  n_models=$((n_models + 1))
done
dirs=("$TINY"/*/)
echo "tiny models checked: $n_models of ${#dirs[@]}"
echo "exact tier (--cuda-exact) == CPU scalar: ${ok[f32]:-0} identical; differ:${bad[f32]:- none}"
echo "fast tier (bf16 GEMM + bf16 attention) == CPU scalar: ${ok[bf16]:-0} identical; differ:${bad[bf16]:- none}"
