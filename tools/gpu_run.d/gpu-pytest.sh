#!/usr/bin/env bash
# gpu-pytest LOGDIR: the pytest files whose CUDA cases need a device, run against the runner's
# build (HEARTH_BIN=$H) and the carried tiny models (HEARTH_CACHE = the folder holding tiny/):
# GP_FILES (default: tests/parity/test_cuda_device.py; tests/api/test_hybrid_cache.py needs the
# anthropic SDK, which the GPU machine lacks), each
# under its own share of the phase's budget; a skip is reported with its reason (-rs), never
# as a pass. Usage: gpu-pytest.sh LOGDIR   Env from tools/gpu_run (H, TINY).
L=${1:?usage: gpu-pytest.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
read -r -a files <<<"${GP_FILES:-tests/parity/test_cuda_device.py}"
each=$(( ${PHASE_BUDGET:-240} / ${#files[@]} - 5 ))
for f in "${files[@]}"; do
  n=$(basename "$f" .py)
  HEARTH_BIN=$H HEARTH_CACHE=$(dirname "$TINY") timeout "$each" python3 -m pytest -q -rs -p no:cacheprovider "$f" \
    >"$L/$n.log" 2>&1
  echo "$f rc $?: $(tail -n1 "$L/$n.log")"
  grep -E "^(FAILED|ERROR)" "$L/$n.log" | head -8 | cut -c1-300
done
