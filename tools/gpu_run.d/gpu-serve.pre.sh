#!/usr/bin/env bash
# gpu-serve.pre.sh LOGDIR: started by tools/gpu_run in the background at the very start of the
# device call, beside hearth's own build: builds llama.cpp's llama-server with CUDA (sm_90a only,
# flash attention, no curl/OpenSSL/web UI, static llama/ggml libraries, only that target) from the
# carried build-cuda/llamacpp-src.tgz (tools/cuda_llamacpp_src) into $LLAMA_SERVER_DIR
# (/tmp/llamacpp-server). Touches DIR/.done with the exit status and the seconds it took, which
# gpu-serve.sh waits for. Builds nothing when DIR/b/bin/llama-server already runs, or when the carried
# build-gpupack/llamacpp-bin.tar.xz (tools/cuda_llamacpp_bin) runs there. Also run by
# newfam-bench.pre.sh (its llama-bench rows); a lock makes the two wait for one build.
set -u
LOG=${1:?usage: gpu-serve.pre.sh LOGDIR}
mkdir -p "$LOG" && LOG=$(cd "$LOG" && pwd)
cd "$(dirname "$0")/../.." || exit 1
TGZ=${LLAMACPP_SRC_TGZ:-build-cuda/llamacpp-src.tgz}
DIR=${LLAMA_SERVER_DIR:-/tmp/llamacpp-server}
# 16 cores there: hearth's build (make -j16, at normal priority) runs at the same time; nice keeps
# it first, and 4 cores stay free for it when it would otherwise queue behind nvcc processes
CORES=$(nproc 2>/dev/null || echo 4)
JOBS=${GPU_SERVE_BUILD_JOBS:-$((CORES > 8 ? CORES - 4 : CORES))}
T0=$(date +%s)
done_with() { echo "$1 $(($(date +%s) - T0))" >"$DIR/.done"; echo "llama-server build: rc $1 in $(($(date +%s) - T0)) s (-j$JOBS)"; exit "$1"; }

mkdir -p "$DIR"
# one build at a time: newfam-bench.pre.sh runs this too; the second finds the first's binaries
exec 9>"$DIR.lock" && flock 9
rm -f "$DIR/.done"
if [ -x "$DIR/b/bin/llama-server" ] && [ -x "$DIR/b/bin/llama-bench" ] && "$DIR/b/bin/llama-server" --version >/dev/null 2>&1; then done_with 0; fi
# binaries built on the development machine (tools/cuda_llamacpp_bin), carried: used when they run here
BIN=${LLAMACPP_BIN_TXZ:-build-gpupack/llamacpp-bin.tar.xz}
if [ -f "$BIN" ]; then
    rm -rf "$DIR/b" && mkdir -p "$DIR/b/bin" && tar -xJf "$BIN" -C "$DIR/b/bin"
    runs=1 # every target the call needs (GPU_SERVE_TARGETS, below) is carried and starts
    for t in ${GPU_SERVE_TARGETS:-llama-server llama-bench}; do
        "$DIR/b/bin/$t" --help >/dev/null 2>&1 || { runs=0; echo "llama.cpp: carried $t: $("$DIR/b/bin/$t" --help 2>&1 | tail -1)"; }
    done
    [ $runs = 1 ] && { echo "llama.cpp: the carried binaries ($BIN) run here"; done_with 0; }
    echo "llama.cpp: the carried binaries ($BIN) do not cover ${GPU_SERVE_TARGETS:-llama-server llama-bench} here: building"
fi
[ -f "$TGZ" ] || { echo "no $TGZ: make it here with tools/cuda_llamacpp_src and carry it"; done_with 3; }
{ rm -rf "$DIR/src" "$DIR/b" && mkdir -p "$DIR/src" && tar xzf "$TGZ" -C "$DIR/src"; } || done_with 4
# llama-server's build embeds its web UI through scripts/ui-assets.cmake (an empty table without a UI)
[ -f "$DIR/src/scripts/ui-assets.cmake" ] ||
    { echo "$TGZ lacks scripts/ui-assets.cmake: remake it with the current tools/cuda_llamacpp_src"; done_with 5; }
# 90a: Hopper with its arch-specific instructions, nothing else (build time); native CPU code (the
# server samples on the host); FA_ALL_QUANTS off: only the f16/q4_0/q8_0/bf16 K-V kernels (f16 here)
nice -n 10 cmake -S "$DIR/src" -B "$DIR/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_CUDA_FA=ON -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
    >"$LOG/llama_server_cmake.log" 2>&1 || { tail -20 "$LOG/llama_server_cmake.log"; done_with 6; }
echo "configured at $(($(date +%s) - T0)) s; building llama-server with -j$JOBS"
# bounded: the driver's call is 10 minutes; a build still running at 480 s is of no use to it
# GPU_SERVE_TARGETS: llama-server, plus llama-bench for tools/gpu_run.d/llama-bench.sh (same libraries)
# shellcheck disable=SC2086 # GPU_SERVE_TARGETS is a list of targets
timeout 480 nice -n 10 cmake --build "$DIR/b" --target ${GPU_SERVE_TARGETS:-llama-server llama-bench} -j "$JOBS" \
    >"$LOG/llama_server_build.log" 2>&1
rc=$?
tail -1 "$LOG/llama_server_build.log"
[ $rc -eq 0 ] && "$DIR/b/bin/llama-server" --version 2>&1 | head -2
done_with $rc
