#!/usr/bin/env bash
# newfam.sh: issue 33's CPU rows: hearth vs llama.cpp's llama-bench on the new families
# (Qwen3.5-0.8B and Gemma-4-E2B in Q4_K_M, the same GGUF for both engines). Links llama-bench
# where missing (install_llamacpp.sh: seconds when its libraries are already in
# $HEARTH_CACHE/bench/llamacpp/lib, a long build otherwise), builds hearth unless
# HEARTH_BIN is given, writes the random-weight models of the real shapes (tools/gpu_models.py) into
# $HEARTH_CACHE/bench/newfam (about 0.5 GB for Qwen, 2.7 GB for Gemma), then runs newfam.py, which
# writes bench/results/cpu_newfam.md.
# usage: bench/cpu_vs_llamacpp/newfam.sh [newfam.py flags: -r 3 --rounds-big 2 --llama t2,t1 --models ...]
#   env: HEARTH_BIN, HEARTH_BUILD (make build dir, default build-bench), HEARTH_CACHE (default ~/.cache/hearth)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "newfam.sh: no $PY; run tools/deps.sh first" >&2; exit 1; }
"$HERE/install_llamacpp.sh" >&2
if [ -z "${HEARTH_BIN:-}" ]; then
  B="${HEARTH_BUILD:-build-bench}"
  echo "newfam.sh: building hearth in $B" >&2
  make -C "$REPO" -j2 NVCC= BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/bin/hearth" >&2
  HEARTH_BIN="$REPO/$B/bin/hearth"
fi
exec "$PY" "$HERE/newfam.py" --hearth "$HEARTH_BIN" "$@"
