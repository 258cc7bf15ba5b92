#!/usr/bin/env bash
# cuda-q4k: the packed-scale Q4_K decode GEMV (HEARTH_CUDA_Q4K=new, issue #5) against the
# GGUF-order one (old): test_cuda's test_gemv_q4k_new (CPU-reference oracle) and, with
# new, the multi / batch-invariance GEMV tests; gemv_bench Q4_K GB/s new vs old; the 8B
# Q4_K_M decode row new vs old back to back (PDL off). Env from tools/gpu_round. Usage: LOGDIR
L=${1:?usage: cuda-q4k.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${CQ_BUDGET:-60}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
tps() { python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('%.1f tok/s %.3f' % (j['decode_tps'], j['roofline_fraction']))" $1 2>/dev/null || echo "no result"; }
# PASS only when the named test itself ran and passed (not a skip, not a filter matching none)
res() { if grep -q "skipped: no CUDA device" $2; then echo "SKIPPED (no device: NOT a pass)";
  elif [ $1 -eq 0 ] && grep -q "OK \] $3\$" $2; then echo PASS;
  elif [ $1 -ge 124 ]; then echo "TIMEOUT(rc=$1)"; else echo "FAIL(rc=$1)"; fi; }
HEARTH_CUDA_Q4K=new HEARTH_TEST_FILTER=test_gemv_q4k_new timeout 15 $B/tests/test_cuda >$L/test_q4k_new.log 2>&1
r=$?; echo "test_gemv_q4k_new: $(res $r $L/test_q4k_new.log test_gemv_q4k_new)"
[ $r -ne 0 ] && grep -m3 -i "error\|fail\|y\[" $L/test_q4k_new.log | cut -c1-240
for m in new old; do
  [ $(left) -lt 38 ] && { echo "gemv_bench $m: NOT RUN (time)"; continue; }
  HEARTH_CUDA_PDL=0 HEARTH_CUDA_Q4K=$m GEMV_BENCH_FORMATS=Q4_K timeout 8 $B/bench/gemv_bench $L/gemv_$m.json >$L/gemv_$m.log 2>&1
done
python3 - $L <<'PY' 2>/dev/null || echo "gemv_bench: no result (see gemv_*.log)"
import json, sys
d = sys.argv[1]; r = {}
for m in ("new", "old"):
    try: r[m] = {(x["n"], x["k"]): x["gbs"] for x in json.load(open(f"{d}/gemv_{m}.json"))["rows"]}
    except Exception: r[m] = {}
keys = sorted(set(r["new"]) | set(r["old"]), key=lambda s: (s[1], s[0]))
if not keys: sys.exit(1)
print("Q4_K GEMV GB/s new/old: " + ", ".join("%dx%d %s/%s" % (n, k, "%.0f" % r["new"][(n, k)] if (n, k) in r["new"] else "-",
      "%.0f" % r["old"][(n, k)] if (n, k) in r["old"] else "-") for n, k in keys))
PY
for i in $(seq 1 60); do [ -f $G8/.done ] && break; [ $(left) -lt 30 ] && break; sleep 1; done
for m in new old; do
  [ $(left) -lt 12 ] && { echo "8B Q4_K_M $m: NOT RUN (time)"; continue; }
  HEARTH_CUDA_PDL=0 HEARTH_CUDA_Q4K=$m timeout $(( $(left) > 27 ? 25 : $(left) - 2 )) $H bench $G8/llama8b-q4_k_m.gguf --device cuda -p 512 -n 128 -r 3 --json >$L/q4km_$m.json 2>$L/q4km_$m.log
  echo "8B Q4_K_M decode (PDL=0) Q4K=$m: $(tps $L/q4km_$m.json)"
done
for t in test_gemv_multi test_gemv_batch_invariant; do
  [ $(left) -lt 8 ] && { echo "$t (Q4K=new): NOT RUN (time)"; continue; }
  HEARTH_CUDA_Q4K=new HEARTH_TEST_FILTER=$t timeout $(( $(left) - 2 )) $B/tests/test_cuda >$L/${t}_new.log 2>&1
  r=$?; echo "$t (Q4K=new): $(res $r $L/${t}_new.log $t)"; [ $r -ne 0 ] && grep -m2 -i "error\|fail" $L/${t}_new.log | cut -c1-240
done
if [ $(left) -ge 12 ]; then # the float-activation Q4_K kernel reading the packed order
  HEARTH_CUDA_GEMV_F32ACT=1 HEARTH_CUDA_Q4K=new HEARTH_TEST_FILTER=test_gemv_q4k_new timeout $(( $(left) - 2 )) $B/tests/test_cuda >$L/test_q4k_new_f32act.log 2>&1
  r=$?; echo "test_gemv_q4k_new (F32ACT=1): $(res $r $L/test_q4k_new_f32act.log test_gemv_q4k_new)"; [ $r -ne 0 ] && grep -m2 -i "error\|fail" $L/test_q4k_new_f32act.log | cut -c1-240
else echo "test_gemv_q4k_new (F32ACT=1): NOT RUN (time)"; fi
