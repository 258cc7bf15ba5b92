#!/usr/bin/env bash
# decode-ab: which of round 5's decode changes pays, on the 8B Q8_0 GGUF and bf16 (issue
# #5): `hearth bench -p 512 -n 128 -r 3` with both on (default), PDL off, fused
# quantize/rope off, both off; then bf16 default vs both off; then tiny-model greedy
# parity CUDA (f32 GEMM) vs the scalar CPU tier. Env from tools/gpu_round. Usage: LOGDIR
L=${1:?usage: decode-ab.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${DA_BUDGET:-110}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
tps() { python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('%.1f tok/s %.3f' % (j['decode_tps'], j['roofline_fraction']))" $1 2>/dev/null || echo "no result"; }
for i in $(seq 1 90); do [ -f $G8/.done ] && [ -f $L8/.done ] && break; sleep 1; done
for m in q8_0:$G8/llama8b-q8_0.gguf bf16:$L8; do
  n=${m%%:*}; f=${m#*:}
  for cfg in "default:" "pdl0:HEARTH_CUDA_PDL=0" "fused0:HEARTH_CUDA_FUSED=0" "both0:HEARTH_CUDA_PDL=0 HEARTH_CUDA_FUSED=0"; do
    c=${cfg%%:*}; e=${cfg#*:}
    [ $n = bf16 ] && [ $c != default ] && [ $c != both0 ] && continue
    [ $(left) -lt 20 ] && { echo "$n $c: NOT RUN (time)"; continue; }
    env $e timeout $(( $(left) - 5 )) $H bench $f --device cuda -p 512 -n 128 -r 3 --json >$L/${n}_$c.json 2>$L/${n}_$c.log
    echo "$n $c: $(tps $L/${n}_$c.json)"
  done
done
IDS=$(python3 -c "import random; random.seed(5); print(str([random.randrange(1,600) for _ in range(40)]).replace(' ',''))")
ok=0 bad=""
for n in llama-bf16 qwen3-bf16 gemma3-bf16 qwen3-q4g64 gemma3-q8g32 llama-f32; do
  [ $(left) -lt 6 ] && break
  HEARTH_CPU=scalar timeout 20 $H trace $TINY/$n --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cpu >$L/p_${n}_cpu.json 2>>$L/parity.log
  HEARTH_CUDA_GEMM=f32 timeout 20 $H trace $TINY/$n --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cuda >$L/p_${n}_cuda.json 2>>$L/parity.log
  r=$(python3 tools/cuda_check_parity.py $L/p_${n}_cpu.json $L/p_${n}_cuda.json 2>&1); echo "$n $r" >>$L/parity.log
  case "$r" in *'"greedy_identical": true'*) ok=$((ok+1)) ;; *) bad="$bad $n" ;; esac
done
echo "tiny greedy CUDA(f32 gemm)==CPU scalar: $ok identical; differ:${bad:- none}"
