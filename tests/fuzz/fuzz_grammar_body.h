/* fuzz_grammar_body.h: the body the grammar fuzz targets share: compile the input as
 * one source kind; when it compiles, follow its own text byte by byte and take a mask
 * over a small vocabulary and the grammar's forced proposal after each byte (the matcher
 * must never crash or loop, and never propose a token it forbids). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

static int fuzz_grammar(grammar_kind kind, const uint8_t *data, size_t size) {
    static gvocab *v;
    if (!v) {
        static const char *toks[] = {"</s>", "{",    "}",    "\"",       "\":",  "a",  "ab", "0",
                                     "1",    "-",    ".",    "e",        " ",    "\n", "[",  "]",
                                     ",",    "true", "null", "\xc3\xa9", "\xc3", "\\", "x",  "9"};
        uint32_t len[sizeof toks / sizeof *toks];
        uint8_t special[sizeof toks / sizeof *toks] = {1};
        for (size_t i = 0; i < sizeof toks / sizeof *toks; i++) len[i] = (uint32_t)strlen(toks[i]);
        int32_t eos = 0;
        v = gvocab_new((int32_t)(sizeof toks / sizeof *toks), toks, len, special, &eos, 1);
    }
    grammar *g = NULL;
    hearth_error err = {0};
    if (grammar_compile(kind, (const char *)data, size, v, &g, &err) != HEARTH_OK) return 0;
    gmatcher *m = gmatcher_new(g, v);
    uint32_t mask[1];
    for (size_t i = 0; m && i < size && i < 64; i++) {
        gmatcher_mask(m, mask);
        if (!gmatcher_accept_bytes(m, (const char *)data + i, 1)) break;
        /* what the grammar forces next, through whitespace as the text so far laid it out:
         * every proposed token must be one the grammar allows */
        int32_t t[8];
        size_t n = gmatcher_extend_forced(m, t, 0, 8, NULL, NULL);
        if (gmatcher_allowed_prefix(m, t, n) != n) abort();
    }
    gmatcher_free(m);
    /* a second matcher of the grammar starts from the states the first one built */
    gmatcher *m2 = gmatcher_new(g, v);
    if (m2) gmatcher_mask(m2, mask);
    gmatcher_free(m2);
    grammar_free(g);
    return 0;
}
