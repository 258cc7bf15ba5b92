#!/usr/bin/env bash
# lab-bench.sh LOGDIR: the sampling lab's /generate batch benchmark on the GPU, a part of
# tools/gpu_run: bench/lab/generate_batch.py against `hearth serve --device cuda` on the
# random-weight Llama-3.1-8B-shaped F16 GGUF (run with GR_MODELS=f16), n = 8 in one request
# against 8 sequential requests. Writes LOGDIR/lab_generate.md (tables, then the full result as
# json: bench/results_file.py) and, when $OUT is set, copies it there (copy it to bench/results/).
# Env (set by the driver): H (hearth binary), G8 (GGUF folder). Optional: LAB_FORMAT (f16),
# LAB_MAX_TOKENS (64), LAB_ROUNDS (3).
set -u
L=${1:?usage: lab-bench.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
: "${H:?H (the hearth binary) is not set}" "${G8:?G8 (the GGUF folder) is not set}"
M=$G8/llama8b-${LAB_FORMAT:-f16}.gguf
for _ in $(seq 1 200); do [ -f "$G8/.done" ] && break; sleep 1; done
[ -f "$M" ] || { echo "lab-bench: FAIL: no $M"; exit 1; }
# the stand-in GGUFs carry no chat template: the prompt goes in as it is
# --no-ceiling: the engine's batch 8 / batch 1 ratio needs a second hearth process with the model
# while the server holds the device memory (its default KV pool takes what is free): it fails
python3 bench/lab/generate_batch.py --bin "$H" --model "$M" --device cuda --threads 16 --no-ceiling \
    --max-tokens "${LAB_MAX_TOKENS:-64}" --rounds "${LAB_ROUNDS:-3}" --out "$L" \
    --chat-template "{% for m in messages %}{{ m['content'] }}{% endfor %}" 2>&1 | tee "$L/bench.log"
[ -n "${OUT:-}" ] && cp "$L"/lab_generate.md "$OUT"/ 2>/dev/null
cat "$L/lab_generate.md" 2>/dev/null
