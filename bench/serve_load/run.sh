#!/usr/bin/env bash
# run.sh: entry point of the concurrent-load benchmark (issue 6, CPU speed). Builds hearth (a no-op when
# up to date), makes sure the peers are there (llama.cpp via bench/cpu_vs_llamacpp/install_llamacpp.sh and
# llama-cpp-python's server extra, pinned, into .venv; the 1B-shaped model via prepare_models.py), then runs
# bench/serve_load/serve_load.py: hearth serve, mlx_lm.server and llama-cpp-python's server in turn on the
# same weights, N = 1, 4, 16. Writes bench/results/serve_load.{json,md}. Takes ~10-15 min on 2 cores.
# usage: bench/serve_load/run.sh [serve_load.py flags: --n 1,4,16 --max-tokens 64 --threads 2 --budget 240
#        --models smollm2-135m-q4_1,llama1b-q4_0 --servers hearth,mlx_lm,llama.cpp --out PREFIX]
#   env: HEARTH_BIN (skip the build and use this binary), HEARTH_BUILD (make build dir, default build-bench),
#        HEARTH_CACHE (model cache, default ~/.cache/hearth)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "run.sh: no $PY; run tools/deps.sh first" >&2; exit 1; }
"$PY" -c "import mlx_lm, gguf, tokenizers, transformers" 2>/dev/null \
  || { echo "run.sh: $PY lacks mlx_lm/gguf/tokenizers/transformers; run tools/deps.sh" >&2; exit 1; }

# llama-cpp-python's server extra (its own metadata asks starlette-context <0.4); pinned for reproducibility
SERVER_PKGS=("uvicorn==0.54.0" "fastapi==0.165.0" "sse-starlette==3.7.0" "starlette-context==0.3.6"
             "pydantic-settings==2.16.3")
"$PY" -c "import uvicorn, fastapi, sse_starlette, starlette_context, pydantic_settings" 2>/dev/null \
  || "$REPO/.venv/bin/pip" install -q --disable-pip-version-check "${SERVER_PKGS[@]}"
"$REPO/bench/cpu_vs_llamacpp/install_llamacpp.sh" >&2
"$PY" "$REPO/bench/cpu_vs_llamacpp/prepare_models.py" >&2

if [ -z "${HEARTH_BIN:-}" ]; then
  B="${HEARTH_BUILD:-build-bench}"
  LOG="$(mktemp "${TMPDIR:-/tmp}/hearth-serve-load-make.XXXXXX")"
  echo "run.sh: building hearth in $B" >&2
  make -C "$REPO" -j2 BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/bin/hearth" > "$LOG" 2>&1 \
    || { tail -30 "$LOG" >&2; exit 1; }
  HEARTH_BIN="$REPO/$B/bin/hearth"
fi

exec "$PY" "$HERE/serve_load.py" --hearth "$HEARTH_BIN" "$@"
