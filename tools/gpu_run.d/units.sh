#!/usr/bin/env bash
# units LOGDIR: every CUDA unit binary of the build (tests/unit/test_cuda*.c), each under a
# 60 s timeout; PASS only when the binary itself says PASSED, a skip for want of a device is
# never a pass. UNITS overrides the list (binary names). Budget UN_BUDGET (s, 240).
# Usage: units.sh LOGDIR
L=${1:?usage: units.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
: "${B:?B (the build dir) must be set by tools/gpu_run}"
# shellcheck disable=SC2034 # T0 and BUDGET are read by units.inc's left()
T0=$(date +%s); BUDGET=${UN_BUDGET:-240}
# shellcheck source=tools/gpu_run.d/units.inc
. tools/gpu_run.d/units.inc
cuda_units=(tests/unit/test_cuda*.c)
cuda_units=("${cuda_units[@]##*/}")
# shellcheck disable=SC2086 # UNITS is a list of binary names
run_units ${UNITS:-${cuda_units[@]%.c}}
