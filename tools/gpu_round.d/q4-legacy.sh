#!/usr/bin/env bash
# q4-legacy LOGDIR: GGUF Q4_0 on the GPU as MLX 4-bit with groups of 32 (cuda_device.cu): the
# whole test_cuda (test_gemv_q4_legacy: Q4_0 / Q4_1 GEMVs and GEMMs against the CPU reference),
# greedy traces of a tiny Q4_0 GGUF (tools/cuda_gguf8b.py --arch tiny: k = 256, the float MLX
# kernel) on the GPU in the exact and default tiers against the CPU scalar tier, then the 8B
# Q4_0 GGUF (k % 1024 == 0: the v3 int8 GEMV): a decode row and its greedy trace against the
# CPU's. Env from tools/gpu_round. Budget: QL_BUDGET (s, default 240). Usage: q4-legacy.sh LOGDIR
L=${1:?usage: q4-legacy.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET=${QL_BUDGET:-240}
. tools/gpu_round.d/base.inc
test_cuda_run 120 6 "^\[  FAILED|error|mismatch|y\["
python3 tools/cuda_gguf8b.py /tmp/tq40.gguf q4_0 --arch tiny >/dev/null 2>&1
IDS='[1,5,9,13,17,21,25,29,33,37,41,45,49,53,57,61,65,69,73,77]'
HEARTH_CPU=scalar timeout 20 $H trace /tmp/tq40.gguf --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cpu >$L/tiny_cpu.json 2>$L/tiny.log
for mode in f32 bf16; do
  HEARTH_CUDA_GEMM=$mode timeout 20 $H trace /tmp/tq40.gguf --ids "$IDS" --last 4 --top 8 --steps 24 --step-top 8 --device cuda >$L/tiny_$mode.json 2>>$L/tiny.log
  echo "tiny Q4_0 GGUF, GPU $mode vs CPU scalar: $(python3 tools/cuda_check_parity.py $L/tiny_cpu.json $L/tiny_$mode.json 2>&1 | tail -1)"
done
Q=$G8/llama8b-q4_0.gguf
for i in $(seq 1 60); do [ -f $Q ] && break; sleep 1; done
[ $(left) -gt 60 ] && { timeout 60 $H bench $Q --device cuda -p 512 -n 128 -r 3 --json >$L/q40.json 2>$L/q40.log; echo "8B Q4_0 GGUF: $(tps $L/q40.json)"; }
I8='[128000,791,6864,315,9822,374,12366,13,578,6864,315,9635,374]'
for d in cuda cpu; do
  [ $(left) -lt 25 ] && { echo "8B trace $d: NOT RUN (time)"; continue; }
  timeout $(( $(left) - 5 )) $H trace $Q --ids "$I8" --steps 8 --step-top 3 --top 3 --last 1 --device $d >$L/q40_trace_$d.json 2>$L/q40_trace_$d.log
done
trace_cmp $L/q40_trace_cuda.json $L/q40_trace_cpu.json "8B Q4_0 GGUF, GPU vs CPU"
