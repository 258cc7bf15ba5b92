/* matmul.h: y[T, N] = x[T, K] · W[N, K]^T on the CPU for every weight format hearth
 * loads (F32, F16, BF16, GGUF Q4_0..Q8_0 and Q2_K..Q6_K, MLX affine 2/3/4/5/6/8-bit),
 * split over a thread pool. Weights stay in their native layout in memory (the prefill
 * kernels unpack row chunks into a stack buffer during a call, AVX-512 ~23 KiB, AVX2
 * ~97 KiB; nothing is allocated or kept). Tolerances of the fast kernels: see tests/unit/test_cpu_matmul.c. */
#ifndef HEARTH_BACKEND_CPU_MATMUL_H
#define HEARTH_BACKEND_CPU_MATMUL_H
#include "base/cpu_features.h"
#include "base/threadpool.h"
#include "io/tensor.h"
#include "ops/op_weight.h"
#include <stddef.h>
#include <stdint.h>


/* Scratch bytes cpu_matmul needs for T rows of x (quantized activations); may be 0. */
size_t cpu_matmul_scratch_size(const op_weight *w, int T);
/* y (T x N floats, row-major) = x (T x K floats) times W^T. scratch must hold
 * cpu_matmul_scratch_size(w, T) bytes. tp may be NULL (one thread). Nothing is
 * allocated. Fails only on an invalid weight or a too-small scratch. */
hearth_status cpu_matmul(const op_weight *w, const float *x, int T, float *y, void *scratch,
                         size_t scratch_size, threadpool *tp, hearth_error *err);
/* The same, batch-invariant (deterministic mode): row t of y is bit-identical to what a
 * T = 1 call on row t of x gives, whatever T is. Slower for T > 1 (no weight reuse). */
hearth_status cpu_matmul_invariant(const op_weight *w, const float *x, int T, float *y, void *scratch,
                                   size_t scratch_size, threadpool *tp, hearth_error *err);
/* Several weights applied to the same x (q/k/v, gate/up): ys[i] (T x ws[i]->n) = x ws[i]^T,
 * with x prepared once and every weight's rows handed out in one thread-pool round instead
 * of one round per weight (decode of small models is bound by those rounds). Weights with
 * different K or activation preparation fall back to one call each. scratch as for
 * cpu_matmul on ws[0]. invariant: as cpu_matmul_invariant. Row results are bit-identical
 * to separate cpu_matmul / cpu_matmul_invariant calls. */
#define CPU_MATMUL_MAX_FUSED 4
hearth_status cpu_matmul_fused(int count, const op_weight *const *ws, float *const *ys, const float *x, int T,
                               void *scratch, size_t scratch_size, threadpool *tp, int invariant,
                               hearth_error *err);
/* cpu_matmul_fused with the activations kept in float where the weight's format has a
 * float-activation kernel (Q4_0, Q4_1, Q8_0 on the AVX2 and AVX-512 tiers; others, and the
 * scalar tier, as cpu_matmul_fused): no int8 rounding of x, at a few times an int8 dot's
 * cost per weight. The CPU backend spends it on the last layer's projections, whose error
 * reaches the logits undamped. Each token's rows are the same bits at every T. */
hearth_status cpu_matmul_precise(int count, const op_weight *const *ws, float *const *ys, const float *x, int T,
                                 void *scratch, size_t scratch_size, threadpool *tp, int invariant,
                                 hearth_error *err);

/* After y = x W^T from cpu_matmul / cpu_matmul_invariant (T rows of x, y T x N): in each
 * row of y, the 16 largest values (all N if fewer) are recomputed by the reference
 * kernel on the float row of x (float activations, double sums: the same bits as the
 * scalar tier's matmul of that row) and replace the fast ones; the rest stay as they are.
 * For the output projection: the fast kernels round the activations to int8 (or bf16),
 * which moves every logit a little, and the ones that decide a greedy choice and carry
 * nearly all the probability are the largest. Per row, so batch-invariant when the matmul
 * was. A no-op where w's kernel reads float activations (the scalar tier, dense formats).
 * Fails only on an invalid weight. */
hearth_status cpu_matmul_rescore_top(const op_weight *w, const float *x, int T, float *y, threadpool *tp,
                                     hearth_error *err);

/* Kernel level used by cpu_matmul: chosen once from cpu_level_active() (HEARTH_CPU);
 * cpu_matmul_set_level changes it (for tests and benchmarks; not while a matmul runs).
 * Levels above the hardware's are lowered to it. Returns the level now in use. */
cpu_level cpu_matmul_level(void);
cpu_level cpu_matmul_set_level(cpu_level level);
/* Whether w runs a vectorized kernel at the current level (1) or the scalar reference (0). */
int cpu_matmul_is_fast(const op_weight *w);
#endif
