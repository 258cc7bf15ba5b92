/* cuda_attn_gate.cu: gated attention's two element-wise steps (op_attn.gated): the
 * doubled q projection split into its queries, and the attention output times sigmoid of
 * the gates, as the CPU backend's loops compute them (one rounding order, float32). */
#include "backend/cuda/cuda_internal.h"

/* q[t, h, :] = qg[t, h, 0:hd] (qg per head: hd queries, then hd gates). */
__global__ void attn_gate_split_kernel(const float *qg, float *q, size_t n, int hd) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    size_t head = e / hd, i = e % hd;
    q[e] = qg[head * 2 * hd + i];
}

/* att[t, h, i] *= sigmoid(qg[t, h, hd + i]). */
__global__ void attn_gate_apply_kernel(float *att, const float *qg, size_t n, int hd) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    size_t head = e / hd, i = e % hd;
    att[e] *= 1.0f / (1.0f + expf(-qg[head * 2 * hd + hd + i]));
}

extern "C" hearth_status cuda_attn_gate_split(const float *qg, float *q, int T, int n_heads, int head_dim,
                                              hearth_error *err) {
    size_t n = (size_t)T * n_heads * head_dim;
    if (!n) return HEARTH_OK;
    attn_gate_split_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(qg, q, n, head_dim);
    return cuda_launched("attn_gate_split", err);
}

extern "C" hearth_status cuda_attn_gate_apply(float *att, const float *qg, int T, int n_heads, int head_dim,
                                              hearth_error *err) {
    size_t n = (size_t)T * n_heads * head_dim;
    if (!n) return HEARTH_OK;
    attn_gate_apply_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(att, qg, n, head_dim);
    return cuda_launched("attn_gate_apply", err);
}
