/* kernels_avx2.c: AVX2+FMA+F16C instances of the x86 row kernels (kernels_x86.inc).
 * Integer dots use maddubs (u8 x s8 -> saturating i16 pairs) + madd (-> i32); every
 * caller keeps the unsigned operand <= 128 so the i16 pair sum cannot saturate. */
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include <immintrin.h>
#include <string.h>

#define KTARGET "avx2,fma,f16c"
#define PFX(name) avx2_##name

__attribute__((target(KTARGET))) static inline __m256i avx2_dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* Signed x signed: move the sign of a onto b so the unsigned operand is |a| <= 128. */
__attribute__((target(KTARGET))) static inline __m256i avx2_dot_s8s8(__m256i a, __m256i b) {
    return avx2_dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}
/* u8 in 0..255 would saturate maddubs: use q - 128 (xor 0x80) as a signed byte. */
__attribute__((target(KTARGET))) static inline __m256i avx2_mlx8_dot(__m256i u, __m256i s) {
    return avx2_dot_s8s8(_mm256_xor_si256(u, _mm256_set1_epi8((char)0x80)), s);
}

#define DOT_U8S8 avx2_dot_u8s8
#define DOT_S8S8 avx2_dot_s8s8
#define MLX8_DOT avx2_mlx8_dot
#define MLX8_OFFSET 128

#include "backend/cpu/kernels_x86.inc"

int cpu_avx2_kernel(const cpu_weight *w, cpu_kernel *out) { return avx2_select(w, out); }
