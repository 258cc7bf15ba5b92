#!/usr/bin/env bash
# gpu-kv: quantized KV and deterministic mode on the GPU (issue #6). In order: the device KV
# unit tests (int8 rows = the CPU pool's bytes, fp8 rows = an independent e4m3 encoder's,
# int8/fp8/f32 decode, prefill and mixed attention vs a double softmax, deterministic
# attention alone = in a batch), the GEMV batch-invariance test inside test_cuda, the
# `hearth serve --device cuda --deterministic` test (a request alone = among 1, 7, 63 others),
# then the KV quality measurement (KL / agreement of int8 and fp8 vs f32 KV: tiny models,
# then the random-weight 8B if written). Budget: 80 s. Usage: gpu-kv.sh LOGDIR
L=${1:?usage: gpu-kv.sh LOGDIR}
mkdir -p "$L"
T0=$(date +%s)
left() { echo $((${GK_BUDGET:-78} - ($(date +%s) - T0))); }
: "${H:?H (the hearth binary) must be set by tools/gpu_run}" "${B:?B must be set}" "${TINY:?TINY must be set}"

# 1. unit tests (prints failing assertions with shapes and values into the log)
timeout 30 "$B/tests/test_cuda_kv" >"$L/test_cuda_kv.log" 2>&1
rc=$?
echo "test_cuda_kv rc $rc: $(grep -c 'OK \]' "$L/test_cuda_kv.log") ok, $(grep -c 'FAILED \]' "$L/test_cuda_kv.log") failed $(grep -m1 -o 'skipped: no CUDA device' "$L/test_cuda_kv.log")"
grep -v skipped "$L/test_cuda_kv.log" | grep -m2 -E '(attention|kv_write).*(reference|differs|CPU)' | cut -c1-250
HEARTH_TEST_FILTER=test_gemv_batch_invariant timeout 30 "$B/tests/test_cuda" >"$L/test_cuda.log" 2>&1
echo "test_cuda (GEMV batch invariance only) rc $?: $(grep -E '(OK|FAILED) +\] test_gemv_batch_invariant' "$L/test_cuda.log" | tr -s ' ' | cut -c1-60)"
grep -m2 -E 'among|alone' "$L/test_cuda.log" | cut -c1-250

# 2. deterministic serve on the GPU (tiny llama-f32 and qwen3-q4g64, f32 and fp8 KV); GK_DET=0 skips it
if [ "${GK_DET:-1}" = 0 ]; then
    echo "deterministic serve: NOT RUN (GK_DET=0)"
else
    # shellcheck disable=SC2086 # PY may carry interpreter flags
    (cd tests/api && HEARTH_BIN="$H" HEARTH_CACHE="$(dirname "$TINY")" timeout 50 ${PY:-python3} -m pytest -q -rs \
        test_cuda_deterministic.py) >"$L/deterministic.log" 2>&1
    echo "deterministic serve (alone vs 1/7/63 others) rc $?: $(tail -1 "$L/deterministic.log" | cut -c1-120)"
    grep -m2 -E '^E .*(differs|assert)' "$L/deterministic.log" | cut -c1-250
fi

# 3. quality: int8 / fp8 vs f32 KV on the GPU; the 8B only if written and time is left
# GK_QUANTS: which quantized pools to measure (default f16,int8,fp8)
q=${GK_QUANTS:-f16,int8,fp8}
models="$TINY/llama-bf16:$q $TINY/qwen3-q4g64:$q $TINY/gemma3-bf16:$q"
[ -f "$L8/.done" ] && models="$models $L8:f16,int8"
b=$(left)
if [ "$b" -gt 8 ]; then
    # shellcheck disable=SC2086 # models is a list of MODEL:KINDS words
    timeout $((b - 2)) python3 tools/cuda_kv_quality.py --lib "$B/lib" --out "$L/kv_quality.json" --tokens 256 \
        --steps 16 --budget $((b - 20)) $models >"$L/kv_quality.md" 2>"$L/kv_quality.err"
    echo "kv quality rc $? ($L/kv_quality.md):"
    # | model | KV | positions | mean KL | p99 KL | argmax | greedy prefix / same |
    grep -E '^\| [^ ]+ \| (int8|fp8|f16) ' "$L/kv_quality.md" | tr -s ' ' | cut -c1-160
    tail -2 "$L/kv_quality.err" | cut -c1-200
else
    echo "kv quality: NOT RUN (no time left)"
fi
echo "gpu-kv done in $(($(date +%s) - T0)) s"
