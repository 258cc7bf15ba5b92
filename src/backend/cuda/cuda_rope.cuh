/* cuda_rope.cuh: the one RoPE rotation every GPU kernel that rotates uses (cuda_ops.cu's
 * rope, cuda_fused.cu's rope_qk, cuda_kv.cu's rope_kv_write), so they agree bit for bit.
 * Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_ROPE_CUH
#define HEARTH_BACKEND_CUDA_ROPE_CUH

/* Rotates pair i (< head_dim / 2 = half) of one head's vector v at position p: elements
 * (2i, 2i + 1) when adjacent (GPT-J order), else (i, i + half) (NeoX order). */
static __device__ __forceinline__ void rope_rotate_pair(float *v, int i, int half, int p, const float *inv_freq,
                                                        int adjacent) {
    float theta = (float)p * inv_freq[i];
    float c = cosf(theta), s = sinf(theta);
    int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
    float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}
#endif
