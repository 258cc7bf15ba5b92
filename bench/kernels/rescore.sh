#!/usr/bin/env bash
# rescore.sh: builds hearth and bench/kernels/rescore_bench.c in build-bench (BUILD= another
# folder; NVCC= for a CPU-only build) and runs bench/kernels/rescore.py: the exact logit rescoring's cost per decoded
# token on the two real GGUFs; result in bench/results/logits_rescore.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-bench}
# NVCC= (set, even empty) goes to make as given: NVCC= builds without CUDA
make --no-print-directory ${NVCC+"NVCC=$NVCC"} BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/libhearth.a" "$B/bin/hearth" >/dev/null
gcc -O2 -std=gnu11 -Wall -Wextra -Iinclude -Isrc -o "$B/rescore_bench" bench/kernels/rescore_bench.c \
    "$B/libhearth.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
tools/get_models.sh >&2
exec .venv/bin/python bench/kernels/rescore.py "$B" "$@"
