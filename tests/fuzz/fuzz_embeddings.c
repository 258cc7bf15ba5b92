/* fuzz_embeddings.c: the /v1/embeddings request validator (emb_request_parse in
 * src/server/embeddings.c) and the input length rule it applies to texts
 * (embed_tokenize_fit in src/api/embed.c) on arbitrary bytes. The first byte picks the
 * model's limits (longest input, vector size), the rest is the body. Texts are
 * tokenized by a real hearth tokenizer loaded from a tokenizer.json this target
 * writes: byte-level BPE over all 256 bytes with BERT-style [CLS] ... [SEP] specials,
 * so truncation has a prefix and a suffix to keep. A validated request is checked
 * against the limits (abort on a violation); nothing may crash or leak. */
#include "api/model_internal.h"
#include "server/embeddings.h"
#include "tok/tokenizer.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tiny_tokenizer.h"

typedef struct fuzz_model {
    tok_tokenizer *tok;
    int max_tokens;
} fuzz_model;

static hearth_status encode(const void *tok, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                            hearth_error *err) {
    hearth_error ignored;
    return tok_encode(tok, text, len, 1, ids, n_ids, err ? err : &ignored);
}

/* hearth_embed_tokenize with this target's tokenizer. */
static hearth_status fuzz_tokenize(void *ctx, const char *text, size_t len, int truncate, int32_t **ids, size_t *n_ids,
                                   hearth_error *err) {
    const fuzz_model *fm = ctx;
    return embed_tokenize_fit(encode, fm->tok, text, len, fm->max_tokens, truncate, ids, n_ids, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tok_tokenizer *tok;
    hearth_error err = {0};
    if (!tok) {
        char *text = tokenizer_json();
        if (!text || tok_load_hf_json(text, strlen(text), NULL, "fuzz_embeddings", &tok, &err) != HEARTH_OK) abort();
        free(text);
    }
    if (!size) return 0;
    /* limits: inputs of 1..16 tokens (small, so truncation and the length error are
     * reached), vectors of 1..8 values */
    fuzz_model fm = {.tok = tok, .max_tokens = 1 + (data[0] & 15)};
    emb_limits m = {.vocab = tok_vocab_size(tok),
                    .max_tokens = fm.max_tokens,
                    .dim = 1 + (data[0] >> 4 & 7),
                    .tokenize = fuzz_tokenize,
                    .ctx = &fm};
    json_t *body = json_loadb((const char *)data + 1, size - 1, 0, NULL);
    if (!body) return 0;
    emb_request r;
    srv_error e = {0};
    if (emb_request_parse(body, &m, &r, &e)) {
        if (e.http_status != 400 && e.http_status != 500) abort();
        free(srv_error_body(&e));
    } else {
        if (!r.n || r.n > EMB_MAX_INPUTS || r.dims < 1 || r.dims > m.dim) abort();
        for (size_t i = 0; i < r.n; i++) {
            if (!r.lens[i] || r.lens[i] > (size_t)m.max_tokens) abort();
            for (size_t k = 0; k < r.lens[i]; k++)
                if (r.ids[i][k] < 0 || r.ids[i][k] >= m.vocab) abort();
        }
    }
    emb_request_free(&r);
    json_decref(body);
    return 0;
}
