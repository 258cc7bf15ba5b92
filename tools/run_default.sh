#!/usr/bin/env bash
# run_default.sh: what `make run` does until the server lands: opens the default model
# and shows the text layer working on it (info, chat template, tokens, round trip).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${HEARTH_CACHE:-$HOME/.cache/hearth}
model=$(ls "$cache"/models/*SmolLM2*135M*.gguf "$cache"/models/*smollm2*.gguf 2>/dev/null | head -1 || true)
[ -n "$model" ] || { echo "run: default model missing; run tools/get_models.sh" >&2; exit 1; }
bin/hearth info "$model"
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
printf '%s' '[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}]' > "$msgs"
echo; echo "--- chat prompt (hearth template) ---"
bin/hearth template "$model" --messages "$msgs"
echo "--- token ids (hearth tokenize) ---"
prompt=$(bin/hearth template "$model" --messages "$msgs")
ids=$(bin/hearth tokenize "$model" "$prompt" --no-special)
echo "$ids"
echo "--- round trip (hearth detokenize) ---"
bin/hearth detokenize "$model" "$ids"
echo
echo "(generation and the HTTP server arrive with the engine and server milestones)"
