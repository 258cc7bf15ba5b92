#!/usr/bin/env bash
# ab LOGDIR: 8B decode rows (`hearth bench -p 512 -n 128 -r 3`, batch 1) under several
# environments, in the order given, so an A/B pair runs back to back on the same model.
# AB_ROWS: space-separated "label=model[,VAR=value...]", model one of q4km q8 f16 (the Llama
# GGUFs), l8 (bf16 safetensors), m4 q3m4 (MLX 4-bit Llama / Qwen3), q3f16 q3q4km q3q8 (the
# Qwen3 GGUFs); a row whose model was not written prints NOT RUN. AB_BUDGET (s, default 150).
# Env from tools/gpu_round. Usage: ab.sh LOGDIR
L=${1:?usage: ab.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${AB_BUDGET:-150}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
tps() { python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('decode %.1f tok/s (%.3f of roofline), prefill %.0f tok/s' % (j['decode_tps'], j['roofline_fraction'], j['prefill_tps']))" $1 2>/dev/null || echo "no result"; }
path() {
  case $1 in
    q4km) echo $G8/llama8b-q4_k_m.gguf ;; q8) echo $G8/llama8b-q8_0.gguf ;; f16) echo $G8/llama8b-f16.gguf ;;
    l8) echo $L8 ;; m4) echo $M4 ;; q3m4) echo $Q3M4 ;;
    q3f16) echo $G8/qwen3-8b-f16.gguf ;; q3q4km) echo $G8/qwen3-8b-q4_k_m.gguf ;; q3q8) echo $G8/qwen3-8b-q8_0.gguf ;;
    *) echo /nonexistent ;;
  esac
}
ready() { case $1 in l8 | m4 | q3m4) [ -f $(path $1)/.done ] ;; *) [ -f $(path $1) ] ;; esac; }
for r in ${AB_ROWS:-}; do
  label=${r%%=*}; spec=${r#*=}; m=${spec%%,*}; envs=""
  [ "$spec" != "$m" ] && envs=$(echo ${spec#*,} | tr ',' ' ')
  for i in $(seq 1 60); do ready $m && break; [ $(left) -lt 30 ] && break; sleep 1; done
  ready $m || { echo "$label ($m $envs): NOT RUN (no model)"; continue; }
  [ $(left) -lt 25 ] && { echo "$label ($m $envs): NOT RUN (time)"; continue; }
  env $envs timeout $(( $(left) > 62 ? 60 : $(left) - 2 )) $H bench $(path $m) --device cuda -p 512 -n 128 -r 3 --json \
    >$L/$label.json 2>$L/$label.log
  echo "$label ($m ${envs:-default}): $(tps $L/$label.json)"
done
