/* half.h: IEEE fp16 and bfloat16 <-> float32 conversion, exact (the same bits numpy
 * and mlx produce), inline for use in dequantizers and kernels. */
#ifndef HEARTH_BASE_HALF_H
#define HEARTH_BASE_HALF_H
#include <stdint.h>
#include <string.h>

static inline float half_bits_to_f32(uint32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
static inline uint32_t half_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float bf16_to_f32(uint16_t h) { return half_bits_to_f32((uint32_t)h << 16); }

/* Round-to-nearest-even, NaN kept quiet. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = half_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return half_bits_to_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return half_bits_to_f32(sign | 0x7f800000u | (man << 13));
    return half_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u = half_f32_to_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
    if (a < 0x38800000u) { /* subnormal or zero in f16 */
        float v = half_bits_to_f32(a) * 16777216.0f; /* scale to units of 2^-24 */
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}
#endif
