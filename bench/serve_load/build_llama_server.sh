#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` (the HTTP server with parallel slots and continuous
# batching) as the llama.cpp peer of bench/serve_load, from the vendored llama.cpp inside the
# pinned llama-cpp-python sdist (the same source bench/cpu_vs_llamacpp uses). CPU only,
# -march=native with AMX explicitly off (ggml's AMX kernels segfault on this Xeon, see
# bench/cpu_vs_llamacpp/install_llamacpp.sh), static libraries so the binary stands alone, no
# OpenSSL, no web UI build. Idempotent: exits at once when the binary is already there and runs.
# Prints the binary's path on the last line of stdout. Nothing of llama.cpp goes into the repo.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DEST="${HEARTH_CACHE:-$HOME/.cache/hearth}/bench/llamacpp"
BUILD="$DEST/build-server"
BIN="$BUILD/bin/llama-server"
JOBS="${BENCH_BUILD_JOBS:-2}"

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$DEST"
SDIST="$DEST/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    "$ROOT/.venv/bin/pip" download -q --no-deps --no-binary :all: -d "$DEST" "llama-cpp-python==$VERSION" >&2
fi
SRC="$DEST/llama_cpp_python-$VERSION"
[ -d "$SRC/vendor/llama.cpp" ] || tar -xzf "$SDIST" -C "$DEST"

NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" # explicit -mno-* win over -march=native in GCC
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF "-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX" > "$DEST/cmake-server.log" 2>&1 \
    || { tail -30 "$DEST/cmake-server.log" >&2; exit 1; }
echo "building llama-server (llama-cpp-python $VERSION vendored llama.cpp) with $JOBS jobs; takes a while on a small machine" >&2
ninja -C "$BUILD" -j "$JOBS" llama-server > "$DEST/ninja-server.log" 2>&1 || { tail -30 "$DEST/ninja-server.log" >&2; exit 1; }
"$BIN" --version >&2
echo "$BIN"
