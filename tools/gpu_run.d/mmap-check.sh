#!/usr/bin/env bash
# mmap-check LOGDIR: the host side of a CUDA engine's load with the weights mapped from the
# file (the default) against --no-mmap (every weight copied into the engine first): peak
# resident memory of the process (getrusage of the child) and wall time of `hearth bench
# --device cuda -p 512 -n 16 -r 1` on the 8B bf16 model (l8) and any GGUF named in
# MC_MODELS (paths), modes alternating, MC_ROUNDS rounds (default 2); then hearth fit's host
# prediction for the same model in both modes beside it.
# Usage: mmap-check.sh LOGDIR   Env from tools/gpu_run (H, L8).
L=${1:?usage: mmap-check.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
for _ in $(seq 1 300); do [ -f "$L8"/.done ] && break; sleep 1; done
models=()
[ -f "$L8"/.done ] && models+=("$L8")
for m in ${MC_MODELS:-}; do [ -e "$m" ] && models+=("$m"); done
[ ${#models[@]} -gt 0 ] || { echo "mmap-check: NOT RUN (no model: l8 not written, MC_MODELS empty)"; exit 0; }
for m in "${models[@]}"; do
  for r in $(seq 1 "${MC_ROUNDS:-2}"); do
    for mode in mapped copied; do
      flag=; [ $mode = copied ] && flag=--no-mmap
      python3 - "$H" "$m" "$mode" "$r" $flag >>"$L/rows.txt" 2>>"$L/err.txt" <<'PY'
import resource, subprocess, sys, time
h, m, mode, r = sys.argv[1:5]
cmd = [h, "bench", m, "--device", "cuda", "-p", "512", "-n", "16", "-r", "1"] + sys.argv[5:]
t0 = time.monotonic()
p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
wall = time.monotonic() - t0
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 / 1024
print(f"| {m.rsplit('/', 1)[-1]} | {mode} | {r} | {p.returncode} | {rss:.2f} | {wall:.1f} |", flush=True)
if p.returncode:
    sys.stderr.write(p.stderr[-2000:])
PY
    done
  done
  for mode in mapped copied; do
    flag=; [ $mode = copied ] && flag=--no-mmap
    # shellcheck disable=SC2086 # flag is empty or one word
    "$H" fit "$m" --device cuda --json $flag >"$L/fit_$mode.json" 2>>"$L/err.txt"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); h=d.get('host', {}); print('fit', sys.argv[2], sys.argv[3], {k: h[k] for k in h if 'bytes' in k or 'mapped' in k})" \
      "$L/fit_$mode.json" "${m##*/}" $mode 2>&1 | cut -c1-400
  done
done
echo "| model | mode | round | rc | peak RSS GiB | wall s |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
cat "$L/rows.txt"
tail -n 5 "$L/err.txt" 2>/dev/null
