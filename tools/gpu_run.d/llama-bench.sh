#!/usr/bin/env bash
# llama-bench LOGDIR: llama.cpp's llama-bench (CUDA, flash attention, all layers on the GPU) on the
# 8B GGUFs of LB_FORMATS (default "q4_k_m f16"; q3_<kind> is the Qwen3-8B-shaped file): decode 128
# tokens and prefill 512 and 4096, the shapes of hearth bench -p 512 -n 128 and -p 4096, in the same
# device call as hearth's rows (the ratio's other half).
# Uses the llama-bench that gpu-serve.pre.sh builds beside llama-server (waits for DIR/.done).
# A part of tools/gpu_run (env: G8). LB_BUDGET (s, default 90).
set -u
L=${1:?usage: llama-bench.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
BUDGET=${LB_BUDGET:-90}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
DIR=${LLAMA_SERVER_DIR:-/tmp/llamacpp-server}
# the build (gpu-serve.pre.sh, started with the call) may take most of the budget: wait while a
# row still fits after it (~60 s for one GGUF's three shapes)
while [ ! -f "$DIR/.done" ] && [ "$(left)" -gt 60 ]; do sleep 1; done
[ -x "$DIR/b/bin/llama-bench" ] || { echo "llama-bench: NOT RUN (not built: $(cat "$DIR/.done" 2>/dev/null))"; exit 0; }
for k in ${LB_FORMATS:-q4_k_m f16}; do
    case $k in q3_*) f=$G8/qwen3-8b-${k#q3_}.gguf ;; *) f=$G8/llama8b-$k.gguf ;; esac
    [ -f "$f" ] || { echo "$k: NOT RUN (no model)"; continue; }
    [ "$(left)" -lt 15 ] && { echo "$k: NOT RUN ($(left) s left)"; continue; }
    timeout $(($(left) - 3)) "$DIR/b/bin/llama-bench" -m "$f" -p "${LB_PROMPTS:-512,4096}" -n 128 -fa 1 -ngl 99 -r 2 -o json \
        >"$L/llama_bench_$k.json" 2>"$L/llama_bench_$k.log"
    echo "$k: rc $?"
    python3 - "$L/llama_bench_$k.json" "$k" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"  {sys.argv[2]}: no result ({e})")
for r in rows:
    kind = "decode" if r.get("n_gen") else "prefill"
    print(f"  {sys.argv[2]} {kind} {r.get('n_prompt') or r.get('n_gen')}: {r['avg_ts']:.1f} tok/s")
PY
done
