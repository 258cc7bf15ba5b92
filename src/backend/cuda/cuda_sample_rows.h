/* cuda_sample_rows.h: the per-row records the device sampler (cuda_sample.cu) uploads and
 * downloads each step, apart from the kernel so that their sizes are known to plain C
 * (cuda_sampler_sizes_make in cuda_plan.c, which any build compiles). */
#ifndef HEARTH_BACKEND_CUDA_SAMPLE_ROWS_H
#define HEARTH_BACKEND_CUDA_SAMPLE_ROWS_H
#include "backend/cuda/cuda_sample.h"
#include <stdint.h>

/* Entries per row: its logit-bias entries, then its penalty window's (id, count) pairs. */
#define CUDA_SAMPLE_ROW_ENTRIES (CUDA_SAMPLE_MAX_BIAS + CUDA_SAMPLE_MAX_WINDOW)

/* A row's parameters as the kernel reads them; the float products sampler.c forms from
 * the request (1/T, 40*T, log(min_p)/inv_t) are made on the host, with its rounding. */
typedef struct cuda_sample_row_params {
    float temp, temp40, inv_t, top_p;
    int top_k, n_top, want_lp, min_p_on, top_p_on;
    double min_p_lim;
    float rep, presence, frequency;
    int rep_on;
    int bias_off, n_bias, pen_off, n_pen; /* entries: (id, bias) sorted by id; (id, count) */
    int has_allow, allow_n;               /* the constraint's mask: row r's words at r * words */
    uint32_t key0, key1, pos0, pos1;
} cuda_sample_row_params;

typedef struct cuda_sample_row_out {
    int32_t token; /* -1: the row held a non-finite value */
    float logprob;
    int32_t top_ids[HEARTH_MAX_TOP_LOGPROBS];
    float top_lp[HEARTH_MAX_TOP_LOGPROBS];
} cuda_sample_row_out;
#endif
