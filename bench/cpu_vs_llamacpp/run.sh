#!/usr/bin/env bash
# run.sh: entry point of the CPU benchmark hearth vs llama.cpp. Builds llama.cpp (pinned
# llama-cpp-python sdist's vendored source, native CPU build; install_llamacpp.sh) where missing: its
# libraries in $HEARTH_CACHE/bench/llamacpp/lib, which the Python bindings in .venv use to quantize
# the models, and llama-bench, the peer measured, linked against them into build/llamacpp/bin; builds
# hearth, prepares the GGUF models in $HEARTH_CACHE/bench, then runs run_bench.py, which writes
# bench/results/cpu_vs_llamacpp.md. Nothing of llama.cpp is committed (build/ is ignored).
# usage: bench/cpu_vs_llamacpp/run.sh [run_bench.py flags: -p 512 -n 128 -t 2 -r 5 --only ID,.. --no-1b]
#   env: HEARTH_BIN (skip the build and use this binary), HEARTH_BUILD (make build dir, default build-bench),
#        HEARTH_CACHE (model cache, default ~/.cache/hearth), BENCH_THREADS (quantizer threads, default 2)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "run.sh: no $PY; run tools/deps.sh first" >&2; exit 1; }
LOGDIR="$(mktemp -d "${TMPDIR:-/tmp}/hearth-bench.XXXXXX")"

# 1. llama.cpp: its from-source build takes many minutes on 2 cores, so it runs in the background
#    while hearth builds and the models are prepared; only quantization needs it before the end.
"$HERE/install_llamacpp.sh" > "$LOGDIR/install.log" 2>&1 &
INSTALL_PID=$!
wait_install() {
  if [ -n "${INSTALL_PID:-}" ]; then
    wait "$INSTALL_PID" || { echo "run.sh: llama-cpp-python install failed:" >&2; tail -30 "$LOGDIR/install.log" >&2; exit 1; }
    INSTALL_PID=""
    tail -1 "$LOGDIR/install.log" >&2
  fi
}

# 2. hearth (rebuilt so kernel changes are measured; make is a no-op when up to date)
if [ -z "${HEARTH_BIN:-}" ]; then
  B="${HEARTH_BUILD:-build-bench}"
  echo "run.sh: building hearth in $B" >&2
  make -C "$REPO" -j2 BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/bin/hearth" > "$LOGDIR/make.log" 2>&1 \
    || { tail -30 "$LOGDIR/make.log" >&2; exit 1; }
  HEARTH_BIN="$REPO/$B/bin/hearth"
fi

# 3. models: links and the F16 random model need no llama.cpp; the quantized ones do.
no1b=""
for a in "$@"; do [ "$a" = "--no-1b" ] && no1b="--no-1b"; done
wait_install
"$PY" "$HERE/prepare_models.py" $no1b > "$LOGDIR/prepare.log" 2>&1 || { tail -30 "$LOGDIR/prepare.log" >&2; exit 1; }

# 4. measure
exec "$PY" "$HERE/run_bench.py" --hearth "$HEARTH_BIN" "$@"
