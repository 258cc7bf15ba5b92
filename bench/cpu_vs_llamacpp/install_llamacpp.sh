#!/usr/bin/env bash
# Installs llama.cpp as the CPU peer for bench/cpu_vs_llamacpp, from the pinned llama-cpp-python
# sdist on PyPI: its vendored llama.cpp is built with cmake (CPU only, -march=native, no AMX, no
# BLAS) in build/llamacpp (ignored by git, never committed): the libraries (ggml, llama,
# llama-common and llama-bench-impl, which holds all of llama-bench's logic), copied to
# $HEARTH_CACHE/bench/llamacpp/lib; then llama.cpp's own llama-bench, which is how llama.cpp's
# users measure it, is linked against those libraries from the source's tools/llama-bench/main.cpp
# (a one-function driver; seconds) into build/llamacpp/bin/llama-bench. The Python bindings are
# pip-installed into .venv without native code (they find the libraries through
# LLAMA_CPP_LIB_PATH). Idempotent: each of the three steps runs only when its output is missing.
#
# Why not a plain `pip install llama-cpp-python`: on this Xeon, GGML_NATIVE turns on ggml's AMX
# kernels, and ggml_backend_amx_mul_mat segfaults on the first llama_decode of every model tried
# (Q4_1, Q8_0, Q4_K_M); the package build also compiles mtmd (~180 objects) that the
# benchmark never loads, which takes ~40 minutes on 2 shared cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="$ROOT/.venv/bin/python"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DEST="${HEARTH_CACHE:-$HOME/.cache/hearth}/bench/llamacpp"
LIB="$DEST/lib"
BUILD="$ROOT/build/llamacpp"
JOBS="${BENCH_BUILD_JOBS:-2}"

SRC="$DEST/llama_cpp_python-$VERSION"
bindings_ok() { LLAMA_CPP_LIB_PATH="$LIB" "$PY" -c "import sys; sys.path.insert(0, '$ROOT/bench/cpu_vs_llamacpp'); import prepare_models; prepare_models.import_llama_cpp()" >/dev/null 2>&1; }
if [ -f "$LIB/libllama.so" ] && [ -f "$LIB/libllama-bench-impl.so" ] && [ -x "$BUILD/bin/llama-bench" ] && bindings_ok; then
    echo "llama.cpp ready: llama-cpp-python $VERSION, libraries in $LIB, $BUILD/bin/llama-bench"
    exit 0
fi
mkdir -p "$DEST"
SDIST="$DEST/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    "$ROOT/.venv/bin/pip" download -q --no-deps --no-binary :all: -d "$DEST" "llama-cpp-python==$VERSION"
fi
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$DEST"

# 1. the native libraries (ggml, ggml-base, ggml-cpu, llama, llama-common, llama-bench-impl), nothing
#    else; their RUNPATH is $ORIGIN, so the copies in $LIB find each other wherever the build goes
if [ ! -f "$LIB/libllama.so" ] || [ ! -f "$LIB/libllama-bench-impl.so" ]; then
    NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" # explicit -mno-* win over -march=native in GCC
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
        "-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX" > "$DEST/cmake.log"
    echo "building llama.cpp (llama-cpp-python $VERSION vendored) with $JOBS jobs; takes a while on a small machine"
    start=$(date +%s)
    ninja -C "$BUILD" -j "$JOBS" llama ggml-cpu llama-bench-impl > "$DEST/ninja.log" || { tail -30 "$DEST/ninja.log"; exit 1; }
    echo "llama.cpp built in $(( $(date +%s) - start )) s (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$BUILD/build_time.txt"
    mkdir -p "$LIB"
    cp -a "$BUILD"/bin/lib*.so* "$LIB"/
fi

# 2. llama-bench: tools/llama-bench/main.cpp only calls llama_bench() of libllama-bench-impl. Every
#    library is named on the link line (--no-as-needed) so the binary loads them all from $LIB by its
#    own RPATH, whatever RUNPATH the libraries carry (copies from an older build point at its folder).
if [ ! -x "$BUILD/bin/llama-bench" ]; then
    mkdir -p "$BUILD/bin"
    "${CXX:-g++}" -O2 -std=c++17 "$SRC/vendor/llama.cpp/tools/llama-bench/main.cpp" -o "$BUILD/bin/llama-bench" \
        -L"$LIB" -Wl,--no-as-needed -lllama-bench-impl -lllama-common -lllama -lggml -lggml-cpu -lggml-base \
        -Wl,-rpath,"$LIB"
    echo "llama-bench linked: $BUILD/bin/llama-bench ($("$BUILD/bin/llama-bench" --version 2>&1 | head -1))"
fi

# 3. the Python bindings alone (LLAMA_BUILD=OFF: no second native build)
if ! bindings_ok; then
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$ROOT/.venv/bin/pip" install -q --force-reinstall --no-deps "$SDIST"
    "$ROOT/.venv/bin/pip" install -q "numpy>=1.20" "typing-extensions>=4.5" "diskcache>=5.6.1" "jinja2>=2.11.3"
fi
LLAMA_CPP_LIB_PATH="$LIB" "$PY" -c "import sys; sys.path.insert(0, '$ROOT/bench/cpu_vs_llamacpp'); import prepare_models; llama_cpp = prepare_models.import_llama_cpp(); print('llama-cpp-python', llama_cpp.__version__, 'ready;', llama_cpp.llama_print_system_info().decode())"
