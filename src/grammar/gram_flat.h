/* gram_flat.h: the lowered grammar the matcher runs. Each rule is a list of
 * alternatives; an alternative is a run of elements ending in GE_END. Elements are byte
 * sets (one byte) or rule references. Shared by gram_build.c (writes) and gram_match.c. */
#ifndef HEARTH_GRAM_FLAT_H
#define HEARTH_GRAM_FLAT_H
#include "grammar/grammar_internal.h"

enum { GE_END, GE_BYTES, GE_RULE };
/* the matchers' shared parse-state cache (gram_match.c) */
typedef struct gm_core gm_core;
void gm_core_free(gm_core *c);
typedef struct {
    uint32_t kind : 2, arg : 30;
} gr_elem;

struct grammar {
    gr_elem *elems;
    int32_t n_elems;
    gr_byteset *sets;
    int32_t n_sets;
    uint32_t *alt_start; /* alternative -> first element */
    uint32_t *rule_alt0; /* rule -> first alternative; rule_alt0[n_rules] = total */
    int32_t n_rules;
    char **rule_names; /* NULL for anonymous rules */
    int32_t root;
    gm_core *core; /* created by the first matcher; guarded in gram_match.c */
};
#endif
