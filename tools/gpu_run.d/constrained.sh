#!/usr/bin/env bash
# constrained: constrained decoding under concurrency on the GPU: bench/constrained/serve.py
# (`hearth serve --device cuda`, N streams with no constraint, json_object and a json_schema,
# rounds alternated) on the 8B bf16 model. Env: CO_MODEL (default $L8), CO_LEVELS (1,32),
# CO_ROUNDS (3), CO_TOKENS (128). Writes LOGDIR/constrained_serve.md (its table goes into
# bench/results/constrained_serve_gpu.md). Usage: constrained.sh LOGDIR
L=${1:?usage: constrained.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
m=${CO_MODEL:-$L8}
for _ in $(seq 1 300); do [ -f "$m/.done" ] || [ -f "$m" ] && break; sleep 2; done
python3 bench/constrained/serve.py --bin "$H" --model "$m" --device cuda --concurrency "${CO_LEVELS:-1,32}" \
  --rounds "${CO_ROUNDS:-3}" --max-tokens "${CO_TOKENS:-128}" --out "$L/constrained_serve.md"
