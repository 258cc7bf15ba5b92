#!/usr/bin/env bash
# spec: speculative decoding on the GPU: `hearth serve --device cuda --cuda-exact` on tiny
# models with --speculate none, prompt lookup, and a draft model (another weight format of the
# family), the same greedy requests (alone, then three at once beside a sampled one, which the
# device samples and which does not speculate); texts must be equal and /stats must show
# proposals. Usage: spec.sh LOGDIR   Env: SP_MODELS (default "qwen3-f32:qwen3-q8g64
# llama-bf16:llama-q8g64 gemma3-q8g32:gemma3-q8g64"; an entry without ":DRAFT" runs none and
# lookup only: a hybrid target such as qwen3_5-f32, whose backup and re-fed tokens it checks)
L=$1; mkdir -p "$L"
port=18090
fail=0
ask() { # prompt -> text (greedy)
  curl -s localhost:$port/v1/completions -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"$1\",\"max_tokens\":40,\"temperature\":0}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"].replace("\n","\\n"))'
}
for pair in ${SP_MODELS:-qwen3-f32:qwen3-q8g64 llama-bf16:llama-q8g64 gemma3-q8g32:gemma3-q8g64}; do
  m=${pair%%:*} d=${pair#*:} modes="none lookup draft"
  [ "$d" = "$pair" ] && modes="none lookup"
  for mode in $modes; do
    flags="--speculate $mode"
    [ $mode = draft ] && flags="--draft-model $TINY/$d"
    $H serve --model "$TINY"/$m --device cuda --cuda-exact $flags --port $port >"$L"/serve_${m}_$mode.log 2>&1 &
    pid=$!
    for _ in $(seq 1 200); do curl -s localhost:$port/health >/dev/null 2>&1 && break; sleep 0.1; done
    out="$L"/out_${m}_$mode.txt
    : >"$out"
    for p in "one two three one two three one two" "the cat sat on the mat. the cat sat on" "a b c d a b c d a"; do
      ask "$p" >>"$out"
    done
    # three at once beside a sampled request
    (curl -s localhost:$port/v1/completions -H 'Content-Type: application/json' \
      -d '{"prompt":"x y z","max_tokens":40,"temperature":0.9,"seed":3}' >/dev/null) &
    for p in "one two three one two three one two" "the cat sat on the mat. the cat sat on" "a b c d a b c d a"; do
      (ask "$p" >"$L"/conc_${m}_${mode}_$(echo "$p" | md5sum | cut -c1-6).txt) &
    done
    wait $(jobs -p | grep -v "^$pid$") 2>/dev/null
    for p in "one two three one two three one two" "the cat sat on the mat. the cat sat on" "a b c d a b c d a"; do
      cat "$L"/conc_${m}_${mode}_$(echo "$p" | md5sum | cut -c1-6).txt
    done >"$L"/conc_${m}_$mode.txt
    curl -s localhost:$port/stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["speculative"])' >"$L"/stats_${m}_$mode.txt
    kill $pid; wait $pid 2>/dev/null
  done
  for mode in ${modes#none }; do
    same=no; cmp -s "$L"/out_${m}_none.txt "$L"/out_${m}_$mode.txt && cmp -s "$L"/out_${m}_none.txt "$L"/conc_${m}_$mode.txt && same=yes
    [ $same = yes ] || fail=1
    echo "$m $mode: same greedy text as none (alone and concurrent): $same; stats $(cat "$L"/stats_${m}_$mode.txt)"
  done
done
echo "spec: $([ $fail = 0 ] && echo PASS || echo FAIL)"
