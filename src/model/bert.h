/* bert.h: a loaded BERT-family encoder (BertModel as sentence-transformers runs it:
 * word + position + token-type embeddings, post-LN blocks, bidirectional attention, erf
 * GELU) and its forward pass over a ragged batch of whole inputs. Weights are held as
 * float32; the forward pass composes ops/ops_encoder.h and backend/cpu/matmul.h. */
#ifndef HEARTH_MODEL_BERT_H
#define HEARTH_MODEL_BERT_H
#include "backend/cpu/matmul.h"
#include "hearth.h"

typedef struct bert_layer {
    op_weight q, k, v, o, up, down;
    float *q_b, *k_b, *v_b, *o_b, *up_b, *down_b;
    float *attn_ln_w, *attn_ln_b, *out_ln_w, *out_ln_b;
} bert_layer;

typedef struct bert_model {
    int n_layers, hidden, n_heads, head_dim, ffn, vocab, max_positions, type_vocab;
    float eps;
    float *word, *position, *token_type; /* [vocab|max_positions|type_vocab, hidden] */
    float *emb_ln_w, *emb_ln_b;
    bert_layer *layers;
    float **owned; /* every float buffer above, to free */
    size_t n_owned, weight_bytes;
} bert_model;

/* Whether config.json describes a BERT-family encoder this file runs. */
int bert_is_encoder(const hearth_model *hm);
hearth_status bert_load(const hearth_model *hm, bert_model **out, hearth_error *err);
void bert_free(bert_model *b);

typedef struct bert_scratch bert_scratch;
/* Scratch for batches of up to max_tokens tokens, no input longer than max_len. */
hearth_status bert_scratch_create(const bert_model *b, int max_tokens, int max_len, int n_threads, bert_scratch **out,
                                  hearth_error *err);
void bert_scratch_free(bert_scratch *s);

/* Runs n_seqs inputs packed back to back (input s is tokens[seq_start[s] ..
 * seq_start[s+1]-1], each at positions 0.., token type 0) and returns the last hidden
 * state [T, hidden] (valid until the next call). */
hearth_status bert_forward(const bert_model *b, bert_scratch *s, const int32_t *tokens, const int32_t *seq_start,
                           int n_seqs, threadpool *tp, const float **hidden, hearth_error *err);
#endif
