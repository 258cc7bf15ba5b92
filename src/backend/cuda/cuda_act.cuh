/* cuda_act.cuh: the gated activations of the MLP, act(gate) * up, as one expression per
 * function for every kernel that computes them (cuda_ops.cu's silu_mul / gelu_tanh_mul,
 * cuda_fused.cu's int8 gate, cuda_gemm.cu's bf16 / f16 GEMM input), so that all of them
 * round alike, bit for bit. Header-only; no state. */
#ifndef HEARTH_BACKEND_CUDA_ACT_CUH
#define HEARTH_BACKEND_CUDA_ACT_CUH

/* SwiGLU: silu(g) * u */
static __device__ __forceinline__ float silu_mul_value(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* GeGLU (tanh approximation, as ops_cpu.c): gelu(g) * u */
static __device__ __forceinline__ float gelu_tanh_mul_value(float g, float u) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * u;
}
#endif
