#!/usr/bin/env bash
# Builds the library in build-bench and runs the decode GEMV benchmark; the result goes to
# bench/results/kernels.md (its tables, then the full result as json: bench/results_file.py). Usage: bench/kernels/run.sh [arena MiB, default 1024]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-bench}
make --no-print-directory BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/libhearth.a" >/dev/null
gcc -O2 -std=gnu11 -Wall -Wextra -Iinclude -Isrc -o "$B/matvec_bench" bench/kernels/matvec_bench.c \
    "$B/libhearth.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
# the small-T (batched decode) GEMM benchmark, run by hand: $B/gemm_small_bench [threads] [formats] [NxK] [T,...]
# (HEARTH_BENCH_CPU_CLOCK=1 times one thread by its CPU clock on a busy machine)
gcc -O2 -std=gnu11 -Wall -Wextra -Iinclude -Isrc -o "$B/gemm_small_bench" bench/kernels/gemm_small_bench.c \
    "$B/libhearth.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
# the Gated DeltaNet op (Qwen3.5), run by hand: $B/gdn_bench [threads] [layers] (bench/results/kernel_choices.md)
gcc -O2 -std=gnu11 -Wall -Wextra -Iinclude -Isrc -o "$B/gdn_bench" bench/kernels/gdn_bench.c \
    "$B/libhearth.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$B/matvec_bench" "$T" "${1:-1024}"
python3 bench/results_file.py write bench/results/kernels.md --body "$T/kernels.md" --json "$T/kernels.json" \
    --command "bench/kernels/run.sh ${1:-1024}"
