#!/usr/bin/env bash
# serve-ab LOGDIR: hearth-only A/B runs of bench/serve_load/gpu_load.py on the 8B GGUFs, one
# server per variant, same prompts and levels: which hearth serve flags or environment move
# aggregate tok/s and TTFT (e.g. --kv-quant f16 against the float32 KV default). A part of
# tools/gpu_run (env: H, G8). Variants: SA_VARIANTS, space-separated NAME=SPEC[@FORMATS[@N]]
# where SPEC is comma-separated hearth serve arguments and VAR:value environment settings, "-"
# for none, FORMATS comma-separated GGUF kinds (default SA_FORMATS) and N the levels
# (default SA_N) (default "f32kv=- f16kv=--kv-quant,f16"); SA_FORMATS (default f16), SA_N (default 64,128),
# SA_BUDGET (s, default 150), SA_DEVICE (cuda; cpu for a dry run). Prints one line per (format, N, variant) last.
set -u
L=${1:?usage: serve-ab.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
BUDGET=${SA_BUDGET:-150}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
: "${H:?H (the hearth binary) is not set}" "${G8:?G8 (the GGUF folder) is not set}"
for _ in $(seq 1 120); do [ -f "$G8/.done" ] && break; sleep 1; done
read -ra VARIANTS <<<"${SA_VARIANTS:-f32kv=- f16kv=--kv-quant,f16}"
nv=${#VARIANTS[@]}
i=0
for v in "${VARIANTS[@]}"; do
    name=${v%%=*} rest=${v#*=}
    spec=${rest%%@*} fmts=${SA_FORMATS:-f16} levels=${SA_N:-64,128}
    case $rest in *@*) r2=${rest#*@}; fmts=${r2%%@*}; case $r2 in *@*) levels=${r2#*@} ;; esac ;; esac
    args=() envs=()
    if [ "$spec" != "-" ]; then
        IFS=, read -ra parts <<<"$spec"
        for p in "${parts[@]}"; do
            case $p in *:*) envs+=("${p%%:*}=${p#*:}") ;; *) args+=("--hearth-arg=$p") ;; esac
        done
    fi
    models=()
    for f in ${fmts//,/ }; do [ -f "$G8/llama8b-$f.gguf" ] && models+=(--model "$f=$G8/llama8b-$f.gguf"); done
    # an equal share of what is left for each remaining variant
    share=$(($(left) / (nv - i)))
    i=$((i + 1))
    [ "$share" -lt 25 ] && { echo "$name: NOT RUN ($(left) s left)"; continue; }
    env "${envs[@]}" timeout $((share + 5)) python3 bench/serve_load/gpu_load.py --hearth "$H" "${models[@]}" \
        --servers hearth --device "${SA_DEVICE:-cuda}" --n "$levels" --budget $((share - 3)) "${args[@]}" \
        --out "$L/serve_$name" --logs "$L/logs_$name" >"$L/serve_$name.log" 2>&1
    python3 - "$L/serve_$name.json" "$name" "$spec" <<'PY' || echo "$name: no result (see serve_$name.log)"
import json, sys
r = json.load(open(sys.argv[1]))
for fmt, by in r["levels"].items():
    for n, x in sorted(by.get("hearth", {}).items(), key=lambda kv: int(kv[0])):
        if "aggregate_tps" in x:
            print(f"{fmt} N={n} {sys.argv[2]} ({sys.argv[3]}): {x['aggregate_tps']:.1f} tok/s, TTFT p50 "
                  f"{x['ttft_p50_ms']:.0f} p95 {x['ttft_p95_ms']:.0f} ms, errors {x['errors']}")
        else:
            print(f"{fmt} N={n} {sys.argv[2]}: {x.get('skipped', 'not run')}")
PY
done
