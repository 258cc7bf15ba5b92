#!/usr/bin/env bash
# run.sh: entry point of the `hearth serve` overhead benchmark. Builds hearth (make is a no-op when up
# to date), then runs bench/serve_overhead/run_bench.py: engine vs HTTP streaming on the SmolLM2 GGUF,
# and hearth serve vs the real mlx_lm.server (from .venv) on a tiny f32 model, N=1 and N=8 clients.
# Writes bench/results/serve_overhead.md; the servers run on free loopback ports and are stopped.
# usage: bench/serve_overhead/run.sh [run_bench.py flags: -n 128 --threads 2 --reps 5 --reps8 3 --skip-mlx
#        --gguf FILE --tiny DIR --out PREFIX]
#   env: HEARTH_BIN (skip the build and use this binary), HEARTH_BUILD (make build dir, default build-bench),
#        HEARTH_CACHE (model cache, default ~/.cache/hearth)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "run.sh: no $PY; run tools/deps.sh first" >&2; exit 1; }
"$PY" -c "import mlx_lm, gguf" 2>/dev/null || { echo "run.sh: $PY lacks mlx_lm or gguf; run tools/deps.sh" >&2; exit 1; }

if [ -z "${HEARTH_BIN:-}" ]; then
  B="${HEARTH_BUILD:-build-bench}"
  LOG="$(mktemp "${TMPDIR:-/tmp}/hearth-serve-bench-make.XXXXXX")"
  echo "run.sh: building hearth in $B" >&2
  make -C "$REPO" -j2 BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/bin/hearth" > "$LOG" 2>&1 \
    || { tail -30 "$LOG" >&2; exit 1; }
  HEARTH_BIN="$REPO/$B/bin/hearth"
fi

exec "$PY" "$HERE/run_bench.py" --hearth "$HEARTH_BIN" "$@"
