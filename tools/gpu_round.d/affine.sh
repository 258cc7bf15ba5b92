#!/usr/bin/env bash
# affine LOGDIR: the generic affine device layout (cuda_affine.h: MLX 2/3/5/6/8-bit, GGUF
# Q5_0/Q5_1/Q2_K/Q3_K/Q5_K kept as b-bit codes instead of f32): test_cuda_affine (host
# packing against the CPU reference) and test_cuda (test_gemv_affine: GEMV, dequantizer and
# prefill GEMM against the CPU reference); greedy traces on the GPU (exact and default tiers) against the
# CPU scalar tier for a tiny GGUF of each new format and the tiny MLX 3/5/6/8-bit models; the
# 8B MLX 8-bit and Q5_K_M models: decode/prefill rows, the same rows on the commit before
# (f32 expansion; AF_BASE=1), and an 8-step greedy trace GPU vs CPU. Env from tools/gpu_round (GR_MODELS
# with m8 q5_k_m). Budget: AF_BUDGET (s, default 480). Usage: affine.sh LOGDIR
L=${1:?usage: affine.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${AF_BUDGET:-480}
. tools/gpu_round.d/base.inc
[ -n "${AF_BASE:-}" ] && base_build # the rows before this layout (f32 expansion): AF_BASE=1
timeout 60 $B/tests/test_cuda_affine >$L/test_cuda_affine.log 2>&1
echo "test_cuda_affine rc $?: $(grep -c 'OK \]' $L/test_cuda_affine.log) ok"
test_cuda_run 150 8 "^\[  FAILED|error|mismatch|y\[|reference"
IDS='[1,5,9,13,17,21,25,29,33,37,41,45,49,53,57,61,65,69,73,77,81,85,89,93,97,101,105,109,113,117,121,125,129,133,137,141,145,149,153,157]'
pair() { # MODEL NAME: CPU scalar vs GPU exact / default
  HEARTH_CPU=scalar timeout 30 $H trace $1 --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cpu >$L/t_$2_cpu.json 2>$L/t_$2.log
  for mode in f32 bf16; do
    HEARTH_CUDA_GEMM=$mode timeout 30 $H trace $1 --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cuda >$L/t_$2_$mode.json 2>>$L/t_$2.log
    echo "$2 GPU $mode vs CPU scalar: $(python3 tools/cuda_check_parity.py $L/t_$2_cpu.json $L/t_$2_$mode.json 2>&1 | tail -1 | cut -c1-200)"
  done
  grep -i "expand" $L/t_$2.log | head -2
}
for k in q5_k_m q3_k_m q2_k q5_0 q5_1; do
  python3 tools/cuda_gguf8b.py /tmp/t_$k.gguf $k --arch tiny >/dev/null 2>&1 && pair /tmp/t_$k.gguf gguf_$k
done
for m in llama-q5g64 qwen3-q3g32 gemma3-q6g64 llama-q8g64 qwen3-q8g32 gemma3-q8g64; do pair $TINY/$m $m; done
[ $(left) -gt 100 ] && for i in $(seq 1 120); do [ -f $M8/.done ] && [ -f $G8/llama8b-q5_k_m.gguf ] && break; sleep 1; done
for m in $M8 $G8/llama8b-q5_k_m.gguf; do
  n=$(basename $m)
  [ $(left) -gt 60 ] || { echo "$n: NOT RUN (time)"; continue; }
  timeout 60 $H bench $m --device cuda -p 512 -n 128 -r 3 --json >$L/$n.json 2>$L/$n.log; echo "$n now: $(tps $L/$n.json); $(grep -m1 -i 'expand\|weights' $L/$n.log | cut -c1-160)"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader >>$L/$n.log
done
for m in $M8 $G8/llama8b-q5_k_m.gguf; do
  n=$(basename $m)
  [ $(left) -gt 80 ] && [ -x $HB ] || { echo "$n base: NOT RUN (time or no base build)"; continue; }
  timeout 75 $HB bench $m --device cuda -p 512 -n 128 -r 2 --json >$L/${n}_base.json 2>$L/${n}_base.log; echo "$n before (f32 expansion): $(tps $L/${n}_base.json)"
done
I8='[128000,791,6864,315,9822,374,12366,13,578,6864,315,9635,374]'
Q=$G8/llama8b-q5_k_m.gguf
for d in cuda cpu; do
  [ $(left) -lt 30 ] || [ ! -f $Q ] && { echo "8B Q5_K_M trace $d: NOT RUN (time)"; continue; }
  timeout $(( $(left) - 5 )) $H trace $Q --ids "$I8" --steps 8 --step-top 3 --top 3 --last 1 --device $d >$L/q5k_trace_$d.json 2>$L/q5k_trace_$d.log
done
trace_cmp $L/q5k_trace_cuda.json $L/q5k_trace_cpu.json "8B Q5_K_M GGUF, GPU vs CPU"
