/* grammar_vocab.h: the vocabulary the grammar tests share: id 0 is the eos "</s>", ids
 * 1..256 the single bytes, then the extra tokens in order (special[i]: a special token,
 * which only a tool-call marker may produce). */
#ifndef HEARTH_TEST_GRAMMAR_VOCAB_H
#define HEARTH_TEST_GRAMMAR_VOCAB_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

static gvocab *byte_vocab(const char *const *extra, const uint8_t *extra_special, size_t n_extra) {
    static char single[256][1];
    size_t n = 1 + 256 + n_extra;
    const char **bytes = calloc(n, sizeof *bytes);
    uint32_t *len = calloc(n, sizeof *len);
    uint8_t *special = calloc(n, 1);
    assert_non_null(bytes), assert_non_null(len), assert_non_null(special);
    bytes[0] = "</s>", len[0] = 4, special[0] = 1;
    for (int i = 0; i < 256; i++) single[i][0] = (char)i, bytes[1 + i] = single[i], len[1 + i] = 1;
    for (size_t i = 0; i < n_extra; i++)
        bytes[257 + i] = extra[i], len[257 + i] = (uint32_t)strlen(extra[i]), special[257 + i] = extra_special[i];
    int32_t eos = 0;
    gvocab *v = gvocab_new((int32_t)n, bytes, len, special, &eos, 1);
    free(bytes), free(len), free(special);
    assert_non_null(v);
    return v;
}
#endif
