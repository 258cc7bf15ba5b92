#!/usr/bin/env bash
# run_default.sh: what `make run` does until the HTTP server lands: shows the default
# model, answers a question with it, then (on a terminal) opens `hearth chat`.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${HEARTH_CACHE:-$HOME/.cache/hearth}
model="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "run: default model missing; run tools/get_models.sh" >&2; exit 1; }
bin/hearth info "$model"
echo
echo "> What is the capital of France? Answer in one sentence."
bin/hearth generate "$model" "What is the capital of France? Answer in one sentence." --max-tokens 64
if [ -t 0 ]; then
  echo
  bin/hearth chat "$model"
else
  echo "(stdin is not a terminal: skipping the interactive 'hearth chat')"
fi
