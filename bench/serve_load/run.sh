#!/usr/bin/env bash
# run.sh: entry point of the concurrent-load benchmark (issue 6, CPU speed). Builds hearth (a no-op when
# up to date), makes sure the peers are there (llama.cpp's C++ llama-server via build_llama_server.sh, a
# no-op once built, ~30 min the first time on 2 busy cores; llama.cpp's libraries and llama-cpp-python via
# bench/cpu_vs_llamacpp/install_llamacpp.sh; the 1B-shaped model via prepare_models.py), then runs
# bench/serve_load/serve_load.py: hearth serve, mlx_lm.server and llama-server (--parallel, continuous
# batching) in turn on the same weights, N = 1, 4, 16. When llama-server cannot be built, llama-cpp-python's
# server (pinned extras into .venv; it serializes requests) is the fallback peer and the results say so.
# Writes bench/results/serve_load.md. Takes ~12-15 min on 2 cores.
# usage: bench/serve_load/run.sh [serve_load.py flags: --n 1,4,16 --max-tokens 64 --threads 2 --budget 240
#        --models smollm2-135m-q4_1,smollm2-135m-bf16,llama1b-q4_0 --servers hearth,mlx_lm,llama.cpp --out PREFIX]
#        --pairs 7 (paired N=1 serve-vs-bench samples; 0: off)
#   env: LLAMA_SERVER_BIN (use this llama-server; empty: the llama-cpp-python fallback), HEARTH_BIN (skip the build and use this binary), HEARTH_BUILD (make build dir, default build-bench),
#        HEARTH_CACHE (model cache, default ~/.cache/hearth)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "run.sh: no $PY; run tools/deps.sh first" >&2; exit 1; }
"$PY" -c "import mlx_lm, gguf, tokenizers, transformers" 2>/dev/null \
  || { echo "run.sh: $PY lacks mlx_lm/gguf/tokenizers/transformers; run tools/deps.sh" >&2; exit 1; }

"$REPO/bench/cpu_vs_llamacpp/install_llamacpp.sh" >&2
if [ -z "${LLAMA_SERVER_BIN+set}" ]; then
  if LLAMA_SERVER_BIN="$("$HERE/build_llama_server.sh" | tail -1)"; then
    echo "run.sh: llama.cpp peer: $LLAMA_SERVER_BIN" >&2
  else
    echo "run.sh: llama-server did not build; the llama.cpp peer falls back to llama-cpp-python's server" >&2
    LLAMA_SERVER_BIN=""
  fi
fi
export LLAMA_SERVER_BIN
if [ -z "$LLAMA_SERVER_BIN" ]; then
  # the fallback, llama-cpp-python's server extra (its own metadata asks starlette-context <0.4); pinned
  SERVER_PKGS=("uvicorn==0.54.0" "fastapi==0.165.0" "sse-starlette==3.7.0" "starlette-context==0.3.6"
               "pydantic-settings==2.16.3")
  "$PY" -c "import uvicorn, fastapi, sse_starlette, starlette_context, pydantic_settings" 2>/dev/null \
    || "$REPO/.venv/bin/pip" install -q --disable-pip-version-check "${SERVER_PKGS[@]}"
fi
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
