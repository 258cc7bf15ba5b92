/* op_exp.h: op_expf, an exp for the rules every backend must compute to the same bits
 * (op_moe_route's softmaxes, on the host and in cuda_moe.cu's routing kernel). Libraries'
 * expf differ in their last bit between glibc and CUDA; this one is only fmaf, one
 * subtraction and multiplications by powers of two, each correctly rounded on both, so a
 * host and a device compute the same float. Within 2 ulp of exp (test_ops checks it
 * against the C library's double exp). Header-only; no state. */
#ifndef HEARTH_OPS_OP_EXP_H
#define HEARTH_OPS_OP_EXP_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define OP_EXP_FN __host__ __device__ static inline
#else
#define OP_EXP_FN static inline
#endif

/* 2^k as a float, for -126 <= k <= 127 (a normal number: exact). */
OP_EXP_FN float op_exp2i(int k) {
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

OP_EXP_FN float op_expf(float x) {
    if (x != x) return x;
    if (x < -104.0f) return 0.0f;          /* below half the smallest subnormal */
    if (x > 89.0f) return (float)HUGE_VAL; /* above FLT_MAX */
    /* k = round(x / ln 2) by the 1.5 * 2^23 shift (|x / ln 2| < 2^22: exact), then
     * r = x - k ln 2 with ln 2 split in a high part exact in k * hi and a low part */
    const float shift = 12582912.0f;
    float kf = fmaf(x, 1.44269502f, shift) - shift;
    float r = fmaf(kf, -0.693145752f, x);
    r = fmaf(kf, -1.42860677e-6f, r);
    /* exp(r), |r| <= 0.3466: its Taylor series to r^7 (error below 6e-9 relative) */
    float p = 1.98412698e-4f;
    p = fmaf(p, r, 1.38888889e-3f);
    p = fmaf(p, r, 8.33333333e-3f);
    p = fmaf(p, r, 4.16666667e-2f);
    p = fmaf(p, r, 1.66666667e-1f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    /* times 2^k in two exact factors (k in [-150, 129]: each half a normal power) */
    int k = (int)kf, k1 = k / 2;
    return p * op_exp2i(k1) * op_exp2i(k - k1);
}
#undef OP_EXP_FN
#endif
