/* cuda_affine.h: the CUDA backend's generic layout for the quantized formats that have no
 * format-specific kernel (device dtype DT_AFFINE): MLX affine 2/3/5/6/8-bit (and 4-bit where
 * the 4-bit kernels do not take it), GGUF Q5_0, Q5_1, Q2_K, Q3_K and Q5_K. Each of them is
 * "code times scale plus bias" per group of weights, with integer codes of b bits:
 *
 *   format   bits  group  scale            bias
 *   MLX      b     g      s                b                (f16 / bf16 / f32 on file)
 *   Q5_0     5     32     d                -16 d
 *   Q5_1     5     32     d                m
 *   Q2_K     2     16     d * (sc & 15)    -dmin * (sc >> 4)
 *   Q3_K     3     16     d * (sc - 32)    -4 d (sc - 32)   (code = low 2 bits + 4 * hmask bit)
 *   Q5_K     5     32     d * sc           -dmin * m        (code = low nibble + 16 * qh bit)
 *
 * Every scale and bias is exact in f32 (a f16 times a small integer), and so is code times
 * scale; code * scale + bias rounds once, as the reference dequantizers do, so the device
 * dequantizes to the CPU reference's values (tests/unit/test_cuda_affine.c checks every
 * format against op_weight_dequant, on any machine).
 *
 * Device layout of an [n, k] weight (k % 32 == 0): the codes split into a low plane of
 * lo = cuda_affine_lo_bits(b) bits (8, 4 or 2) and, for b = 6, 5, 3, a high plane of
 * b - lo bits (2, 1, 1). Each plane holds, per row, per chunk of 32 weights, w 32-bit words
 * (w its width in bits; rows and chunks in order), and weight 4 m + j of a chunk (m < 8,
 * j < 4) sits in byte j of word m % w at bit w * (m / w) of that byte: one shift and one mask
 * give the codes of four consecutive weights as four bytes, ready for __dp4a against four
 * int8 activations. Then one float2 (scale, bias) per group, [n][k / g]; g is 16 or a
 * multiple of 32 (32, 64, 128), so a chunk lies in one group or covers two whole ones.
 * Bytes per weight: b / 8 + 8 / g (Q3_K: 7 bits against 3.44 in the file, MLX 8-bit g64:
 * 9 against 8.5); the f32 expansion it replaces took 32. */
#ifndef HEARTH_CUDA_AFFINE_H
#define HEARTH_CUDA_AFFINE_H
#include "ops/op_weight.h"
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Whether w goes to the device in this layout; *bits and *group then say how. */
int cuda_affine_takes(const op_weight *w, int *bits, int *group);

#ifdef __CUDACC__
__host__ __device__
#endif
static inline int cuda_affine_lo_bits(int bits) { return bits == 8 ? 8 : bits >= 4 ? 4 : 2; }

/* Where weight e (< 32) of a chunk lives in a plane of width w: word (within the chunk's w
 * words) and bit. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline void cuda_affine_slot(int e, int w, int *word, int *bit) {
    int m = e / 4, j = e % 4;
    *word = m % w;
    *bit = 8 * j + w * (m / w);
}

/* Bytes of the code planes (low then high) and of the (scale, bias) pairs. */
size_t cuda_affine_code_bytes(int64_t n, int64_t k, int bits);
size_t cuda_affine_pair_bytes(int64_t n, int64_t k, int group);

/* Row r of w as codes[k] (0 .. 2^bits - 1) and sb[2 * (k / group)] (scale, bias). */
void cuda_affine_row(const op_weight *w, int64_t r, int bits, int group, uint8_t *codes, float *sb);

/* Packs row r's codes[k] into the planes of an [n, k] weight whose code bytes start at planes
 * (the row's words are overwritten, other rows' left alone). */
void cuda_affine_pack_row(const uint8_t *codes, int64_t n, int64_t k, int bits, int64_t r, uint8_t *planes);

/* Code of element (r, c) from the planes (the inverse of cuda_affine_pack_row; tests). */
int cuda_affine_code(const uint8_t *planes, int64_t n, int64_t k, int bits, int64_t r, int64_t c);

#ifdef __cplusplus
}
#endif
#endif
