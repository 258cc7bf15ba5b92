#!/usr/bin/env bash
# run_default.sh: what `make run` does: starts `hearth serve` with the default model
# (SmolLM2-135M-Instruct Q4_1) on 127.0.0.1:8080 in the foreground, like mlx_lm.server.
# Ctrl-C stops it. Extra arguments go to `hearth serve` (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${HEARTH_CACHE:-$HOME/.cache/hearth}
model="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "run: default model missing; run tools/get_models.sh" >&2; exit 1; }
echo "hearth serve: http://127.0.0.1:8080/v1  (OpenAI API; Ctrl-C stops)"
echo "  try: curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "         -d '{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]}'"
exec bin/hearth serve --model "$model" --host 127.0.0.1 --port 8080 "$@"
