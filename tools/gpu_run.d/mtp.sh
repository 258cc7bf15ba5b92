#!/usr/bin/env bash
# mtp: --speculate mtp on the GPU. Correctness: the tiny Qwen3.5 with a fitted MTP head
# (build-gpumodels/mtp, tools/mtp_checkpoint.py; expected.json holds the reference head's
# proposed / accepted counts for depths 1 and 3, which the CPU's scalar tier matches) under
# `generate --device cuda --cuda-exact`: the same counts as the CPU's scalar tier scheduled as
# the GPU schedules a hybrid (--no-state-journal: no state journal, a rejection's kept
# tokens fed again at the next step, which proposes nothing; depth 1, which never replays, also
# the reference's) and the same text as --speculate none;
# then `serve` with three requests at once, texts equal to --speculate none's. Speed: random
# Qwen3.5-0.8B- and 9B-shaped MLX 4-bit models with an MTP head (tools/gpu_models.py --mtp),
# `hearth bench --speculate mtp --spec-accept` at known acceptance, batch 1 and 32.
# Usage: mtp.sh LOGDIR   Env: MTP_SHAPES (default "qwen35_0_8b qwen35_9b")
L=$1; mkdir -p "$L"
D=$PWD/build-gpumodels/mtp
[ -d "$D" ] || python3 -c "import tarfile; tarfile.open('build-gpupack/mtp.tar.xz').extractall('build-gpumodels')" ||
  { echo "mtp: no build-gpumodels/mtp and no build-gpupack/mtp.tar.xz (docs/gpu.md)"; exit 1; }
fail=0
prompt=$(python3 -c 'import json; print(json.load(open("'"$D"'/expected.json"))["prompt"])')
for k in 1 3; do
  $H generate "$D" "$prompt" --no-chat-template --max-tokens 40 --device cuda --cuda-exact --speculate mtp \
    --num-draft-tokens $k >"$L"/gen_mtp_$k.txt 2>"$L"/gen_mtp_$k.err
  got=$(grep -a "speculative decoding (mtp)" "$L"/gen_mtp_$k.err | sed 's/.*: \([0-9]*\) tokens proposed, \([0-9]*\) accepted/\1 \2/')
  want=$(python3 -c 'import json; print(*json.load(open("'"$D"'/expected.json"))["k'$k'"])')
  HEARTH_CPU=scalar $H generate "$D" "$prompt" --no-chat-template --max-tokens 40 --no-state-journal \
    --speculate mtp --num-draft-tokens $k >"$L"/cpu_replay_$k.txt 2>"$L"/cpu_replay_$k.err
  cpu=$(grep -a "speculative decoding (mtp)" "$L"/cpu_replay_$k.err | sed 's/.*: \([0-9]*\) tokens proposed, \([0-9]*\) accepted/\1 \2/')
  [ -n "$got" ] && [ "$got" = "$cpu" ] || fail=1
  [ $k != 1 ] || [ "$got" = "$want" ] || fail=1
  echo "depth $k: proposed/accepted $got (CPU scalar, the GPU's scheduling: $cpu; reference head, journaled: $want)"
done
$H generate "$D" "$prompt" --no-chat-template --max-tokens 40 --device cuda --cuda-exact --speculate none \
  >"$L"/gen_none.txt 2>"$L"/gen_none.err
for k in 1 3; do cmp -s "$L"/gen_none.txt "$L"/gen_mtp_$k.txt || { fail=1; echo "depth $k: text differs from none"; }; done
port=18091
for mode in none mtp; do
  $H serve --model "$D" --device cuda --cuda-exact --speculate $mode --port $port >"$L"/serve_$mode.log 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do curl -s localhost:$port/health >/dev/null 2>&1 && break; sleep 0.1; done
  for p in "$prompt" "one two three one two three" "the cat sat on the mat"; do
    (curl -s localhost:$port/v1/completions -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"$p\",\"max_tokens\":40,\"temperature\":0}" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"].replace("\n","\\n"))' \
      >"$L"/conc_${mode}_$(echo "$p" | md5sum | cut -c1-6).txt) &
  done
  wait $(jobs -p | grep -v "^$pid$") 2>/dev/null
  cat "$L"/conc_${mode}_*.txt >"$L"/conc_$mode.txt
  curl -s localhost:$port/stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["speculative"]["mtp"])' \
    >"$L"/stats_$mode.txt
  kill $pid; wait $pid 2>/dev/null
done
cmp -s "$L"/conc_none.txt "$L"/conc_mtp.txt || { fail=1; echo "serve: concurrent texts differ"; }
echo "serve, three at once: same text as none: $(cmp -s "$L"/conc_none.txt "$L"/conc_mtp.txt && echo yes || echo no); mtp stats $(cat "$L"/stats_mtp.txt)"
echo "mtp correctness: $([ $fail = 0 ] && echo PASS || echo FAIL)"
for shape in ${MTP_SHAPES:-qwen35_0_8b qwen35_9b}; do
  python3 tools/gpu_models.py $shape mlx /tmp/$shape-mtp --mtp --tokenizer "$TINY"/qwen3_5-bf16 >"$L"/write_$shape.txt 2>&1 || {
    echo "$shape: write failed"; continue; }
  python3 bench/speculative/mtp.py $H /tmp/$shape-mtp --device cuda --accept 0.6,0.8,0.9 --depths 1,2,3 \
    --batch 1,32 -n 64 -r 3 --label "random weights, $shape shape, MLX 4-bit, GPU" \
    --out "$L"/speculative_mtp_$shape.md >"$L"/bench_$shape.txt 2>&1
  echo "$shape: bench rc $?"
  grep '^| [0-9]' "$L"/bench_$shape.txt
  rm -rf /tmp/$shape-mtp
done
