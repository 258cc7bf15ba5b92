#!/usr/bin/env bash
# kv-default: the default KV pool on the GPU (every sequence's context, cut to fit the device's
# free memory less max(1 GiB, 5%)). test_kv_default (the plan rules), `hearth fit --device cuda`
# of the tiny model and of the 8B bf16 at 8 sequences (no cut expected) and at 64 x 32768
# (a cut), then `hearth serve --device cuda` of the 8B with the defaults: the pool /stats
# reports must be the one fit predicted, and a request must answer. Usage: kv-default.sh LOGDIR
L=${1:?usage: kv-default.sh LOGDIR}
mkdir -p "$L"
: "${H:?H must be set by tools/gpu_run}" "${B:?}" "${TINY:?}" "${L8:?}"
HEARTH_CACHE="$(dirname "$TINY")" timeout 30 "$B"/tests/test_kv_default >"$L"/test_kv_default.log 2>&1
echo "test_kv_default rc $?: $(tail -1 "$L"/test_kv_default.log)"
fitline() { python3 -c 'import json,sys; r=json.load(sys.stdin); print("kv_blocks", r.get("kv_blocks"), "cut_from", r.get("kv_blocks_cut_from"), "kv_pool MiB %.0f" % (r["kv_pool_bytes"]/2**20), "peak MiB %.0f" % (r["predicted_peak_bytes"]/2**20), "available MiB %.0f" % (r["available_bytes"]/2**20), "fits", r["fits"])'; }
echo "fit tiny llama-f32 --batch 8: $($H fit "$TINY"/llama-f32 --device cuda --batch 8 --json 2>"$L"/fit1.err | fitline)"
for _ in $(seq 120); do [ -f "$L8"/.done ] && break; sleep 2; done
[ -f "$L8"/.done ] || { echo "8B bf16 not written in time: the 8B checks NOT RUN"; exit 0; }
echo "fit 8B bf16 --batch 8: $($H fit "$L8" --device cuda --batch 8 --json 2>"$L"/fit2.err | fitline)"
echo "fit 8B bf16 --batch 64 --ctx 32768: $($H fit "$L8" --device cuda --batch 64 --ctx 32768 --json 2>"$L"/fit3.err | fitline)"
$H fit "$L8" --device cuda --batch 8 --json >"$L"/fit_serve.json 2>/dev/null
port=18777
$H serve --model "$L8" --device cuda --port $port >"$L"/serve.log 2>&1 &
pid=$!
for _ in $(seq 240); do curl -s localhost:$port/health >/dev/null && break; sleep 0.5; done
curl -s localhost:$port/stats >"$L"/stats.json
echo "serve 8B defaults: stats kv_blocks $(python3 -c 'import json; print(json.load(open("'"$L"/stats.json'"))["kv_blocks"]["total"])' 2>&1) vs fit $(python3 -c 'import json; print(json.load(open("'"$L"/fit_serve.json'"))["kv_blocks"])' 2>&1)"
curl -s localhost:$port/v1/completions -H 'Content-Type: application/json' -d '{"prompt":"Hello","max_tokens":8}' | head -c 300; echo
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
echo "serve host VmHWM MiB $(($(grep VmHWM /proc/$pid/status | awk '{print $2}') / 1024)) vs fit host predicted MiB $(python3 -c 'import json; print(json.load(open("'"$L"/fit_serve.json'"))["host"]["predicted_peak_bytes"] >> 20)' 2>&1)"
grep -i 'kv\|error' "$L"/serve.log | head -5
kill $pid; wait $pid 2>/dev/null
