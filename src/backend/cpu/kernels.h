/* kernels.h: internal interface between matmul.c (threading, activation preparation) and
 * the per-ISA kernel files. A kernel computes y[n] for rows n0..n1-1 of one weight against
 * one prepared activation row. Not part of the backend's public API. */
#ifndef HEARTH_BACKEND_CPU_KERNELS_H
#define HEARTH_BACKEND_CPU_KERNELS_H
#include "backend/cpu/matmul.h"
#include <string.h>

/* One activation block of 32 values quantized to int8 (q = round(x / d), d = amax / 127),
 * with the sums of q over each half, which the unsigned-weight formats need to undo their
 * offset (sum((q_w - 8) * q_x) = sum(q_w * q_x) - 8 * sum(q_x)). */
typedef struct cpu_q8_block {
    float d;
    int16_t sum16[2]; /* sum of q[0..15], q[16..31] */
    int8_t q[32];
} cpu_q8_block;

/* How a kernel wants its activation row. */
typedef enum cpu_act {
    CPU_ACT_F32,       /* the float row as given */
    CPU_ACT_Q8,        /* cpu_q8_block per 32 values, in order */
    CPU_ACT_Q8_EVENODD, /* per block: the 16 even-indexed values, then the 16 odd ones (MLX 4-bit
                           packs element 2i and 2i+1 into one byte's low and high nibble) */
    CPU_ACT_BF16        /* the row rounded to bf16 (nearest even), k values; k % 32 == 0 */
} cpu_act;

typedef void (*cpu_rows_fn)(const op_weight *w, int64_t n0, int64_t n1, const void *x, float *y);
/* The same for T activation rows at once (prefill): row t of x starts x_stride activation
 * blocks (CPU_ACT_F32: floats; CPU_ACT_BF16: bf16 values) after row t - 1, and y[t * y_stride + n] receives row n. Lets a kernel reuse each
 * unpacked weight block across several tokens. */
typedef void (*cpu_tile_fn)(const op_weight *w, int64_t n0, int64_t n1, const void *x, int64_t x_stride, int T,
                            float *y, int64_t y_stride);

typedef struct cpu_kernel {
    cpu_rows_fn rows;
    cpu_act act;
    cpu_tile_fn tile; /* optional (NULL: rows is called once per activation row) */
    /* optional: used instead of tile when T < CPU_TILE_SMALL_T (batched decode). The
     * AVX-512 prefill tiles unpack 16 rows per pass, which pays off from about 8 tokens;
     * below that the register-blocked 4x4 tiles are faster (crossover near T = 7, for the
     * AVX2 packed tiles too: bench/results/kernel_choices.md, "CPU small tiles"). */
    cpu_tile_fn tile_small;
    /* tile_small runs below this T (0: CPU_TILE_SMALL_T). The AVX-512 kernels set
     * CPU_TILE_SMALL_T_AVX512: for batched decode of 1B-class weights from DRAM the small
     * tiles stay faster up to 16 tokens (bench/results/kernel_choices.md, "CPU small
     * tiles"). */
    int small_below;
} cpu_kernel;
#define CPU_TILE_SMALL_T 7
#define CPU_TILE_SMALL_T_AVX512 17

/* Scalar reference: dequantizes each block to float and accumulates in double. Handles
 * every format op_weight_check accepts; x is a float row (CPU_ACT_F32). */
void cpu_ref_rows(const op_weight *w, int64_t n0, int64_t n1, const void *x, float *y);
/* The same for count rows of w listed in rows (any order, repeats allowed): out[i] gets
 * row rows[i], bit-identical to what cpu_ref_rows gives for that row. */
void cpu_ref_rows_at(const op_weight *w, const int64_t *rows, int count, const float *x, float *out);
/* The same for T float rows (x row t at x + t * x_stride), bit-identical to T calls of
 * cpu_ref_rows; matmul.c uses it for prefill on the scalar tier. */
void cpu_ref_tile(const op_weight *w, int64_t n0, int64_t n1, const float *x, int64_t x_stride, int T, float *y,
                  int64_t y_stride);

/* Float-activation kernels for quantized weights (kernels_f32act.c, AVX2+FMA and AVX-512 at
 * level >= CPU_LEVEL_AVX512): Q4_0, Q4_1, Q8_0; cpu_matmul_precise's. */
int cpu_f32act_kernel(const op_weight *w, cpu_level level, cpu_kernel *out);
/* Fast kernels: fill *out and return 1 if the format has one at that level. */
int cpu_avx2_kernel(const op_weight *w, cpu_kernel *out);
int cpu_avx512_kernel(const op_weight *w, cpu_kernel *out);
/* BF16 weights with vdpbf16ps (kernels_avx512_bf16.c): 1 when the CPU has AVX512_BF16 and k %
 * 32 == 0; the activations are CPU_ACT_BF16 rows, made by
 * cpu_avx512_bf16_row (k % 32 == 0; only where the kernel was chosen). */
int cpu_avx512_bf16_kernel(const op_weight *w, cpu_kernel *out);
void cpu_avx512_bf16_row(const float *x, int64_t k, uint16_t *out);
/* The AVX2 one-row decode kernel built with AVX-512 VNNI dots (same bits as its AVX2 form),
 * for the formats that have one (Q4_0, Q4_1), else NULL; only on CPUs with AVX-512 VNNI. */
cpu_rows_fn cpu_avx2_vnni_rows(const op_weight *w);
/* The 512-bit one-row decode kernel (kernels_avx512_rows.c) for the formats and K that have
 * one (Q8_0, Q4_K, Q6_K; K a multiple of 256 up to 16384), else NULL; only on CPUs with
 * AVX-512 VNNI. */
cpu_rows_fn cpu_avx512_rows1(const op_weight *w);

/* Quantizes a row of k floats (k a multiple of 32) to int8 blocks (per block d = amax / 127,
 * q = round-to-nearest-even(x / d) clamped to +-127), in order or CPU_ACT_Q8_EVENODD order.
 * cpu_quantize_row picks the AVX-512 or AVX2 form where it can; every form gives identical bytes. */
void cpu_quantize_row_ref(const float *x, int64_t k, cpu_q8_block *out, int evenodd);
/* The first i in from..n-1 with y[i] > floor (never a NaN), else n; 32 values per step. */
int64_t cpu_avx2_find_above(const float *y, int64_t from, int64_t n, float floor);
void cpu_quantize_row(const float *x, int64_t k, cpu_q8_block *out, int evenodd);
void cpu_avx512_quantize_row(const float *x, int64_t k, cpu_q8_block *out, int evenodd);
void cpu_avx2_quantize_row(const float *x, int64_t k, cpu_q8_block *out, int evenodd);

/* The eight 6-bit scales sc_c (byte c of *sc) and mins m_c (byte c of *mn) of a Q4_K / Q5_K
 * super-block at blk (f16 d, f16 dmin, then 12 bytes): sub-blocks 0..3 are the low 6 bits
 * of bytes 0..3 (scales) and 4..7 (mins); 4..7 a nibble of bytes 8..11 plus the top two bits
 * of bytes 0..3 (scales) or 4..7 (mins). */
static inline void cpu_q4k_scales_mins(const uint8_t *blk, uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, blk + 4, 4);
    memcpy(&u1, blk + 8, 4);
    memcpy(&u2, blk + 12, 4);
    uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
    uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
    *sc = (uint64_t)(u0 & 0x3f3f3f3fu) | (uint64_t)sc_hi << 32;
    *mn = (uint64_t)(u1 & 0x3f3f3f3fu) | (uint64_t)mn_hi << 32;
}

#endif
