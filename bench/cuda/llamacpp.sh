#!/usr/bin/env bash
# llamacpp.sh: builds llama.cpp's llama-bench with its CUDA backend (sm_90a) from the source
# tarball that tools/cuda_check carries (build-cuda/llamacpp-src.tgz: only what llama-bench
# needs, repacked from the PyPI llama-cpp-python sdist; nothing of it is committed), then
# benchmarks GGUF files with it. Usage:
#   llamacpp.sh build SRC_TGZ DIR LOG [jobs]      -> DIR/b/bin/llama-bench
#   llamacpp.sh bench DIR OUT_JSON MODEL.gguf...  (-p 512,4096 -n 128 -fa 1 -ngl 99 -r 3)
set -u
case "${1:-}" in
build)
    tgz=$2 dir=$3 log=$4 jobs=${5:-16}
    rm -rf "$dir" && mkdir -p "$dir/src" && tar xzf "$tgz" -C "$dir/src" || exit 1
    # 90a: Hopper with its arch-specific instructions; no other architecture (build time)
    cmake -S "$dir/src" -B "$dir/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        >"$log" 2>&1 || exit 1
    cmake --build "$dir/b" --target llama-bench -j "$jobs" >>"$log" 2>&1
    ;;
bench)
    dir=$2 out=$3
    shift 3
    args=()
    for m in "$@"; do args+=(-m "$m"); done
    "$dir/b/bin/llama-bench" "${args[@]}" -p 512,4096 -n 128 -fa 1 -ngl 99 -r 3 -o json >"$out"
    ;;
*) echo "usage: llamacpp.sh build SRC_TGZ DIR LOG [jobs] | bench DIR OUT_JSON MODEL..." >&2; exit 2 ;;
esac
