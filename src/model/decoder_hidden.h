/* decoder_hidden.h: the decoder forward pass for embedding models (see decoder_hidden.c). */
#ifndef HEARTH_MODEL_DECODER_HIDDEN_H
#define HEARTH_MODEL_DECODER_HIDDEN_H
#include "model/model.h"

/* Runs b (which must have n_out == 0) through model_forward and writes the final-normed
 * hidden state of each of rows[0..n_rows) into out[n_rows, hidden]. */
hearth_status model_forward_hidden(const model *m, kv_cache *kv, model_scratch *s, const model_batch *b, threadpool *tp,
                                   const int32_t *rows, int n_rows, float *out, hearth_error *err);
#endif
