/* ops_encoder.h: the ops an encoder (BERT family) forward pass needs beyond ops.h:
 * LayerNorm with bias, exact (erf) GELU, bias rows, and bidirectional attention within
 * each sequence of a ragged batch (no KV cache: encoders see their whole input at once).
 * Float32 rows in caller-owned buffers; nothing is allocated. */
#ifndef HEARTH_OPS_OPS_ENCODER_H
#define HEARTH_OPS_OPS_ENCODER_H
#include "base/threadpool.h"
#include <stddef.h>
#include <stdint.h>

/* out[t] = (x[t] - mean) / sqrt(var + eps) * w + b for T rows of n (biased variance, as
 * torch.nn.LayerNorm). out may equal x. */
void ops_layernorm(float *out, const float *x, const float *w, const float *b, int T, int n, float eps);
/* x[i] = 0.5 x (1 + erf(x / sqrt 2)): BERT's "gelu". */
void ops_gelu_erf(float *x, size_t n);
/* y[t] += bias for T rows of n. */
void ops_add_rows(float *y, const float *bias, int T, int n);

/* Bidirectional multi-head attention: the batch holds n_seqs sequences back to back,
 * sequence s at rows seq_start[s] .. seq_start[s+1]-1; every token attends to all tokens
 * of its own sequence and none of the others (the padding mask of a padded batch).
 * q, k, v: [T, n_heads * head_dim]; out: same. scratch: tp_threads(tp) * max_len floats,
 * max_len the longest sequence. */
typedef struct ops_bidir_args {
    const float *q, *k, *v;
    float *out;
    const int32_t *seq_start; /* n_seqs + 1 entries */
    int n_seqs, n_heads, head_dim, max_len;
    float scale;
    float *scratch;
} ops_bidir_args;
void ops_attention_bidir(const ops_bidir_args *a, threadpool *tp);
#endif
