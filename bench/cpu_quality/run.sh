#!/usr/bin/env bash
# run.sh: entry point of the CPU fast-tier quality benchmark (bench/cpu_quality/run.py): builds
# hearth's library, installs llama.cpp as bench/cpu_vs_llamacpp does (llama-cpp-python into .venv,
# native libraries built in build/llamacpp), fetches the models, then measures and writes
# bench/results/cpu_quality.md. Arguments go to run.py (e.g. --keep DIR, --models smollm2).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "run.sh: no $PY; run tools/deps.sh first" >&2; exit 1; }
make -C "$REPO" -j2 lib/libhearth.so >&2
"$REPO/bench/cpu_vs_llamacpp/install_llamacpp.sh" >&2
"$REPO/tools/get_models.sh" >&2
exec "$PY" "$HERE/run.py" --hearth-lib "$REPO/lib/libhearth.so" "$@"
