#!/usr/bin/env bash
# gpu-fit: hearth fit --device cuda against the device memory of a real `hearth serve
# --device cuda` (tools/cuda_fit_check): tiny models of several formats first, then the 8B
# bf16 / Q4_K_M / MLX 4-bit models (waited for while the budget allows) at several
# contexts. FIT_NEWFAM (e.g. "qwen35_9b gemma4_e4b qwen3_30b_a3b"): the new families too, as
# their tiny models and, for each name, the real-shape MLX 4-bit model of tools/gpu_models.py
# (written here first; the 8B cases then run only where the budget is left). Budget FIT_BUDGET
# (s, 70). Usage: gpu-fit.sh LOGDIR (the driver exports H, TINY, L8, G8, M4).
L=$1; mkdir -p "$L"
start=$(date +%s)
budget=${FIT_BUDGET:-70}
export HEARTH_CACHE=$L/cache FIT_WAIT_DONE="$L8:$G8:$M4"  # this round's evals DB; folders with .done
cases=()
if [ -n "${FIT_NEWFAM:-}" ]; then
  cases+=("$TINY/qwen3_5-q4g64:512" "$TINY/qwen3_5_moe-q4g64:512" "$TINY/gemma4-q4g64:512,4096"
          "$TINY/gemma4_moe-q4g64:512" "$TINY/qwen3_moe-q4g64:512")
  for m in $FIT_NEWFAM; do
    d=/tmp/fit_newfam/$m
    rm -rf "$d"
    if python3 tools/gpu_models.py "$m" mlx "$d" >"$L/write_$m.log" 2>&1; then cases+=("$d:4096"); else
      echo "$m: write FAILED: $(tail -1 "$L/write_$m.log")"; fi
  done
fi
cases+=("$TINY/llama-bf16:512,4096" "$TINY/qwen3-q4g64:512" "$TINY/gemma3-q8g32:512" "$TINY/llama-f32:4096"
        "$L8:512" "$G8/llama8b-q4_k_m.gguf:4096" "$L8:32768" "$M4:4096")
left=$((budget - ($(date +%s) - start)))
timeout -k 3 $((left - 4)) python3 tools/cuda_fit_check "$H" "$L" $((left - 8)) "${cases[@]}" >"$L/cuda_fit_check.log" 2>&1
echo "cuda_fit_check rc $? ($(( $(date +%s) - start )) s; rows in $L/cuda_fit_check.json, evals in $L/cache)"
rm -rf /tmp/fit_newfam
grep -E '^allocator probe' "$L/cuda_fit_check.log" | cut -c1-300
grep -E '^\| (llama|qwen|gemma|Meta|mlx|model)|^\| [^|]+ \| [0-9]+ \|' "$L/cuda_fit_check.log" | head -24
grep -E '^worst|^FIT-CUDA' "$L/cuda_fit_check.log"
