#!/usr/bin/env bash
# Builds the library in build-bench and runs the decode GEMV benchmark; results go to
# bench/results/kernels.{json,md}. Usage: bench/kernels/run.sh [arena MiB, default 1024]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-bench}
make --no-print-directory BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/libhearth.a" >/dev/null
gcc -O2 -std=gnu11 -Wall -Wextra -Iinclude -Isrc -o "$B/matvec_bench" bench/kernels/matvec_bench.c \
    "$B/libhearth.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
# the small-T (batched decode) GEMM benchmark, run by hand: $B/gemm_small_bench [threads] [formats] [NxK] [T,...]
gcc -O2 -std=gnu11 -Wall -Wextra -Iinclude -Isrc -o "$B/gemm_small_bench" bench/kernels/gemm_small_bench.c \
    "$B/libhearth.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
# the Gated DeltaNet op (Qwen3.5), run by hand: $B/gdn_bench [threads] [layers] (bench/results/cpu_gdn.md)
gcc -O2 -std=gnu11 -Wall -Wextra -Iinclude -Isrc -o "$B/gdn_bench" bench/kernels/gdn_bench.c \
    "$B/libhearth.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
mkdir -p bench/results
"$B/matvec_bench" bench/results "${1:-1024}"
