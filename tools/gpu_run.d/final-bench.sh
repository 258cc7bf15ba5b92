#!/usr/bin/env bash
# final-bench: issue #5's table rows in one call: the two ceilings (bench/cuda/roofline.py:
# torch copy bandwidth and bf16 GEMM rate), then hearth bench on the 8B shapes: bf16 and
# Q4_K_M prefill at 4096 tokens, bf16 and Q8_0 decode (128 after 512). Rows print as they
# finish; every JSON stays in LOGDIR. FB_ROWS picks rows (also q4km_decode, f16_decode, f16_p4096 (the
# F16 GGUF), m4_*, q3m4_*,
# bf16_decode_kvf16, bf16_decode_2k[_kvf16], q3_<f16|q4_k_m|q8_0>_<decode|p4096>, q8_0_p4096). Env from tools/gpu_run. Usage: final-bench.sh LOGDIR
L=${1:?usage: final-bench.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s); BUDGET=${FB_BUDGET:-60}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
timeout 25 python3 bench/cuda/roofline.py >"$L"/roofline.json 2>"$L"/roofline.log
echo "roofline: $(cat "$L"/roofline.json)"
TF=$(python3 -c "import json; print(json.load(open('$L/roofline.json'))['bf16_gemm_tflops'])" 2>/dev/null || echo 743)
row() { # name model args...
    local n=$1 m=$2; shift 2
    [ "$(left)" -lt 12 ] && { echo "$n: NOT RUN (time)"; return; }
    timeout $(($(left) - 3)) "$H" bench "$m" --device cuda "$@" --json >"$L"/"$n".json 2>"$L"/"$n".log
    python3 - "$L"/"$n".json "$TF" "$@" <<'PY'
import json, sys
try:
    j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception as e:
    print(sys.argv[1].split('/')[-1], "no result"); sys.exit()
import os
tf, T = float(sys.argv[2]), j["prompt_tokens"]
# matmul FLOPs without the embedding table, plus causal attention (4 * layers * heads * head_dim * T^2 / 2)
params, vocab, layers = (8.19e9, 151936, 36) if os.environ.get("QWEN") else (8.03e9, 128256, 32)
fl = 2 * (params - vocab * 4096) * T + 4 * layers * 32 * 128 * T * T / 2
print("%s: prefill %.0f tok/s (%.3f of %.0f TFLOP/s), decode %.1f tok/s (%.3f of roofline)" % (
    sys.argv[1].split('/')[-1][:-5], j["prefill_tps"], fl / (T / j["prefill_tps"]) / (tf * 1e12), tf, j["decode_tps"], j["roofline_fraction"]))
PY
}
# wait (bounded) for the GGUFs, and for the bf16 folder only when a row reads it
need_l8=0
case " ${FB_ROWS:-bf16_p4096} " in *" bf16_"*) need_l8=1 ;; esac
for _ in $(seq 1 60); do [ -f "$G8"/.done ] && { [ $need_l8 = 0 ] || [ -f "$L8"/.done ]; } && break; sleep 1; done
# FB_ROWS: which rows, in order (default: bf16 and Q4_K_M prefill-4096, bf16 and Q8_0 decode)
for r in ${FB_ROWS:-bf16_p4096 q4km_p4096 bf16_decode q8_0_decode}; do
  case $r in
    bf16_p4096) row "$r" "$L8" -p 4096 -n 1 -r 3 ;;
    bf16_decode) row "$r" "$L8" -p 512 -n 128 -r 3 ;;
    bf16_decode_kvf16) row "$r" "$L8" -p 512 -n 128 -r 3 --kv-quant f16 ;;
    bf16_decode_2k) row "$r" "$L8" -p 2048 -n 128 -r 2 ;;
    bf16_decode_2k_kvf16) row "$r" "$L8" -p 2048 -n 128 -r 2 --kv-quant f16 ;;
    q4km_p4096) row "$r" "$G8"/llama8b-q4_k_m.gguf -p 4096 -n 1 -r 3 ;;
    q4km_decode) row "$r" "$G8"/llama8b-q4_k_m.gguf -p 512 -n 128 -r 3 ;;
    q8_0_decode) row "$r" "$G8"/llama8b-q8_0.gguf -p 512 -n 128 -r 3 ;;
    q8_0_p4096) row "$r" "$G8"/llama8b-q8_0.gguf -p 4096 -n 1 -r 3 ;;
    f16_decode) row "$r" "$G8"/llama8b-f16.gguf -p 512 -n 128 -r 3 ;;
    f16_p4096) row "$r" "$G8"/llama8b-f16.gguf -p 4096 -n 1 -r 3 ;;
    m4_decode) [ -f "$M4"/.done ] && row "$r" "$M4" -p 512 -n 128 -r 3 || echo "$r: NOT RUN (no model)" ;;
    m4_p4096) [ -f "$M4"/.done ] && row "$r" "$M4" -p 4096 -n 1 -r 3 || echo "$r: NOT RUN (no model)" ;;
    q3m4_decode) [ -f "$Q3M4"/.done ] && QWEN=1 row "$r" "$Q3M4" -p 512 -n 128 -r 3 || echo "$r: NOT RUN (no model)" ;;
    q3m4_p4096) [ -f "$Q3M4"/.done ] && QWEN=1 row "$r" "$Q3M4" -p 4096 -n 1 -r 3 || echo "$r: NOT RUN (no model)" ;;
    q3_*_decode | q3_*_p4096) # Qwen3-8B-shaped GGUFs (GR_MODELS q3_f16, q3_q4_k_m, q3_q8_0)
        f=${r#q3_}; f=${f%_*}; g=$G8/qwen3-8b-$f.gguf
        if [ ! -f "$g" ]; then echo "$r: NOT RUN (no model)"
        elif [ "${r##*_}" = decode ]; then QWEN=1 row "$r" "$g" -p 512 -n 128 -r 3
        else QWEN=1 row "$r" "$g" -p 4096 -n 1 -r 3; fi ;;
    *) echo "$r: unknown row" ;;
  esac
done
