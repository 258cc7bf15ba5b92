#!/usr/bin/env bash
# lora LOGDIR: LoRA / DoRA adapters on the GPU: tests/parity/test_cuda_lora.py (adapters on
# --device cuda --cuda-exact against the CPU scalar tier: trace on seven tiny models, LoRA and
# DoRA; serve with "a", "b", "a+b" and "none" mixed in one batch), then bench/lora/mixed.py
# --device cuda: 32 streams over 8 rank-16 adapters against 32 base streams on the 8B Llama
# shape (model l8; results into their section of bench/results/lora_mixed.md, copied to LOGDIR).
# Usage: lora.sh LOGDIR   Env from tools/gpu_run (H, TINY, L8).
L=${1:?usage: lora.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
HEARTH_BIN=$H HEARTH_CACHE=$(dirname "$TINY") timeout 400 python3 -m pytest -q -p no:cacheprovider \
  tests/parity/test_cuda_lora.py >"$L"/pytest.log 2>&1
echo "tests/parity/test_cuda_lora.py rc $?: $(tail -n1 "$L"/pytest.log)"
# the bench needs the 8B model gpu_run writes when GR_MODELS names l8 (its default does)
case " ${GR_MODELS-l8} " in *" l8 "*) for _ in $(seq 1 240); do [ -f "$L8"/.done ] && break; sleep 1; done ;; esac
if [ -f "$L8"/.done ]; then
  timeout 500 python3 bench/lora/mixed.py "$H" "$L8" --device cuda --streams 32 --adapters 8 --rank 16 \
    --tokens 64 --repeat 3 --all-adapted >"$L"/bench.log 2>&1
  echo "bench/lora/mixed.py --device cuda rc $?"
  cp bench/results/lora_mixed.md "$L"/ 2>/dev/null
  tail -n 6 "$L"/bench.log
else
  echo "bench: NOT RUN (no 8B model: GR_MODELS needs l8)"
fi
