#!/usr/bin/env bash
# prefill-tc LOGDIR: the staged tensor-core prefill attention (stop 18: keys and values
# copied once per layer into a bf16 stage, key tiles streamed with cp.async two deep). The
# unit binaries that run it against their oracles (test_cuda_prefill: double-precision
# reference on bf16 operands; test_cuda_kv: quantized pools equal to the float pool of their
# dequantized rows, bit for bit; test_cuda_ragged: prefill runs inside ragged steps), then
# final-bench's 4096-token prefill rows (PT_ROWS), once per PT_VARIANTS entry: "default", or
# VAR=value[,VAR=value] run with that environment. Env from tools/gpu_round. Budget PT_BUDGET (s, 240).
L=${1:?usage: prefill-tc.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${PT_BUDGET:-240}
. tools/gpu_round.d/units.inc
run_units ${PT_UNITS-test_cuda_prefill test_cuda_kv test_cuda_ragged}
i=0
for v in ${PT_VARIANTS-default}; do
  [ $(left) -lt 40 ] && { echo "$v: NOT RUN (time)"; continue; }
  echo "== $v"; i=$((i + 1))
  env $([ $v != default ] && echo $v | tr ',' ' ') FB_ROWS="${PT_ROWS:-bf16_p4096 q4km_p4096}" \
    FB_BUDGET=$(( $(left) > 100 ? 90 : $(left) - 10 )) bash tools/gpu_round.d/final-bench.sh $L/fb_$i
done
