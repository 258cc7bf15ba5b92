#!/usr/bin/env bash
# ablate LOGDIR: where a batch-1 decode step's time goes inside the replayed graph: 8B decode
# rows with kernel classes left out (HEARTH_CUDA_PROFILE_SKIP mask, cuda_backend.h: 1 norms,
# 2 RoPE + KV write, 4 attention, 8 its split merge, 16 the gated product; the outputs are
# wrong, only the timing is read), each beside the full step, through ab.sh. AB_ROWS
# overrides the rows. Env from tools/gpu_round. Usage: ablate.sh LOGDIR
L=${1:?usage: ablate.sh LOGDIR}; mkdir -p $L
cd "$(dirname "$0")/../.."
S=HEARTH_CUDA_PROFILE_SKIP
rows="q4=q4km"
for m in 1 2 4 8 16 31; do rows="$rows q4-skip$m=q4km,$S=$m"; done
for m in 1 2 12 16 31; do rows="$rows bf-skip$m=l8,$S=$m"; done
rows="$rows bf=l8 q8=q8 q8-skip31=q8,$S=31 q4-again=q4km"
AB_BUDGET=${AB_BUDGET:-300} AB_ROWS="${AB_ROWS:-$rows}" tools/gpu_round.d/ab.sh $L/ab
