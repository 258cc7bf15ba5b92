/* decoder_hidden.c: a decoder forward pass that returns final-normed hidden states of
 * chosen rows instead of logits: what decoder embedding models (Qwen3-Embedding) pool.
 * Runs the family's forward pass with no logits rows, then applies the final norm to the
 * rows asked for; the decoder blocks themselves are unchanged. */
#include "model/decoder_hidden.h"
#include "base/err.h"
#include "model/decoder.h"
#include <string.h>

hearth_status model_forward_hidden(const model *m, kv_cache *kv, model_scratch *s, const model_batch *b, threadpool *tp,
                                   const int32_t *rows, int n_rows, float *out, hearth_error *err) {
    if (b->n_out != 0) return err_set(err, HEARTH_ERR_INVALID, "hidden-state pass: the batch must ask for no logits");
    hearth_status st = model_forward(m, kv, s, b, tp, err);
    if (st) return st;
    int H = m->cfg.hidden;
    for (int i = 0; i < n_rows; i++) {
        if (rows[i] < 0 || rows[i] >= b->T)
            return err_set(err, HEARTH_ERR_INVALID, "hidden row %d outside the batch of %d", rows[i], b->T);
        memcpy(out + (size_t)i * H, s->x + (size_t)rows[i] * H, (size_t)H * sizeof(float));
    }
    ops_rmsnorm(out, out, m->final_norm, m->cfg.norm_shift, n_rows, H, m->cfg.norm_eps);
    return HEARTH_OK;
}
