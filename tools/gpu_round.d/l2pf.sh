#!/usr/bin/env bash
# l2pf LOGDIR: the L2 prefetch of the next GEMV's weights (cuda_l2pf, HEARTH_CUDA_L2PF): the CUDA
# unit tests that run the prefetching launches against their unprefetched twins (test_cuda_graph,
# test_cuda_kv) and test_cuda, then ab.sh's decode rows (AB_ROWS, e.g. q0=q4km
# q16=q4km,HEARTH_CUDA_L2PF=16). Env from tools/gpu_round. Usage: l2pf.sh LOGDIR
L=${1:?usage: l2pf.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${L2PF_BUDGET:-500}
. tools/gpu_round.d/units.inc
run_units test_cuda_graph test_cuda_kv test_cuda
AB_BUDGET=$(left) tools/gpu_round.d/ab.sh $L/ab
