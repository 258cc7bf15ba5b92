#!/usr/bin/env bash
# train-serve LOGDIR: adapters `hearth train` writes (on the host's CPU) for the families it
# trains, served by the GPU: `hearth trace --device cuda --cuda-exact --adapter-path` against
# the CPU's scalar tier with the same adapter (the top 20 logits of the last 4 prompt positions
# and 8 greedy steps); Gemma 4's MoE model adapts its layers' dense MLP beside the experts.
# Then `hearth fit --device cuda --draft-model` against the device memory of a serve with that
# draft (tools/cuda_fit_check, MODEL+DRAFT cases; TS_FIT overrides them).
# Usage: train-serve.sh LOGDIR   Env: TS_MODELS (default "gemma4_moe-f32 gemma4-f32 qwen3_5-f32
# qwen3_moe-f32 gemma3-f32"), TS_TOL (2e-3, the LoRA parity tolerance)
L=$1; mkdir -p "$L"/data
fail=0
python3 - "$L"/data <<'PY'
import json, random, sys
r = random.Random(1)
w = "the cat sat on a mat while dogs ran over green hills and birds sang songs of old".split()
with open(sys.argv[1] + "/train.jsonl", "w") as f:
    for _ in range(8):
        f.write(json.dumps({"text": " ".join(r.choice(w) for _ in range(r.randint(8, 40)))}) + "\n")
PY
ids='[5,17,300,42,9,77,123,11,250,3]'
for m in ${TS_MODELS:-gemma4_moe-f32 gemma4-f32 qwen3_5-f32 qwen3_moe-f32 gemma3-f32}; do
  ad="$L"/ad_$m
  if ! $H train "$TINY"/$m --data "$L"/data --iters 4 --batch-size 2 --learning-rate 1e-2 --num-layers -1 \
      --threads 8 --adapter-path "$ad" >"$L"/train_$m.log 2>&1; then
    echo "$m: train failed: $(tail -1 "$L"/train_$m.log)"; fail=1; continue
  fi
  HEARTH_CPU=scalar $H trace "$TINY"/$m --ids "$ids" --last 4 --top 20 --steps 8 --device cpu --adapter-path "$ad" \
    >"$L"/cpu_$m.json 2>"$L"/cpu_$m.log
  $H trace "$TINY"/$m --ids "$ids" --last 4 --top 20 --steps 8 --device cuda --cuda-exact --adapter-path "$ad" \
    >"$L"/gpu_$m.json 2>"$L"/gpu_$m.log
  python3 - "$L"/cpu_$m.json "$L"/gpu_$m.json "$m" "${TS_TOL:-2e-3}" <<'PY' || fail=1
import json, sys
try:
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
except Exception as e:
    print(f"{sys.argv[3]}: no trace ({e})"); sys.exit(1)
worst = 0.0
for ra, rb in zip(a["prompt"], b["prompt"]):
    ga = dict((i, v) for i, v in ra["top"])
    for i, v in rb["top"][:10]:
        if i in ga:
            worst = max(worst, abs(ga[i] - v))
same = [s["token"] for s in a["steps"]] == [s["token"] for s in b["steps"]]
ok = worst < float(sys.argv[4]) and same
print(f"{sys.argv[3]}: adapter served on cuda vs cpu scalar: worst top-logit difference {worst:.2e}, "
      f"greedy steps equal: {same}: {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
done
# hearth fit --device cuda --draft-model against a real serve with the draft (tools/cuda_fit_check)
if [ -n "${TS_FIT:-$TINY/llama-bf16+$TINY/llama-q8g64:1024,4096}" ]; then
  python3 tools/cuda_fit_check "$H" "$L"/fit "${TS_FIT_BUDGET:-40}" \
    ${TS_FIT:-$TINY/llama-bf16+$TINY/llama-q8g64:1024,4096 $TINY/llama-bf16:1024} >"$L"/fit.txt 2>&1
  grep -E "^\||error|SKIP" "$L"/fit.txt | head -8
fi
echo "train-serve: $([ $fail = 0 ] && echo PASS || echo FAIL)"
