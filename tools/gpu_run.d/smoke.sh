#!/usr/bin/env bash
# smoke: the driver's own check and the numbers the GPU fit model starts from: the CUDA
# unit tests, then `hearth serve --device cuda` on tiny models at two contexts with one
# request, the device memory the process holds (nvidia-smi) against `hearth fit`'s host
# report, and a bare-context probe (torch's, for scale). Usage: smoke.sh LOGDIR
L=$1; mkdir -p "$L"
timeout 60 "$B"/tests/test_cuda >"$L"/test_cuda.log 2>&1; echo "test_cuda rc $? $(grep -c 'OK \]' "$L"/test_cuda.log) ok"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader >"$L"/idle.txt; echo "idle: $(cat "$L"/idle.txt)"
port=18080
for m in llama-bf16 qwen3-q4g64 gemma3-q8g32; do
  for ctx in 512 8192; do
    $H serve --model "$TINY"/$m --device cuda --ctx $ctx --port $port >"$L"/serve_${m}_$ctx.log 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -s localhost:$port/health >/dev/null 2>&1 && break; sleep 0.1; done
    curl -s localhost:$port/v1/chat/completions -H 'Content-Type: application/json' \
      -d '{"messages":[{"role":"user","content":"hello there, how are you today my friend?"}],"max_tokens":16}' >"$L"/resp_${m}_$ctx.json
    st=$(curl -s localhost:$port/stats)
    used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$pid '$1==p{print $2}')
    fit=$($H fit "$TINY"/$m --ctx $ctx --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("predicted_peak_bytes"))')
    echo "$m ctx $ctx: device MiB $used, fit(host) $fit, stats $(echo "$st" | python3 -c 'import json,sys; d=json.load(sys.stdin); print({k:d.get(k) for k in ("peak_bytes","predicted_peak_bytes")})' 2>&1)"
    kill $pid; wait $pid 2>/dev/null
  done
done
python3 - <<'PY' 2>&1 | tail -2
import torch, subprocess, os
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
u = subprocess.run(["nvidia-smi","--query-compute-apps=pid,used_memory","--format=csv,noheader,nounits"],capture_output=True,text=True).stdout
print("torch bare context MiB:", [l for l in u.splitlines() if l.startswith(str(os.getpid()))])
PY
