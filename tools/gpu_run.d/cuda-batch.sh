#!/usr/bin/env bash
# cuda-batch LOGDIR: batched serve steps on the GPU (issue #6), budget ~70 s. Unit tests of the
# dispatch (test_cuda_ragged: ragged-step attention split; test_cuda: cuda_matmul picks,
# dequantizers, v2 GEMVs; test_cuda_kv: mixed batches; test_cuda_graph), batch_bench (matmul
# GEMV vs the chosen path per T; ragged attention),
# greedy parity of 12 concurrent serve requests vs each alone, then, with the time left, a
# hearth-only serve_load at N=8,32 on the 8B F16 GGUF (Q4_K_M when no F16 file). Env from
# tools/gpu_run: H, B, TINY, G8.
L=${1:?usage: cuda-batch.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
BUDGET=${CB_BUDGET:-70}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
SUM=$L/summary.txt
: >"$SUM"
say() { echo "$*" | tee -a "$SUM" >/dev/null; }
: "${H:?H (hearth binary) not set}" "${B:?B (build dir) not set}"

unit() { # name timeout [env...]
    local n=$1 t=$2
    shift 2
    local bin=$B/tests/$n
    [ -x "$bin" ] || { say "$n: NOT BUILT ($bin missing)"; return; }
    [ "$(left)" -lt 8 ] && { say "$n: NOT RUN (time)"; return; }
    [ "$t" -gt $(($(left) - 4)) ] && t=$(($(left) - 4))
    env "$@" timeout "$t" "$bin" >"$L/$n.log" 2>&1
    local rc=$? v=PASS
    [ $rc = 0 ] || v="FAIL rc $rc"
    [ $rc = 124 ] && v="TIMEOUT ${t}s"
    grep -q "skipped" "$L/$n.log" && v="SKIPPED (did not run)"
    say "$n: $v ($(grep -c 'OK \]' "$L/$n.log") ok, $(grep -c 'FAILED \]' "$L/$n.log") failed) $(grep -m1 -oE 'ragged batches checked' "$L/$n.log")"
    [ $rc = 0 ] || grep -vE '^\[ (RUN|  OK) ' "$L/$n.log" | grep -m3 -iE 'error|fail|refer|differ|tol' | cut -c1-260 | tee -a "$SUM" >/dev/null
}
# CB_UNITS: which unit runs, in order (default: all of them)
for u in ${CB_UNITS:-ragged kv cuda graph}; do
    case $u in
    ragged) unit test_cuda_ragged 15 ;;
    kv) unit test_cuda_kv 15 ;;
    cuda) unit test_cuda 60 ;; # flat dequantizers, F16/BF16 cuBLAS from 2 rows, v2 GEMVs, MMQ
    graph) unit test_cuda_graph 15 ;; # decode graphs capture cuBLAS calls (F16 / BF16 at 2..8 rows)
    esac
done

# microbenchmarks: build (libhearth.a is there) and run them: matmul paths per T, then attention
if timeout 20 make -s BUILD="$B" BINDIR="$B/bin" LIBDIR="$B/lib" "$B/bench/batch_bench" >"$L/batch_bench_build.log" 2>&1; then
    [ "$(left)" -gt 12 ] && timeout 14 "$B/bench/batch_bench" >"$L/batch_bench.txt" 2>&1
    say "dequant: $(grep -h 'dequant to bf16' "$L/batch_bench.txt" 2>/dev/null | tr -s ' ' | tr '\n' ';')"
    # per T: format gemv/matmul us (the default picks)
    for T in 1 8 16 32 64 128; do
        say "T=$T gemv/matmul: $(awk -v T="T=$(printf '%3d' $T):" 'index($0, T) {printf "%s %s/%s ", $1, $5, $8}' "$L/batch_bench.txt" 2>/dev/null)"
    done
    grep -q "skipped" "$L/batch_bench.txt" && say "batch_bench: $(head -1 "$L/batch_bench.txt")"
    grep -h "attention ragged" "$L/batch_bench.txt" | sed 's/.*one layer: //' | tr '\n' ';' | sed 's/^/attention: /' | tee -a "$SUM" >/dev/null
    echo >>"$SUM"
else
    say "batch_bench: BUILD FAILED ($(tail -1 "$L/batch_bench_build.log" | cut -c1-120))"
fi

# greedy parity: 12 concurrent requests == each alone (f32 GEMM), tiny llama-f32 and qwen3-q4g64
if [ "$(left)" -gt 25 ] && [ -n "${TINY:-}" ]; then
    (cd tests/parity && HEARTH_BIN="$H" HEARTH_CACHE="$(dirname "$TINY")" timeout 22 python3 -m pytest -q \
        -p no:cacheprovider -rs test_cuda_device.py -k 12_concurrent >"$L/parity12.log" 2>&1)
    say "parity 12 concurrent == alone: rc $? $(tail -1 "$L/parity12.log" | cut -c1-120)"
else
    say "parity 12 concurrent: NOT RUN (time or TINY unset)"
fi

# end to end: hearth-only serve_load, N=8,32 (needs ~40 s for the load and two levels)
serve() { # tag [env...]
    local tag=$1
    shift
    env "$@" timeout $(($(left) - 2)) python3 bench/serve_load/gpu_load.py --hearth "$H" --model "$F=$G8/llama8b-$F.gguf" \
        --servers hearth --device cuda --n 8,32 --budget $(($(left) - 6)) --out "$L/serve_$tag" --logs "$L/logs_$tag" \
        >"$L/serve_$tag.log" 2>&1
    say "serve_load $F ($tag): $(python3 -c "
import json,sys
r=json.load(open(sys.argv[1]))['levels']['$F']['hearth']
print('; '.join(f\"N={n} {v.get('aggregate_tps',0):.0f} tok/s p50 TTFT {v.get('ttft_p50_ms',0):.0f} ms\" for n,v in r.items() if v and 'aggregate_tps' in v))
" "$L/serve_$tag.json" 2>/dev/null || echo "no result (see serve_$tag.log)") [first run: f16 317 / 690, q4_k_m 480 / 512]"
}
if [ -z "${G8:-}" ]; then
    say "serve_load: NOT RUN (G8 unset)"
elif [ "$(left)" -ge 40 ]; then
    for _ in $(seq 1 10); do [ -f "$G8/.done" ] && break; sleep 1; done
    F=f16
    [ -f "$G8/llama8b-f16.gguf" ] || F=q4_k_m
    if [ -f "$G8/llama8b-$F.gguf" ]; then
        serve new
    else
        say "serve_load: no GGUF in $G8"
    fi
else
    say "serve_load: NOT RUN ($(left) s left, needs 40; CB_BUDGET raises the budget)"
fi
say "cuda-batch: $(($(date +%s) - T0)) s"
cat "$SUM"
