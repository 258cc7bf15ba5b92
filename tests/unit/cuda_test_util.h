/* cuda_test_util.h: helpers shared by the CUDA kernel tests (include after cmocka.h and
 * cuda_backend.h): a seeded xorshift64* stream, bf16 rounding as the tensor-core kernels
 * do it, and device buffers made from host data. Test code only; not a test itself. */
#ifndef HEARTH_TESTS_CUDA_TEST_UTIL_H
#define HEARTH_TESTS_CUDA_TEST_UTIL_H
#include <stdint.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline uint32_t rnd(void) { /* xorshift64*, reseeded from the clock in main */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static inline float rndf(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* x rounded to bf16 (round to nearest even), as the tensor-core prefill rounds q, k and v */
static inline float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* A device buffer of `bytes`, holding `host` when given (else uninitialised). */
static inline void *dev_upload(const void *host, size_t bytes) {
    void *d = NULL;
    assert_int_equal(cuda_alloc(&d, bytes, "test buffer", NULL), HEARTH_OK);
    if (host) assert_int_equal(cuda_upload(d, host, bytes, NULL), HEARTH_OK);
    return d;
}
#endif
