#!/usr/bin/env bash
# spec-bench LOGDIR: speculative decoding's GPU speed table at known acceptance
# (bench/speculative/replay_gpu.py): the 8B Llama shape (l8) with its 1B-shaped draft (d1,
# same tokenizer), the draft's proposals replaced by the target's greedy text kept with
# probability A; one stream at A 0.6 / 0.8 / 0.95 x K 2 / 4 / 8 against the ideal speedup,
# then 32 and 128 streams at A 0.8, K 4 against no speculation; every text must equal the
# one without speculation. Writes LOGDIR/speculative_gpu.md (copy it to bench/results/).
# Usage: spec-bench.sh LOGDIR   Env from tools/gpu_run (H, L8, D1, TINY; GR_MODELS="l8 d1"
# writes both in the background; a missing d1 is written here). Knobs: SB_MODEL, SB_DRAFT
# (paths instead of l8 / d1), SB_DEVICE (cuda; cpu for a dry run with tiny models), SB_N
# (128 tokens), SB_RUNS (3), SB_ACCEPT, SB_DEPTHS, SB_STREAMS (32,128), SB_STREAMS_ACCEPT,
# SB_STREAMS_DEPTH, SB_FLAGS (hearth bench flags; default --deterministic: the batch-invariant
# mode, in which a verify step's rows round as one-row steps do, so the replay is exact; in the
# fast tier a random-weight model's near-flat logits broke the replay on an H100, 2026-12-05).
set -u
L=${1:?usage: spec-bench.sh LOGDIR}
mkdir -p "$L" && L=$(cd "$L" && pwd)
cd "$(dirname "$0")/../.." || exit 1
: "${H:?H (the hearth binary) is not set}"
M=${SB_MODEL:-${L8:-/tmp/llama8b}} D=${SB_DRAFT:-${D1:-/tmp/llama1b}}
# the runner's writer logs to LOGDIR/../model_d1.log when GR_MODELS has d1
if [ -z "${SB_DRAFT:-}" ] && [ ! -f "$D/.done" ] && [ ! -e "$L/../model_d1.log" ]; then
  echo "writing the 1B draft (GR_MODELS had no d1)"
  timeout 300 python3 tools/cuda_llama8b.py make1b "$D" "$TINY"/llama-bf16 >"$L"/write_d1.log 2>&1 && touch "$D/.done"
fi
for f in "$M" "$D"; do # the writers touch .done when complete
  [ -n "${SB_MODEL:-}" ] && [ "$f" = "$M" ] && continue
  [ -n "${SB_DRAFT:-}" ] && [ "$f" = "$D" ] && continue
  for _ in $(seq 1 300); do [ -f "$f"/.done ] && break; sleep 1; done
  [ -f "$f"/.done ] || { echo "spec-bench: NOT RUN ($f not written: GR_MODELS needs l8 d1)"; exit 1; }
done
python3 bench/speculative/replay_gpu.py "$H" "$M" "$D" --device "${SB_DEVICE:-cuda}" -n "${SB_N:-128}" \
  -r "${SB_RUNS:-3}" --accept "${SB_ACCEPT:-0.6,0.8,0.95}" --depths "${SB_DEPTHS:-2,4,8}" \
  --streams "${SB_STREAMS:-32,128}" --streams-accept "${SB_STREAMS_ACCEPT:-0.8}" \
  --streams-depth "${SB_STREAMS_DEPTH:-4}" --flags="${SB_FLAGS---deterministic}" --out "$L"/speculative_gpu.md \
  --log "$L"/hearth_bench.log
rc=$?
[ -n "${OUT:-}" ] && cp "$L"/speculative_gpu.md "$OUT"/ 2>/dev/null
echo "spec-bench: rc $rc; $(grep -h '^Targets met' "$L"/speculative_gpu.md 2>/dev/null)"
exit $rc
