#!/usr/bin/env bash
# check LOGDIR: tools/cuda_check end to end (its own full build with the Makefile's CUDA
# architectures, in build-cudacheck/), the phases of CHECK_PHASES (default "build unit parity
# llama8b bench serve"; "build mlx gguf llamacpp" is the second half, CUDA_CHECK_QUICK=1 its
# short form); CHECK_REUSE_BUILD=1 runs them on tools/gpu_run's build (build-gpurun, sm_90a) instead
# of a build of its own (then leave `build` and `unit` out of CHECK_PHASES). Stops cuda_check's process group CHECK_STOP_S (10) seconds before the phase's
# budget (PHASE_BUDGET, set by tools/gpu_run) so its summary still prints. Usage: check.sh LOGDIR
L=${1:?usage: check.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
BUDGET=$((${PHASE_BUDGET:-560} - ${CHECK_STOP_S:-10}))
[ "${CHECK_REUSE_BUILD:-0}" = 1 ] && [ -x build-gpurun/bin/hearth ] && rm -rf build-cudacheck && ln -s build-gpurun build-cudacheck
# shellcheck disable=SC2086 # CHECK_PHASES is a word list
setsid env -u NVCCFLAGS tools/cuda_check "$L" ${CHECK_PHASES:-build unit parity llama8b bench serve} >"$L/cuda_check.txt" 2>&1 &
pid=$!
for ((i = 0; i < BUDGET; i += 5)); do kill -0 $pid 2>/dev/null || break; sleep 5; done
kill -0 $pid 2>/dev/null && { echo "check: budget of ${BUDGET}s spent; stopping cuda_check"; kill -- -$pid; sleep 2; }
tail -40 "$L/cuda_check.txt"
echo "== summary"; cat "$L/summary.txt"
