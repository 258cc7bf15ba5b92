#!/usr/bin/env bash
# parity: CUDA greedy tokens against the scalar CPU tier (the oracle: exact dequantization,
# f32 activations, double accumulation) on the tiny models, with a 40-token prompt so the
# prefill kernels run: --cuda-exact (the exact tier: f32 GEMMs and f32 attention)
# must be identical; the default fast tier (bf16 GEMMs, bf16 tensor-core prefill
# attention) is reported beside it. Env from tools/gpu_run. Usage: parity.sh LOGDIR
L=${1:?usage: parity.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s); BUDGET=${PA_BUDGET:-$((${PHASE_BUDGET:-45} - 5))}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
IDS=$(python3 -c "import random; random.seed(5); print(str([random.randrange(1,600) for _ in range(40)]).replace(' ',''))")
declare -A ok bad
# check TAG MODEL IDS: the CPU scalar tier's trace of MODEL on IDS against the CUDA exact (f32)
# and fast (bf16) tiers'; tallies ok[TAG.mode] or names the model in bad[TAG.mode]
check() {
  local tag=$1 m=$2 ids=$3 n mode r
  n=$(basename "$m")
  HEARTH_CPU=scalar timeout 20 "$H" trace "$m" --ids "$ids" --last 4 --top 8 --steps 24 --step-top 8 --device cpu >"$L"/"$tag"_"${n}"_cpu.json 2>>"$L"/parity.log
  for mode in f32 bf16; do
    exact=(); [ "$mode" = f32 ] && exact=(--cuda-exact)
    timeout 15 "$H" trace "$m" --ids "$ids" --last 4 --top 8 --steps 24 --step-top 8 --device cuda "${exact[@]}" >"$L"/"$tag"_"${n}"_$mode.json 2>>"$L"/parity.log
    r=$(python3 tools/cuda_check_parity.py "$L"/"$tag"_"${n}"_cpu.json "$L"/"$tag"_"${n}"_$mode.json 2>&1); echo "$tag $n $mode $r" >>"$L"/parity.log
    case "$r" in *'"greedy_identical": true'*) ok[$tag.$mode]=$((${ok[$tag.$mode]:-0} + 1)) ;; *) bad[$tag.$mode]="${bad[$tag.$mode]:-} $n" ;; esac
  done
}
n_models=0
for m in "$TINY"/*/; do
  [ "$(left)" -lt 4 ] && break
  check p "$m" "$IDS"
  n_models=$((n_models + 1))
done
# the hybrids again with a 300-token prompt: the fast tier's prefill takes the chunked delta
# rule there (four chunks of 64 and a partial one; the 40-token prompt is one partial chunk)
LONG=$(python3 -c "import random; random.seed(6); print(str([random.randrange(1,600) for _ in range(300)]).replace(' ',''))")
for m in "$TINY"/qwen3_5*/; do
  [ "$(left)" -lt 4 ] && break
  check l "$m" "$LONG"
done
dirs=("$TINY"/*/)
echo "tiny models checked: $n_models of ${#dirs[@]}"
echo "exact tier (--cuda-exact) == CPU scalar: ${ok[p.f32]:-0} identical; differ:${bad[p.f32]:- none}"
echo "fast tier (bf16 GEMM + bf16 attention) == CPU scalar: ${ok[p.bf16]:-0} identical; differ:${bad[p.bf16]:- none}"
echo "hybrids, 300-token prompt: exact tier == CPU scalar: ${ok[l.f32]:-0} identical; differ:${bad[l.f32]:- none}; fast tier (chunked delta rule): ${ok[l.bf16]:-0} identical; differ:${bad[l.bf16]:- none}"
