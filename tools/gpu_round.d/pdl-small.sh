#!/usr/bin/env bash
# pdl-small: the decode step's small kernels launched as programmatic dependents
# (cuda_pdl.cuh: pdl_launch_small): the CUDA unit tests with it on, then 8B decode rows with
# HEARTH_CUDA_PDL_SMALL = 0 / default back to back per model (ab.sh; Q4_K_M twice).
# Env from tools/gpu_round; PS_ROWS overrides the rows. Usage: pdl-small.sh LOGDIR
L=${1:?usage: pdl-small.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${PS_BUDGET:-400}
. tools/gpu_round.d/units.inc
run_units test_cuda test_cuda_graph test_cuda_ragged test_cuda_prefill
AB_BUDGET=$(left) AB_ROWS="${PS_ROWS:-q4-off=q4km,HEARTH_CUDA_PDL_SMALL=0 q4-on=q4km q4-off2=q4km,HEARTH_CUDA_PDL_SMALL=0 q4-on2=q4km q8-off=q8,HEARTH_CUDA_PDL_SMALL=0 q8-on=q8 bf-off=l8,HEARTH_CUDA_PDL_SMALL=0 bf-on=l8 bf-pdl1=l8,HEARTH_CUDA_PDL=1 m4-off=m4,HEARTH_CUDA_PDL_SMALL=0 m4-on=m4 q3m4-off=q3m4,HEARTH_CUDA_PDL_SMALL=0 q3m4-on=q3m4}" \
  tools/gpu_round.d/ab.sh $L/ab
