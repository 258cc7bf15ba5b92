#!/usr/bin/env bash
# newfam-bench.pre.sh LOGDIR: started by tools/gpu_run at the very start of the device call:
# writes the new families' benchmark models (tools/gpu_models.py; NF_MODELS, NF_FORMATS, NF_DIR,
# NF_SCALE as newfam-bench.sh reads them) in the order the phase measures them, at most two on
# the disk at a time (it waits for the phase to delete one: a 35B-A3B pair is ~41 GB of the
# machine's 64), and builds llama-bench (gpu-serve.pre.sh, which a lock makes run once when both
# phases are in the call). Each model's path gets a .ready marker beside it when complete.
set -u
LOG=${1:?usage: newfam-bench.pre.sh LOGDIR}
mkdir -p "$LOG" && LOG=$(cd "$LOG" && pwd)
cd "$(dirname "$0")/../.." || exit 1
NF_DIR=${NF_DIR:-/tmp/newfam}
rm -rf "$NF_DIR" && mkdir -p "$NF_DIR" # a warm machine's previous call left its markers and models
[ "${NF_DEVICE:-cuda}" = cuda ] && { tools/gpu_run.d/gpu-serve.pre.sh "$LOG" >"$LOG/llama_build.txt" 2>&1 & }
[ "${NF_AB:-0}" = 1 ] && { tools/gpu_run.d/engine-ab.pre.sh "$LOG" >"$LOG/ab_old_build.txt" 2>&1 & }
# shellcheck source=tools/gpu_run.d/newfam.inc
. tools/gpu_run.d/newfam.inc
T0=$(date +%s)
n=0
for item in $(nf_items); do
    # at most two items on the disk: wait until the one two places back is measured and deleted
    if [ $n -ge 2 ]; then
        prev=$(nf_items | sed -n "$((n - 1))p")
        # bounded by a device call's 10 minutes: a phase cut short never deletes its model
        while [ ! -f "$NF_DIR/$prev.gone" ] && [ $(($(date +%s) - T0)) -lt 600 ]; do sleep 1; done
        [ -f "$NF_DIR/$prev.gone" ] || exit 0
    fi
    m=${item%-*} f=${item##*-}
    out=$(nf_path "$item")
    s=$(date +%s)
    if nice -n 5 python3 tools/gpu_models.py "$m" "$f" "$out" --scale "${NF_SCALE:-full}" >"$LOG/write_$item.log" 2>&1; then
        touch "$NF_DIR/$item.ready"
        echo "$item written in $(($(date +%s) - s)) s ($(du -sh "$out" | cut -f1)), at $(($(date +%s) - T0)) s"
    else
        tail -1 "$LOG/write_$item.log" >"$NF_DIR/$item.failed"
        echo "$item: write FAILED: $(cat "$NF_DIR/$item.failed")"
    fi
    n=$((n + 1))
done
