/* cuda_sample.h: next-token sampling for all logits rows of a step on the GPU, one kernel
 * launch (cuda_sample.cu), each row with its own parameters and sampler.c's semantics.
 * Declared for every build; the functions exist only with the CUDA backend
 * (HEARTH_HAVE_CUDA). Buffers are made once by cuda_sampler_create, never per step. */
#ifndef HEARTH_BACKEND_CUDA_SAMPLE_H
#define HEARTH_BACKEND_CUDA_SAMPLE_H
#include "hearth.h"
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Per row, what the device path takes (entries uploaded each step; beyond these the caller
 * keeps the host sampler): logit-bias entries, and the penalty window (distinct ids in it). */
#define CUDA_SAMPLE_MAX_BIAS 1024
#define CUDA_SAMPLE_MAX_WINDOW 4096

typedef struct cuda_sampler cuda_sampler;

/* The buffers cuda_sampler_create makes for max_rows rows of a vocab-token vocabulary, in
 * bytes: five on the device, each with a pinned host copy of its size (the rows' parameters,
 * their bias and penalty entries' ids and values, their results, their constraint masks),
 * and two in host memory (the penalty counts over the vocabulary, the bias order). The one
 * sizing the sampler allocates by and cuda_plan counts (cuda_plan.c: any build). */
typedef struct cuda_sampler_sizes {
    size_t params, entry_ids, entry_values, results, masks; /* device, and pinned host alike */
    size_t counts, order;                                   /* host */
} cuda_sampler_sizes;
void cuda_sampler_sizes_make(int max_rows, int vocab, cuda_sampler_sizes *z);
/* The device buffers' bytes (params + entries + results + masks): cuda_sampler_device_bytes. */
size_t cuda_sampler_sizes_device(const cuda_sampler_sizes *z);

/* One row to sample: sampler_sample's arguments, plus the row's Philox key. The token is
 * drawn with the counter (n_history, the position it will take), so a (seed, position)
 * gives the same token whatever else is in the batch and wherever the row sits in it. */
typedef struct cuda_sample_req {
    const hearth_sampling *p;
    const int32_t *history; /* the sequence so far (prompt + generated), for the penalties */
    size_t n_history;
    uint64_t seed;
    hearth_logprobs *lp; /* NULL: no logprobs; else the chosen token's and lp->n alternatives */
    /* a constraint's token mask (generate.c's constrained_logits on the device): NULL none;
     * else token v < allow_n may be drawn when bit v % 32 of allow[v / 32] is set, and every
     * other token's logit is -inf before the bias and penalties */
    const uint32_t *allow;
    int32_t allow_n;
} cuda_sample_req;

/* Whether the device path takes these parameters (bias and penalty window within the caps;
 * any constraint mask). */
int cuda_sample_supported(const hearth_sampling *p);
hearth_status cuda_sampler_create(int max_rows, int vocab, cuda_sampler **out, hearth_error *err);
void cuda_sampler_free(cuda_sampler *s);
size_t cuda_sampler_device_bytes(const cuda_sampler *s);
/* Samples rows of device logits [rows, vocab] (rewritten in place with bias and penalties
 * applied): ids[i] gets row i's token and req[i].lp its logprobs. A row holding a non-finite
 * value fails the call with HEARTH_ERR_FORMAT (the engine's non-finite logits error).
 * Stream-ordered after whatever wrote the logits; returns when the ids are on the host. */
hearth_status cuda_sampler_run(cuda_sampler *s, float *logits, int rows, const cuda_sample_req *req, int32_t *ids,
                               hearth_error *err);
/* cuda_sampler_run that also writes, for tests, mask[i * vocab + v] = 1 when token v of row i
 * survives every filter (the set the draw is made from; the argmax alone when greedy), else
 * 0. mask is device memory [rows, vocab]. */
hearth_status cuda_sampler_run_masked(cuda_sampler *s, float *logits, int rows, const cuda_sample_req *req,
                                      int32_t *ids, uint8_t *mask, hearth_error *err);
/* Philox4x32-10 (Salmon et al., SC'11), the host copy of the device's generator. */
void cuda_sample_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
#ifdef __cplusplus
}
#endif
#endif
