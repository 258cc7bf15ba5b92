#!/usr/bin/env bash
# gpu-fit: hearth fit --device cuda against the device memory of a real `hearth serve
# --device cuda` (tools/cuda_fit_check): tiny models of several formats first, then the 8B
# bf16 / Q4_K_M / MLX 4-bit models (waited for while the budget allows) at several
# contexts. Budget 70 s. Usage: gpu-fit.sh LOGDIR (the driver exports H, TINY, L8, G8, M4).
L=$1; mkdir -p "$L"
start=$(date +%s)
export HEARTH_CACHE=$L/cache FIT_WAIT_DONE="$L8:$G8:$M4"  # this round's evals DB; folders with .done
timeout -k 3 66 python3 tools/cuda_fit_check "$H" "$L" 62 \
  "$TINY/llama-bf16:512,4096" "$TINY/qwen3-q4g64:512" "$TINY/gemma3-q8g32:512" "$TINY/llama-f32:4096" \
  "$L8:512" "$G8/llama8b-q4_k_m.gguf:4096" "$L8:32768" "$M4:4096" >"$L/cuda_fit_check.log" 2>&1
echo "cuda_fit_check rc $? ($(( $(date +%s) - start )) s; rows in $L/cuda_fit_check.json, evals in $L/cache)"
grep -E '^allocator probe' "$L/cuda_fit_check.log" | cut -c1-300
grep -E '^\| (llama|qwen|gemma|Meta|mlx|model)|^\| [^|]+ \| [0-9]+ \|' "$L/cuda_fit_check.log" | head -10
grep -E '^worst|^FIT-CUDA' "$L/cuda_fit_check.log"
