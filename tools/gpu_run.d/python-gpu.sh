#!/usr/bin/env bash
# python-gpu LOGDIR: the Python package built with the CUDA backend from the runner's build
# (HEARTH_CUDA=1 HEARTH_BUILD=$B: links $B's libhearth.a, nothing recompiled) into LOGDIR/site,
# then tests/python/test_package_cuda.py on the carried tiny models (Engine(device="cuda")
# against `hearth generate --device cuda`, a session saved on the GPU); a skip is reported with
# its reason (-rs), never as a pass. Needs python3 with pip, setuptools and Python.h there.
# Usage: python-gpu.sh LOGDIR   Env from tools/gpu_run (B, H, TINY).
L=${1:?usage: python-gpu.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
: "${B:?B (the build dir) must be set by tools/gpu_run}" "${H:?}" "${TINY:?}"
if ! python3 -c 'import os, sysconfig, setuptools, pip
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")), "no Python.h"' >"$L/missing.txt" 2>&1; then
  echo "python-gpu: NOT RUN (not a pass): python3 here lacks pip, setuptools or its headers: $(tail -n1 "$L/missing.txt")"
  exit 0
fi
if ! HEARTH_CUDA=1 HEARTH_BUILD="$PWD/$B" timeout 300 python3 -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --target "$L/site" ./python >"$L/build.log" 2>&1; then
  echo "python-gpu: the package build FAILED (not a pass):"; tail -n 15 "$L/build.log"
  exit 0
fi
PYTHONPATH="$L/site" HEARTH_BIN="$H" HEARTH_CACHE="$(dirname "$TINY")" timeout "$(( ${PHASE_BUDGET:-240} - SECONDS - 5 ))" \
  python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_package_cuda.py >"$L/pytest.log" 2>&1
echo "tests/python/test_package_cuda.py rc $?: $(tail -n1 "$L/pytest.log")"
grep -E "^(FAILED|ERROR|SKIPPED)" "$L/pytest.log" | head -8 | cut -c1-300
