#!/usr/bin/env bash
# final-bench: issue #5's table rows in one call: the two ceilings (bench/cuda/roofline.py:
# torch copy bandwidth and bf16 GEMM rate), then hearth bench on the 8B shapes: bf16 and
# Q4_K_M prefill at 4096 tokens, bf16 and Q8_0 decode (128 after 512). Rows print as they
# finish; every JSON stays in LOGDIR. Env from tools/gpu_round. Usage: final-bench.sh LOGDIR
L=${1:?usage: final-bench.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${FB_BUDGET:-60}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
timeout 25 python3 bench/cuda/roofline.py >$L/roofline.json 2>$L/roofline.log
echo "roofline: $(cat $L/roofline.json)"
TF=$(python3 -c "import json; print(json.load(open('$L/roofline.json'))['bf16_gemm_tflops'])" 2>/dev/null || echo 743)
row() { # name model args...
    local n=$1 m=$2; shift 2
    [ $(left) -lt 12 ] && { echo "$n: NOT RUN (time)"; return; }
    timeout $(($(left) - 3)) $H bench $m --device cuda "$@" --json >$L/$n.json 2>$L/$n.log
    python3 - $L/$n.json $TF "$@" <<'PY'
import json, sys
try:
    j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception as e:
    print(sys.argv[1].split('/')[-1], "no result"); sys.exit()
tf, T = float(sys.argv[2]), j["prompt_tokens"]
fl = 2 * (8.03e9 - 128256 * 4096) * T + 4 * 32 * 32 * 128 * T * T / 2
print("%s: prefill %.0f tok/s (%.3f of %.0f TFLOP/s), decode %.1f tok/s (%.3f of roofline)" % (
    sys.argv[1].split('/')[-1][:-5], j["prefill_tps"], fl / (T / j["prefill_tps"]) / (tf * 1e12), tf, j["decode_tps"], j["roofline_fraction"]))
PY
}
for i in $(seq 1 60); do [ -f $G8/.done ] && [ -f $L8/.done ] && break; sleep 1; done
row bf16_p4096 $L8 -p 4096 -n 1 -r 2
row q4km_p4096 $G8/llama8b-q4_k_m.gguf -p 4096 -n 1 -r 1
row bf16_decode $L8 -p 512 -n 128 -r 3
row q8_0_decode $G8/llama8b-q8_0.gguf -p 512 -n 128 -r 3
