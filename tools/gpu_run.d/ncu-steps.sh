#!/usr/bin/env bash
# ncu-steps LOGDIR: per-kernel device time of one single-token decode step (the 10th, ~520
# tokens of context) of each 8B model in NS_MODELS (default "q4_k_m bf16": the GGUF in $G8
# or the bf16 folder $L8; nf:MODEL-FORMAT writes a new-family model of tools/gpu_models.py,
# e.g. nf:gemma4_e4b-gguf, and profiles it), eager launches, under `ncu --clock-control none` with
# gpu__time_duration and dram__bytes_read; bench/cuda/ncu_summary.py groups the kernels
# (launches, us, share, GB/s). ncu serializes kernels and flushes caches between them, so
# the sum reads above the real step. NS_PREFILL=1: the 4096-token prefill step (the second:
# bench warms up with a 32-token one) instead. A part of tools/gpu_run (env: H, G8, L8). Budget:
# NS_BUDGET (s, default 90); NS_SKIP, NS_COUNT: the window (decode 3000, 300 launches; prefill
# 300, 300); NS_KERNELS: an ncu --kernel-name filter (e.g. "regex:^(?!q4k_pack)": the window then
# skips the load's weight repacking; the prefill window's default, whose 300 skipped launches a
# GGUF's repacking alone would fill: NS_KERNELS= counts every kernel).
set -u
L=${1:?usage: ncu-steps.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
BUDGET=${NS_BUDGET:-90}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for m in ${NS_MODELS:-q4_k_m bf16}; do
    case $m in
        bf16) f=$L8 ok=$L8/.done ;;
        nf:*) # a new-family model of tools/gpu_models.py, nf:MODEL-FORMAT (gguf | mlx), written here
            it=${m#nf:} f=/tmp/ncu_${m#nf:} ok=/tmp/ncu_${m#nf:}.ready
            [ "${it##*-}" = gguf ] && f=$f.gguf
            [ -e "$ok" ] || { timeout $(($(left) - 30)) python3 tools/gpu_models.py "${it%-*}" "${it##*-}" "$f" >"$L/write_$it.log" 2>&1 && touch "$ok"; }
            m=$it ;;
        *) f=$G8/llama8b-$m.gguf ok=$G8/.done ;;
    esac
    for _ in $(seq 1 60); do [ -e "$ok" ] && break; sleep 1; done
    [ -e "$f" ] || { echo "$m: NOT RUN (no model)"; continue; }
    [ "$(left)" -lt 25 ] && { echo "$m: NOT RUN ($(left) s left)"; continue; }
    # a window of kernel launches (graph nodes count one each): the second prefill step, or
    # about one decode step after the first few
    kernels=${NS_KERNELS-}
    if [ "${NS_PREFILL:-0}" = 1 ]; then win="--launch-skip ${NS_SKIP:-300} --launch-count ${NS_COUNT:-300}" args="-p 4096 -n 1 -r 1"
        kernels=${NS_KERNELS-"regex:^(?!q4k_pack)"}
    else win="--launch-skip ${NS_SKIP:-3000} --launch-count ${NS_COUNT:-300}" args="-p 512 -n 16 -r 1"; fi
    # shellcheck disable=SC2086 # win (ncu flags) and args (bench flags) are word lists
    timeout $(($(left) - 3)) $NCU --clock-control none --graph-profiling node $win ${kernels:+--kernel-name "$kernels"} \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw \
        --log-file "$L/ncu_$m.csv" "$H" bench "$f" --device cuda $args --json \
        >"$L/ncu_$m.json" 2>"$L/ncu_$m.log"
    echo "$m: rc $?"
    python3 bench/cuda/ncu_summary.py "$L/ncu_$m.csv" >"$L/ncu_$m.txt" 2>&1
    head -14 "$L/ncu_$m.txt"
done
