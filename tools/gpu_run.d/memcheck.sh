#!/usr/bin/env bash
# memcheck LOGDIR: the CUDA unit binaries named in MC_UNITS (default: the prefill attention's
# test_cuda_prefill and test_cuda_kv, and test_cuda_ragged) under compute-sanitizer's memcheck
# (out-of-bounds and misaligned device accesses, including cp.async copies); rc 9 means it
# found errors. Env from tools/gpu_run. Budget MC_BUDGET (s, 150).
L=${1:?usage: memcheck.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
# shellcheck disable=SC2034 # T0 and BUDGET are read by units.inc's left()
T0=$(date +%s); BUDGET=${MC_BUDGET:-150}
# shellcheck source=tools/gpu_run.d/units.inc
. tools/gpu_run.d/units.inc
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for u in ${MC_UNITS:-test_cuda_prefill test_cuda_kv test_cuda_ragged}; do
  [ "$(left)" -lt 20 ] && { echo "$u: NOT RUN (time)"; continue; }
  timeout $(( $(left) - 5 )) "$CS" --tool memcheck --error-exitcode 9 "$B"/tests/"$u" >"$L"/"$u".log 2>&1; r=$?
  echo "$u under memcheck: rc $r ($( [ $r = 0 ] && echo clean || echo 'see log' )), $(unit_result $r "$L"/"$u".log), $(grep -m1 'ERROR SUMMARY' "$L"/"$u".log)"
done
