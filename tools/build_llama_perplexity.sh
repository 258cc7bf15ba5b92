#!/usr/bin/env bash
# build_llama_perplexity.sh: llama.cpp's llama-perplexity (tools/perplexity) compiled against the
# shared libraries the pinned llama-cpp-python sdist build left in the bench cache
# (bench/cpu_vs_llamacpp: $HEARTH_CACHE/bench/llamacpp/lib): two C++ files, no llama.cpp rebuild.
# Prints the binary's path; idempotent. The oracle of tests/parity/test_perplexity_llamacpp.py.
set -euo pipefail
CACHE="${HEARTH_CACHE:-$HOME/.cache/hearth}"
LLAMA="$CACHE/bench/llamacpp"
SRC="$LLAMA/llama_cpp_python-0.3.36/vendor/llama.cpp"
LIB="$LLAMA/lib"
OUT="$LLAMA/build-perplexity"
BIN="$OUT/llama-perplexity"
[ -x "$BIN" ] && { echo "$BIN"; exit 0; }
[ -d "$SRC/tools/perplexity" ] && [ -f "$LIB/libllama.so" ] ||
  { echo "build_llama_perplexity: no llama.cpp build in $LLAMA (run bench/cpu_vs_llamacpp first)" >&2; exit 1; }
mkdir -p "$OUT"
INC=(-I"$SRC/include" -I"$SRC/common" -I"$SRC/ggml/include" -I"$SRC/vendor" -I"$SRC/tools/perplexity")
for f in perplexity main; do
  [ -f "$OUT/$f.o" ] || g++ -O2 -std=c++17 "${INC[@]}" -c "$SRC/tools/perplexity/$f.cpp" -o "$OUT/$f.o.part"
  [ -f "$OUT/$f.o" ] || mv "$OUT/$f.o.part" "$OUT/$f.o"
done
g++ "$OUT/perplexity.o" "$OUT/main.o" -o "$BIN.part" -L"$LIB" -Wl,-rpath,"$LIB" -Wl,-rpath-link,"$LIB" \
  -lllama-common -lllama -lggml -lggml-base -lpthread
mv "$BIN.part" "$BIN"
echo "$BIN"
