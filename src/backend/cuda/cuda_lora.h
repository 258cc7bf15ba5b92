/* cuda_lora.h: the LoRA / DoRA update kernel's entry point (cuda_lora.cu), apart from
 * cuda_backend.h so that only its users depend on it. Plain C; names no model family. */
#ifndef HEARTH_BACKEND_CUDA_LORA_H
#define HEARTH_BACKEND_CUDA_LORA_H
#include "hearth.h"
#include <stdint.h>

/* LoRA / DoRA (op_lora_apply on the device, cuda_lora.cu): one adapter's update of one
 * projection, op_lora's fields as device pointers (a NULL: the projection is left alone). */
typedef struct cuda_lora {
    const float *a, *b, *dora;
    int rank;
    float scale;
} cuda_lora;
/* The most adapters one row combines on the device (the engine's ADAPTER_MAX_SET). */
#define CUDA_LORA_MAX_SET 8
/* The widest rank the kernel takes (its shared memory): ops.h OP_LORA_MAX_RANK. */
#define CUDA_LORA_MAX_RANK 1024
/* For each row t of T with n_set[t] > 0: y[t] += the update of table entry idx of each of
 * its adapters sets[t * CUDA_LORA_MAX_SET + i] (each a device table of
 * n_layers * OP_N_PROJ entries), in order, DoRA rows then rescaled; x [T, k], y [T, n]. The
 * CPU's arithmetic (ops.c lora_row: eight partial sums per row of A combined pairwise, the
 * expansion summed over the rank in order, one rounding per product and sum): the same
 * bits. Rows with n_set[t] == 0 are not touched. sets and n_set on the device. */
hearth_status cuda_lora_apply(const cuda_lora *const *sets, const int32_t *n_set, int idx, int expert, const float *x,
                              int64_t k, float *y, int64_t n, int T, hearth_error *err);
/* The serving tier's kernels (every step outside --cuda-exact): the same update of np
 * projections that read the same input x [T, k] (q, k and v; gate and up; np <=
 * CUDA_LORA_MAX_GROUP), table entries idx[g], outputs ys[g] [T, ns[g]], in two launches per
 * CUDA_LORA_FAST_ROWS rows: shrink (u = A x for every row, projection, adapter and rank at
 * once, one block per rank) then expand (y += scale * B^T u, DoRA rescale, after each
 * adapter in order as above), in float order of their own: close to the CPU, not its bits.
 * u: device scratch of CUDA_LORA_FAST_FLOATS(max_tokens) floats (steps of up to max_tokens
 * rows). Launch shapes depend on T, k and the ns only: a decode step with adapters can be
 * captured into a CUDA graph. */
#define CUDA_LORA_MAX_GROUP 3
#define CUDA_LORA_FAST_ROWS 256
#define CUDA_LORA_FAST_FLOATS(max_tokens)                                                                              \
    ((size_t)((max_tokens) < CUDA_LORA_FAST_ROWS ? (max_tokens) : CUDA_LORA_FAST_ROWS) * CUDA_LORA_MAX_GROUP *         \
     CUDA_LORA_MAX_SET * CUDA_LORA_MAX_RANK)
hearth_status cuda_lora_apply_fast(const cuda_lora *const *sets, const int32_t *n_set, int np, const int *idx,
                                   int expert, float *const *ys, const int64_t *ns, const float *x, int64_t k, int T,
                                   float *u, hearth_error *err);
/* The serving tier on a step whose rows each have at most one adapter (T <=
 * CUDA_LORA_FAST_ROWS): the rows grouped by adapter, each adapter's factors read once per
 * projection. gtab[u]: group u's adapter table (device); gi (device int32): {U, offsets[0 ..
 * T], rows[T]}, group u's rows at rows[offsets[u] .. offsets[u + 1]) (U <= T). Rows in no
 * group keep their bits. The same rank values scratch u as cuda_lora_apply_fast, and a row's
 * sums in its order (close to the CPU, not its bits); launch shapes depend on T, k and the ns only. */
#define CUDA_LORA_GROUP_INTS(T) (2 * (size_t)(T) + 2)
/* The group tables of a step of T rows: T table pointers, then CUDA_LORA_GROUP_INTS(T) int32. */
#define CUDA_LORA_GROUP_BYTES(T) ((size_t)(T) * sizeof(void *) + CUDA_LORA_GROUP_INTS(T) * sizeof(int32_t))
hearth_status cuda_lora_apply_grouped(const cuda_lora *const *gtab, const int32_t *gi, int np, const int *idx,
                                      float *const *ys, const int64_t *ns, const float *x, int64_t k, int T, float *u,
                                      hearth_error *err);
/* expert (both tiers): the pairs of table entry idx are stacked per expert (op_lora.experts):
 * expert e's A at a + e rank k and B at b + e rank n (0 for every other entry). */
/* The row tables of rows[i] (device, n of them) into out_sets / out_n: a mixture-of-experts
 * layer's rows gathered for one expert then take their own tokens' adapters. */
hearth_status cuda_lora_gather_sets(const cuda_lora *const *sets, const int32_t *n_set, const int32_t *rows, int n,
                                    const cuda_lora **out_sets, int32_t *out_n, hearth_error *err);
#endif
