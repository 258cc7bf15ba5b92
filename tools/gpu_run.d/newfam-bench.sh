#!/usr/bin/env bash
# newfam-bench LOGDIR: issue 33's speed rows on the new families, random weights with the real
# shapes: per model of NF_MODELS (default gemma4_e4b qwen35_9b gemma4_26b_a4b qwen35_35b_a3b; also
# qwen3_30b_a3b) and format (Q4_K_M GGUF, MLX 4-bit), hearth bench decode (128
# after 512) and prefill-4096, llama.cpp's llama-bench on the GGUF (same shapes), one row each:
# hearth tok/s, llama.cpp tok/s, ratio, roofline fractions (bench/cuda/newfam_rows.py). A model
# hearth refuses prints "refused: <message>" as its row. Models come from newfam-bench.pre.sh
# (written in the background from the call's start); each is deleted after its rows (disk).
# Writes LOGDIR/cuda_newfam.md (bench/results_file.py; copy it to bench/results/), and $OUT/ too.
# Env: NF_MODELS, NF_FORMATS ("gguf mlx"), NF_DIR (/tmp/newfam), NF_DEVICE (cuda; cpu for a dry
# run with H a CPU build), NF_SCALE (full; small), NF_PREFILL (4096), NF_CTX (512), NF_GEN (128),
# NF_REPS (3), NF_KEEP=1 keeps the models, LLAMA_SERVER_DIR (/tmp/llamacpp-server), PHASE_BUDGET,
# NF_AB=1 (each decode and prefill row also with the "before" binary of build-gpupack/ab_old.tar.xz:
# A/B lines).
set -u
L=${1:?usage: newfam-bench.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=tools/gpu_run.d/newfam.inc
. tools/gpu_run.d/newfam.inc
T0=$(date +%s)
BUDGET=${PHASE_BUDGET:-600}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
DEV=${NF_DEVICE:-cuda} P=${NF_PREFILL:-4096} C=${NF_CTX:-512} N=${NF_GEN:-128} R=${NF_REPS:-3}
LB=${LLAMA_SERVER_DIR:-/tmp/llamacpp-server}/b/bin/llama-bench
TF=""
if [ "$DEV" = cuda ]; then
    timeout 25 python3 bench/cuda/roofline.py >"$L/roofline.json" 2>"$L/roofline.log"
    echo "roofline: $(cat "$L/roofline.json")"
    TF=$(python3 -c "import json; print(json.load(open('$L/roofline.json'))['bf16_gemm_tflops'])" 2>/dev/null)
fi
rm -f "$L/rows.jsonl"
bench() { # item kind args...: hearth bench into LOGDIR/<item>.<kind>.{json,log}
    local item=$1 kind=$2
    shift 2
    [ "$(left)" -lt 20 ] && { echo "hearth: NOT RUN ($(left) s left)" >"$L/$item.$kind.log"; return; }
    timeout $(($(left) - 10)) "$H" bench "$(nf_path "$item")" --device "$DEV" "$@" --json >"$L/$item.$kind.json" 2>"$L/$item.$kind.log"
    echo $? >"$L/$item.$kind.rc" # a refusal (rc 1 or 2), a timeout (124) or a crash (a signal) say so in the row
}
llama() { # item kind args...: llama-bench into LOGDIR/llama-<model>.<kind>.json
    local item=$1 kind=$2
    shift 2
    [ -x "$LB" ] || return
    [ "$(left)" -lt 30 ] && return
    timeout $(($(left) - 10)) "$LB" -m "$(nf_path "$item")" "$@" -fa 1 -ngl 99 -r 2 -o json \
        >"$L/llama-${item%-*}.$kind.json" 2>"$L/llama-${item%-*}.$kind.log"
}
# NF_AB=1: the decode and prefill rows again with the "before" binary newfam-bench.pre.sh builds
# (engine-ab.pre.sh: build-gpupack/ab_old.tar.xz), printed as A/B lines (same model, same call)
ab_old() { # item kind args...
    local item=$1 kind=$2 old=/tmp/ab_old/build/bin/hearth
    shift 2
    while [ ! -f /tmp/ab_old/.built ] && [ ! -f /tmp/ab_old/.failed ] && [ "$(left)" -gt 90 ]; do sleep 2; done
    if [ ! -x $old ] || [ "$(left)" -le 40 ]; then
        echo "A/B $item $kind: no before binary"
        return
    fi
    timeout $(($(left) - 20)) $old bench "$(nf_path "$item")" --device "$DEV" "$@" --json >"$L/$item.${kind}_old.json" 2>"$L/$item.${kind}_old.log"
    python3 - "$L/$item.${kind}_old.json" "$L/$item.$kind.json" "$item" "$kind" <<'PY'
import json, sys
def tps(f):
    try: return json.loads(open(f).read().strip().splitlines()[-1])[sys.argv[4] + "_tps"]
    except Exception: return None
o, n = tps(sys.argv[1]), tps(sys.argv[2])
print(f"A/B {sys.argv[3]} {sys.argv[4]}: before {o} after {n} tok/s" + (f", after/before {n / o:.3f}" if o and n else ""))
PY
}
row() { python3 bench/cuda/newfam_rows.py row "$L" "${1%-*}" "${1##*-}" ${TF:+--tflops "$TF"}; }
for item in $(nf_items); do
    while [ ! -f "$NF_DIR/$item.ready" ] && [ ! -f "$NF_DIR/$item.failed" ] && [ "$(left)" -gt 30 ]; do sleep 1; done
    if [ ! -f "$NF_DIR/$item.ready" ]; then
        echo "| ${item%-*} | ${item##*-} | NOT RUN: $(cat "$NF_DIR/$item.failed" 2>/dev/null || echo "not written in time ($(left) s left)") |"
        touch "$NF_DIR/$item.gone"
        continue
    fi
    bench "$item" decode -p "$C" -n "$N" -r "$R"
    [ "${NF_AB:-0}" = 1 ] && ab_old "$item" decode -p "$C" -n "$N" -r "$R"
    bench "$item" prefill -p "$P" -n 1 -r "$R"
    [ "${NF_AB:-0}" = 1 ] && ab_old "$item" prefill -p "$P" -n 1 -r "$R"
    if [ "${item##*-}" = gguf ]; then
        # the build (started with the call) may still run: wait while the rows still fit after it
        while [ ! -f "${LB%/b/bin/llama-bench}/.done" ] && [ "$DEV" = cuda ] && [ "$(left)" -gt 120 ]; do sleep 2; done
        llama "$item" decode -p 0 -n "$N" -d "$C"
        llama "$item" prefill -p "$P" -n 0
        [ -x "$LB" ] || echo "llama-bench: not built ($(cat "${LB%/b/bin/llama-bench}/.done" 2>/dev/null || echo 'no build'))"
    fi
    row "$item"
    [ "${NF_KEEP:-0}" = 1 ] || rm -rf "$(nf_path "$item")"
    touch "$NF_DIR/$item.gone"
done
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
python3 bench/cuda/newfam_rows.py write "$L" "$L/cuda_newfam.md" --machine "${GPU:-$(uname -n) (no GPU)}, device $DEV" \
    --command "NF_MODELS=\"${NF_MODELS:-}\" tools/gpu_run TOTAL newfam-bench:$BUDGET" >/dev/null &&
    [ -n "${OUT:-}" ] && cp "$L/cuda_newfam.md" "$OUT/" 2>/dev/null
# the writes' times (newfam-bench.pre.sh), then the table again: gpu_run's summary shows the tail
[ -f "$L/pre.txt" ] && sed 's/^/write: /' "$L/pre.txt"
grep '^| ' "$L/cuda_newfam.md" 2>/dev/null | grep -v '^| ---'
echo "result: $L/cuda_newfam.md"
