#!/usr/bin/env bash
# gpu-sample.sh LOGDIR: the device sampler's part of a GPU round (budget 60 s): the kernel
# against the host sampler (test_cuda_sample), the serving-path pytest
# (tests/parity/test_cuda_sample.py), then decode tok/s on the 8B bf16 model with sampling
# (temperature 0.8, top-p 0.9): device sampler vs host sampler (--host-sampler).
# Env from tools/gpu_run: H (hearth), B (build dir), TINY, L8. Prints a short summary.
LOG=${1:?usage: gpu-sample.sh LOGDIR}
mkdir -p "$LOG"; rm -f "$LOG/why.txt"
cd "$(dirname "$0")/../.." || exit 1
BUDGET=${GS_BUDGET:-60} # the lead's budget for this part
left() { echo $((BUDGET - SECONDS)); }
sum=()
row() { sum+=("$(printf '%-34s %s' "$1" "$2")"); }

# 1. kernel vs host sampler (prints its input seed, the survivor-set sizes and chi-square)
if [ -x "$B/tests/test_cuda_sample" ]; then
    timeout 20 "$B/tests/test_cuda_sample" >"$LOG/test_cuda_sample.log" 2>&1
    rc=$?
    st=$(if grep -q "skipped" "$LOG/test_cuda_sample.log"; then echo "NOT RUN (skipped: no device)";
         elif [ $rc = 0 ] && grep -q "PASSED" "$LOG/test_cuda_sample.log"; then echo PASS; else echo "FAIL rc $rc"; fi)
    row "test_cuda_sample" "$st $(grep -o 'chi-square [0-9.]* over [0-9]* df' "$LOG/test_cuda_sample.log" | head -1)"
    [ "$st" = PASS ] || grep -E "differ|device .* host|FAILED|Error|error|skipped|assert" "$LOG/test_cuda_sample.log" | head -4 | sed 's/^/  /' >>"$LOG/why.txt"
else
    row "test_cuda_sample" "FAIL: $B/tests/test_cuda_sample not built"
fi

# 2. serve/generate with mixed sampling on the GPU (skips report as not run)
t=$(( $(left) - 22 )); [ $t -gt 28 ] && t=28
if [ $t -gt 5 ]; then
    HEARTH_BIN="$H" HEARTH_CACHE=$(dirname "$TINY") timeout $t python3 -m pytest -q -p no:cacheprovider -rs \
        tests/parity/test_cuda_sample.py >"$LOG/pytest_cuda_sample.log" 2>&1
    rc=$?
    row "pytest test_cuda_sample.py" "rc $rc: $(tail -1 "$LOG/pytest_cuda_sample.log")"
    [ $rc = 0 ] || grep -E "^E |FAILED" "$LOG/pytest_cuda_sample.log" | head -4 | sed 's/^/  /' >>"$LOG/why.txt"
else
    row "pytest test_cuda_sample.py" "NOT RUN (budget)"
fi

# racecheck of the kernel on small rows (sync/race bugs); here when the 8B model is still
# being written (the time would go to waiting), else with what is left at the end
racecheck() {
    [ -n "${raced:-}" ] && return
    local t=$1
    [ "$t" -ge 8 ] && command -v compute-sanitizer >/dev/null || return
    raced=1
    HEARTH_SAMPLE_QUICK=1 timeout "$t" compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$B/tests/test_cuda_sample" >"$LOG/racecheck.log" 2>&1
    local rc=$?
    row "racecheck (quick rows)" "rc $rc $(grep -o 'RACECHECK SUMMARY.*' "$LOG/racecheck.log" | head -1)"
}
[ -f "$L8/.done" ] || { t=$(( $(left) - 20 )); [ $t -gt 15 ] && t=15; racecheck $t; }

# 3. decode tok/s with sampling: device sampler, then the host sampler, in one process (one
# model load; bench --sampler-ab runs the second half on a --host-sampler engine)
while [ ! -f "$L8/.done" ] && [ "$(left)" -gt 15 ]; do sleep 1; done
t=$(( $(left) - 2 ))
if [ ! -f "$L8/.done" ] || [ $t -lt 10 ]; then
    row "bench 8B bf16 sampled" "NOT RUN (budget ${t}s or no model)"
else
    timeout $t "$H" bench "$L8" --device cuda -p 512 -n 128 -r 1 --temp 0.8 --top-p 0.9 --seed 1 --sampler-ab \
        --json >"$LOG/bench_sampled.json" 2>"$LOG/bench_sampled.log"
    rc=$?
    r=$(python3 -c "
import json, sys
o = json.load(open(sys.argv[1])); d = o['decode_tps']; h = o['sampling']['host_sampler_decode_tps']
print('device %.1f / host %.1f tok/s decode = %.2fx (%s)' % (d, h, d / h, o['sampling']['sampler']))" \
        "$LOG/bench_sampled.json" 2>/dev/null)
    row "bench 8B bf16 T0.8 top-p 0.9" "${r:-FAIL rc $rc: $(tail -1 "$LOG/bench_sampled.log")}"
fi

racecheck $(( $(left) - 1 ))

echo "== gpu-sample (${SECONDS}s of ${BUDGET}s; logs in $LOG)"
printf '%s\n' "${sum[@]}"
[ -f "$LOG/why.txt" ] && head -8 "$LOG/why.txt"
exit 0
