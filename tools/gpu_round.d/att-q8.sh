#!/usr/bin/env bash
# att-q8 LOGDIR: the split-attention merge writing the o projection's int8 activations (stop
# 18; HEARTH_CUDA_ATT_Q8=0: quantize_x_q8 does, one launch more per layer). The CUDA unit
# binaries first (test_cuda_kv checks the merge's int8 copy exactly against the quantizer's
# rule; test_cuda the v2 GEMVs, invariance and PDL chains), then 8B decode rows back to back,
# default and off, twice (AQ_ROWS overrides). Env from tools/gpu_round. Budget AQ_BUDGET (200 s).
L=${1:?usage: att-q8.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${AQ_BUDGET:-200}
. tools/gpu_round.d/units.inc
run_units ${AQ_UNITS-test_cuda_kv test_cuda test_cuda_graph test_cuda_ragged}
AB_BUDGET=$(( $(left) - 5 )) AB_ROWS="${AQ_ROWS:-q4km=q4km q4km_off=q4km,HEARTH_CUDA_ATT_Q8=0 q4km_2=q4km q4km_off_2=q4km,HEARTH_CUDA_ATT_Q8=0}" \
  bash tools/gpu_round.d/ab.sh $L/ab
