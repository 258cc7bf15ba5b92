#!/usr/bin/env bash
# gpu-serve.sh LOGDIR: the GPU half of bench/serve_load (issue 6), a part of tools/gpu_run
# (budget 300 s, run last). Waits (bounded) for the 8B GGUFs ($G8/.done), then runs
# bench/serve_load/gpu_load.py (it starts llama-server once gpu-serve.pre.sh's build is done):
# hearth serve --device cuda and llama-server on the same F16 and Q4_K_M files, N = 1, 8, 32,
# 64, 128 concurrent streams of 512-token prompts (400 shared) and 128-token answers. Writes LOGDIR/serve_load_gpu.md
# (tables, then the full result as json; copy it to bench/results/) and the servers' logs; prints a short table last.
# Env (set by the driver): H (hearth binary), G8 (GGUF folder). Optional: GPU_SERVE_BUDGET (s,
# default 290), GPU_SERVE_N (default 1,8,32,64,128), GPU_SERVE_FORMATS (default "f16 q4_k_m"),
# GPU_SERVE_SERVERS (default hearth,llama.cpp; "hearth" skips llama.cpp), GPU_SERVE_DEVICE (cuda;
# cpu for a dry run), GPU_SERVE_AB (hearth's other step budgets tried with the time left, default
# 1024,2048; empty: none), GPU_SERVE_ARGS (more gpu_load.py flags), GPU_SERVE_ENV (VAR=value ...
# for both servers), LLAMA_SERVER_DIR.
set -u
L=${1:?usage: gpu-serve.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
BUDGET=${GPU_SERVE_BUDGET:-290}
DIR=${LLAMA_SERVER_DIR:-/tmp/llamacpp-server}
SERVERS=${GPU_SERVE_SERVERS:-hearth,llama.cpp}
: "${H:?H (the hearth binary) is not set}" "${G8:?G8 (the GGUF folder) is not set}"

# a bounded wait for the models (written in the background by the driver)
for _ in $(seq 1 120); do [ -f "$G8/.done" ] && break; sleep 1; done
[ -f "$G8/.done" ] || echo "gpu-serve: $G8/.done not there after 120 s; using what exists"
# llama-server: its build (gpu-serve.pre.sh) may still run; gpu_load.py runs hearth's levels
# meanwhile and llama-server's once DIR/.done says the build ended well
LS=()
case $SERVERS in *llama*) LS=(--llama-server "$DIR/b/bin/llama-server" --llama-ready "$DIR/.done") ;; esac
MODELS=()
for k in ${GPU_SERVE_FORMATS:-f16 q4_k_m}; do
    if [ -f "$G8/llama8b-$k.gguf" ]; then MODELS+=(--model "$k=$G8/llama8b-$k.gguf"); else echo "gpu-serve: no $G8/llama8b-$k.gguf"; fi
done
[ ${#MODELS[@]} -gt 0 ] || { echo "gpu-serve: FAIL: no GGUF to serve"; exit 1; }
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader >"$L/gpu_before.txt" 2>&1

LEFT=$((BUDGET - ($(date +%s) - T0)))
# gpu_load.py stops at its own budget; the timeout is the backstop (results are rewritten after
# every level, so a kill still leaves the table of the levels done)
# shellcheck disable=SC2086 # GPU_SERVE_ENV and GPU_SERVE_ARGS are word lists
env ${GPU_SERVE_ENV:-} timeout -k 5 $((LEFT + 5)) python3 bench/serve_load/gpu_load.py --hearth "$H" ${LS[@]+"${LS[@]}"} "${MODELS[@]}" \
    --servers "$SERVERS" --device "${GPU_SERVE_DEVICE:-cuda}" --n "${GPU_SERVE_N:-1,8,32,64,128}" \
    --ab-step-tokens "${GPU_SERVE_AB-1024,2048}" --budget $((LEFT - 5)) --out "$L/serve_load_gpu" --logs "$L/logs" ${GPU_SERVE_ARGS:-} >"$L/gpu_load.log" 2>&1
rc=$?
echo "gpu_load.py rc $rc after $(($(date +%s) - T0)) s (log: gpu_load.log); llama-server build: $(
    [ -f "$DIR/.done" ] && echo "rc, seconds: $(cat "$DIR/.done")" || echo "not finished"; tail -1 "$L/llama_server_build.log" 2>/dev/null | cut -c1-80)"
[ $rc -ne 0 ] && grep -E "Error|error|Traceback" "$L/gpu_load.log" | head -3
python3 - "$L/serve_load_gpu.md" <<'PY'
import sys
sys.path.insert(0, "bench")
import results_file
try:
    r = results_file.read(sys.argv[1])
except (OSError, ValueError) as e:
    sys.exit(f"no results: {e}")
f = lambda x, nd=0: "-" if x is None else f"{x:.{nd}f}"
for fmt, by in r["levels"].items():
    h, l = by.get("hearth", {}), by.get("llama.cpp", {})
    for n in r["n"]:
        a, b = h.get(str(n)) or {}, l.get(str(n)) or {}
        if not a and not b:
            continue
        def part(x):
            if "skipped" in x: return "skipped"
            if not x: return "not run"
            err = f" ERR {x['errors']}: {(x['error_samples'] or [''])[0][:60]}" if x.get("errors") else ""
            return f"{f(x.get('aggregate_tps'), 1)} tok/s p50 {f(x.get('ttft_p50_ms'))} p95 {f(x.get('ttft_p95_ms'))} ms{err}"
        ra, rb = a.get("aggregate_tps"), b.get("aggregate_tps")
        print(f"{fmt} N={n}: hearth {part(a)} | llama {part(b)} | x{f(ra / rb, 2) if ra and rb else '-'}")
for k, v in r["servers"].items():
    if v.get("failed"): print(f"FAILED {k}: {v['failed'][:150]}")
PY
