/* kernels_avx512.c: AVX-512 (F/BW/VL/VNNI) instances of the x86 row kernels
 * (kernels_x86.inc). vpdpbusd sums four u8 x s8 products straight into i32 without
 * saturation, replacing maddubs + madd, and takes the full 0..255 range for MLX 8-bit. */
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include <immintrin.h>
#include <string.h>

#define KTARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define PFX(name) avx512_##name

__attribute__((target(KTARGET))) static inline __m256i avx512_dot_u8s8(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}
__attribute__((target(KTARGET))) static inline __m256i avx512_dot_s8s8(__m256i a, __m256i b) {
    return avx512_dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

#define DOT_U8S8 avx512_dot_u8s8
#define DOT_S8S8 avx512_dot_s8s8
#define MLX8_DOT avx512_dot_u8s8
#define MLX8_OFFSET 0

#include "backend/cpu/kernels_x86.inc"

int cpu_avx512_kernel(const cpu_weight *w, cpu_kernel *out) { return avx512_select(w, out); }
