/* gram_match.c: runs a lowered grammar over bytes and turns it into token masks.
 * A parse position is a set of stacks (llama.cpp's idea); stacks are hash-consed into
 * node ids and sets of them into set ids, so the byte transitions of a set are cached
 * like a lazily built DFA. A mask walks the vocabulary's byte trie in preorder through
 * those transitions, skipping every subtree whose prefix is dead. Owns no model state. */
#include "base/hash.h"
#include "grammar/gram_flat.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- vocabulary trie ----------------------------------------------------------------- */

/* A class of ASCII bytes: bit b for the byte b (1..127). */
typedef struct {
    uint64_t w[2];
} gv_class;
/* What else a trie node's descendants hold (gv_trie.below_flags): a byte that is no part of
 * valid UTF-8 (NUL, the marker byte, a stray continuation, an overlong or surrogate form),
 * or bytes of valid multi-byte characters (whole or cut off at the token's end). */
enum { GV_BELOW_BAD = 1, GV_BELOW_MULTI = 2 };

/* UTF-8 by lead bytes (no overlongs, no surrogates, nothing past U+10FFFF): the second
 * byte's range, then `more` continuation bytes of 0x80..0xBF. */
typedef struct {
    uint8_t lead_lo, lead_hi, lo, hi, more;
} gv_utf8_lead;
static const gv_utf8_lead *utf8_lead(unsigned b) {
    static const gv_utf8_lead leads[] = {
        {0xC2, 0xDF, 0x80, 0xBF, 0}, {0xE0, 0xE0, 0xA0, 0xBF, 1}, {0xE1, 0xEC, 0x80, 0xBF, 1},
        {0xED, 0xED, 0x80, 0x9F, 1}, {0xEE, 0xEF, 0x80, 0xBF, 1}, {0xF0, 0xF0, 0x90, 0xBF, 2},
        {0xF1, 0xF3, 0x80, 0xBF, 2}, {0xF4, 0xF4, 0x80, 0x8F, 2},
    };
    for (size_t q = 0; q < sizeof leads / sizeof *leads; q++)
        if (b >= leads[q].lead_lo && b <= leads[q].lead_hi) return &leads[q];
    return NULL;
}

/* A byte trie of some tokens, in preorder: node i has byte[i] at depth[i] (1 for the
 * root's children); its subtree ends before end[i]; the tokens spelled exactly by the path
 * to it are tok_sorted[tok_first[i] .. + tok_n[i]). */
typedef struct {
    int32_t n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    int32_t *end;
    int32_t *tok_first;
    int32_t *tok_n;
    int32_t *tok_sorted;
    int32_t n_tok;
    int32_t *sub_lo;      /* per node: its subtree's first token in tok_sorted (they are contiguous) */
    uint8_t *whole;       /* per node: its path is whole UTF-8 characters (no byte of one is cut off) */
    gv_class *below;      /* per node: the ASCII bytes of its descendants */
    uint8_t *below_flags; /* per node: GV_BELOW_* of its descendants */
    uint16_t *height;     /* per node: how many bytes its longest descendant adds to its path */
    /* per first byte: its depth-1 node (-1: none) and its tokens' range in tok_sorted */
    int32_t root[256], root_lo[256], root_hi[256];
} gv_trie;

#define GV_SHORT 16 /* characters: longer plain tokens are few and walked with the rest */

struct gvocab {
    int32_t n_tokens;
    gv_trie all;   /* every text token and marker (special token) */
    gv_trie rest;  /* the text tokens that are not short plain ones */
    gv_trie plain; /* the short plain ones */
    /* short plain tokens: at most GV_SHORT complete UTF-8 characters, none of them a
     * control character, '"' or '\\'. Where every plain character leads one state to the
     * same next state, GV_SHORT times over (inside a JSON string, free or with a length
     * bound still that far away), every short plain token is allowed: such states take them
     * all at once and walk only the rest */
    uint32_t *plain_bits;
    size_t n_plain;
    /* plain_le[L - 1]: the short plain tokens of at most L characters (L = 1..GV_SHORT;
     * the last is plain_bits), and how many */
    uint32_t *plain_le[GV_SHORT];
    size_t n_plain_le[GV_SHORT];
    int32_t *eos;
    int n_eos;
    char **bytes; /* into text; a special token's are GR_SPECIAL_BYTE and its text */
    uint32_t *len;
    uint32_t max_len;
    char *text; /* every token's bytes, one after another */
};

/* Token order of the tries: by bytes, then by id. */
static int tok_before(const gvocab *v, int32_t a, int32_t b) {
    uint32_t la = v->len[a], lb = v->len[b], l = la < lb ? la : lb;
    int c = memcmp(v->bytes[a], v->bytes[b], l);
    if (c) return c < 0;
    if (la != lb) return la < lb;
    return a < b;
}

/* Sorts ids[0..n) by tok_before: a merge sort through tmp (n entries), so the build's
 * memory is what gvocab_footprint counts whatever the C library's qsort allocates. */
static void sort_tokens(const gvocab *v, int32_t *ids, int32_t *tmp, int32_t n) {
    if (n < 2) return;
    int32_t h = n / 2;
    sort_tokens(v, ids, tmp, h);
    sort_tokens(v, ids + h, tmp, n - h);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = tok_before(v, ids[j], ids[i]) ? ids[j++] : ids[i++];
    while (i < h) tmp[k++] = ids[i++];
    memcpy(ids, tmp, (size_t)k * sizeof *ids); /* ids[j..n) are in place */
}

/* 65535: the trie depth is a uint16; no vocabulary has tokens that long */
#define GV_MAX_TOKEN_BYTES 65535

/* Nodes of the trie of tokens order[0..n) (sorted): each token adds its bytes past the
 * prefix it shares with the one before. */
static int32_t trie_nodes(const gvocab *v, const int32_t *order, int32_t n) {
    size_t nodes = 0;
    for (int32_t k = 0; k < n; k++) {
        uint32_t l = v->len[order[k]], p = 0;
        if (k) {
            uint32_t pl = v->len[order[k - 1]];
            const char *s = v->bytes[order[k]], *prev = v->bytes[order[k - 1]];
            while (p < l && p < pl && s[p] == prev[p]) p++;
        }
        nodes += l - p;
    }
    return (int32_t)nodes;
}

/* Bytes per trie node: byte, depth, end, tok_first, tok_n, sub_lo, whole, below,
 * below_flags, height (gv_trie); arrays of n_nodes + 1. */
#define GV_NODE_BYTES                                                                                                  \
    (sizeof(uint8_t) + sizeof(uint16_t) + 4 * sizeof(int32_t) + sizeof(uint8_t) + sizeof(gv_class) + sizeof(uint8_t) + \
     sizeof(uint16_t))
/* A trie's per-depth scratch while it is built (the path, a character's state): 4 arrays of
 * the longest token's bytes + 2, one of int32 and three of bytes. */
#define GV_DEPTH_BYTES(max_len) (((size_t)(max_len) + 2) * (sizeof(int32_t) + 3))

/* The trie of tokens order[0..n_text) (sorted by bytes), n_nodes of them (trie_nodes);
 * takes order. */
static int trie_build(gv_trie *t, const gvocab *v, int32_t *order, int32_t n_text, int32_t n_nodes) {
    size_t cap = (size_t)n_nodes + 1;
    t->tok_sorted = order;
    t->byte = malloc(cap);
    t->depth = malloc(cap * sizeof *t->depth);
    t->end = malloc(cap * sizeof *t->end);
    t->tok_first = malloc(cap * sizeof *t->tok_first);
    t->tok_n = calloc(cap, sizeof *t->tok_n);
    t->sub_lo = malloc(cap * sizeof *t->sub_lo);
    t->whole = malloc(cap);
    t->below = calloc(cap, sizeof *t->below);
    t->below_flags = calloc(cap, 1);
    t->height = calloc(cap, sizeof *t->height);
    t->n_tok = n_text;
    size_t depth_cap = (size_t)v->max_len + 2;
    int32_t *path = malloc(depth_cap * sizeof *path);
    if (!t->byte || !t->depth || !t->end || !t->tok_first || !t->tok_n || !t->sub_lo || !t->whole || !t->below ||
        !t->below_flags || !t->height || !path) {
        free(path);
        return 0;
    }
    int32_t sp = 0, n = 0;
    for (int b = 0; b < 256; b++) t->root[b] = -1, t->root_lo[b] = t->root_hi[b] = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t k = 0; k < n_text; k++) {
        int32_t id = order[k];
        const char *s = v->bytes[id];
        uint32_t l = v->len[id], p = 0;
        while (prev && p < l && p < prev_len && s[p] == prev[p]) p++;
        while ((uint32_t)sp > p) t->end[path[--sp]] = n;
        if (p == 0) { /* a new first byte */
            t->root[(uint8_t)s[0]] = n;
            t->root_lo[(uint8_t)s[0]] = k;
        }
        t->root_hi[(uint8_t)s[0]] = k + 1;
        if (n + (int32_t)(l - p) > n_nodes) { /* trie_nodes counts these same steps: never */
            free(path);
            return 0;
        }
        for (uint32_t d = p; d < l; d++) {
            t->byte[n] = (uint8_t)s[d];
            t->sub_lo[n] = k;
            t->whole[n] = d + 1 == l || ((uint8_t)s[d + 1] & 0xC0) != 0x80;
            t->depth[n] = (uint16_t)(d + 1);
            t->tok_n[n] = 0;
            path[sp++] = n++;
        }
        int32_t top = path[sp - 1];
        if (!t->tok_n[top]) t->tok_first[top] = k;
        t->tok_n[top]++;
        prev = s, prev_len = l;
    }
    while (sp) t->end[path[--sp]] = n;
    t->n_nodes = n;
    free(path);
    /* each node's own byte in UTF-8, decoded from the root (a path is a token's prefix):
     * bad, or the bytes a character still needs and the next one's range; kept per depth */
    uint8_t *own = malloc((size_t)n + 1);
    uint8_t *need = malloc(depth_cap), *lo = malloc(depth_cap), *hi = malloc(depth_cap);
    if (!own || !need || !lo || !hi) {
        free(own), free(need), free(lo), free(hi);
        return 0;
    }
    need[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        unsigned d = t->depth[i], b = t->byte[i], bad = need[d - 1] == 0xFF;
        need[d] = 0, lo[d] = 0x80, hi[d] = 0xBF;
        if (!bad && need[d - 1]) { /* a continuation byte */
            bad = b < lo[d - 1] || b > hi[d - 1];
            need[d] = (uint8_t)(need[d - 1] - 1);
        } else if (!bad && b >= 0x80) { /* a lead byte: plain_token's ranges */
            const gv_utf8_lead *q = utf8_lead(b);
            bad = !q;
            if (q) need[d] = (uint8_t)(q->more + 1), lo[d] = q->lo, hi[d] = q->hi;
        } else if (!bad)
            bad = b == 0;
        if (bad) need[d] = 0xFF; /* everything after a bad byte is bad */
        own[i] = bad ? GV_BELOW_BAD : b >= 0x80 ? GV_BELOW_MULTI : 0;
    }
    free(need), free(lo), free(hi);
    /* the bytes below each node, children first: in preorder a node's children are
     * i + 1, then each child's end, up to the node's own end */
    for (int32_t i = n - 1; i >= 0; i--)
        for (int32_t c = i + 1; c < t->end[i]; c = t->end[c]) {
            unsigned b = t->byte[c];
            t->below[i].w[0] |= t->below[c].w[0], t->below[i].w[1] |= t->below[c].w[1];
            if (b && b < 0x80) t->below[i].w[b >> 6] |= (uint64_t)1 << (b & 63);
            t->below_flags[i] |= t->below_flags[c] | own[c];
            if (t->height[c] + 1 > t->height[i]) t->height[i] = (uint16_t)(t->height[c] + 1);
        }
    free(own);
    return 1;
}

static void trie_free(gv_trie *t) {
    free(t->byte), free(t->depth), free(t->end), free(t->tok_first), free(t->tok_n), free(t->tok_sorted);
    free(t->sub_lo), free(t->whole), free(t->below), free(t->below_flags), free(t->height);
}

/* The number of characters of a plain token (complete UTF-8 characters only, none below
 * U+0020, '"' or '\\'), or 0 when the token is not plain. */
static int plain_token(const char *s, uint32_t n) {
    int chars = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (uint32_t i = 0; i < n;) {
        unsigned c = u[i];
        chars++;
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\') return 0;
            i++;
            continue;
        }
        const gv_utf8_lead *q = utf8_lead(c);
        int len = q ? q->more + 2 : 0;
        if (!len || i + (uint32_t)len > n) return 0;
        if (u[i + 1] < q->lo || u[i + 1] > q->hi) return 0;
        for (int k = 2; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        i += (uint32_t)len;
    }
    return chars;
}

/* The vocabulary's tables up to the tries: each token's bytes in one block (a marker byte
 * before a special token's text), the text tokens sorted, split into short plain ones and
 * the rest, the plain sets; and the node count each trie will have. What gvocab_new builds
 * the tries on and gvocab_footprint counts, so the two cannot differ. On out of memory
 * returns 0 with what was made in v (gvocab_free frees it). */
typedef struct gv_layout {
    int32_t *order, *rest, *plain; /* sorted ids: text tokens, the not short plain, the short plain */
    int32_t n_text, n_rest;
    int32_t nodes_all, nodes_rest, nodes_plain;
    size_t text_bytes;
    int eos_cap; /* the eos ids given (v->n_eos keeps those in range) */
} gv_layout;

static size_t words_of(int32_t n_tokens) { return ((size_t)n_tokens + 31) / 32 + 1; }

static int vocab_layout(gvocab *v, int32_t n_tokens, const char *const *bytes, const uint32_t *len,
                        const uint8_t *special, const int32_t *eos_ids, int n_eos, gv_layout *L) {
    memset(L, 0, sizeof *L);
    L->eos_cap = n_eos;
    v->n_tokens = n_tokens;
    v->bytes = calloc((size_t)n_tokens + 1, sizeof *v->bytes);
    v->len = calloc((size_t)n_tokens + 1, sizeof *v->len);
    v->eos = malloc(((size_t)n_eos + 1) * sizeof *v->eos);
    v->plain_bits = calloc(words_of(n_tokens), sizeof *v->plain_bits);
    int le_ok = 1;
    for (int l = 0; l < GV_SHORT - 1; l++)
        le_ok &= (v->plain_le[l] = calloc(words_of(n_tokens), sizeof *v->plain_bits)) != NULL;
    v->plain_le[GV_SHORT - 1] = v->plain_bits;
    if (!v->bytes || !v->len || !v->eos || !v->plain_bits || !le_ok) return 0;
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < n_tokens) v->eos[v->n_eos++] = eos_ids[i];
    uint8_t *marks = calloc((size_t)n_tokens + 1, 1);
    if (!marks) return 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        uint32_t l = bytes[i] ? len[i] : 0;
        if (l >= GV_MAX_TOKEN_BYTES) l = 0;
        int is_eos = 0;
        for (int k = 0; k < v->n_eos; k++) is_eos |= v->eos[k] == i;
        /* eos ends an output through can_end, never as text or a marker */
        int mark = special && special[i] && l && !is_eos;
        if (special && special[i] && !mark) l = 0;
        /* text with the marker byte (a byte-fallback <0xFF>) is never UTF-8, so no grammar
         * allows it; dropped so that it cannot start a marker either */
        if (!mark && l && memchr(bytes[i], GR_SPECIAL_BYTE, l)) l = 0;
        v->len[i] = l + (uint32_t)mark;
        marks[i] = (uint8_t)mark;
        L->text_bytes += v->len[i];
        if (v->len[i]) L->n_text++;
        if (v->len[i] > v->max_len) v->max_len = v->len[i];
    }
    v->text = malloc(L->text_bytes + 1);
    L->order = malloc(((size_t)L->n_text + 1) * sizeof *L->order);
    int32_t *tmp = malloc(((size_t)L->n_text + 1) * sizeof *tmp);
    if (!v->text || !L->order || !tmp) {
        free(marks), free(tmp);
        return 0;
    }
    size_t at = 0;
    int32_t n_text = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        v->bytes[i] = v->text + at;
        if (marks[i]) v->text[at] = (char)GR_SPECIAL_BYTE;
        if (v->len[i] > marks[i]) memcpy(v->text + at + marks[i], bytes[i], v->len[i] - marks[i]);
        at += v->len[i];
        if (v->len[i]) L->order[n_text++] = i;
    }
    free(marks);
    sort_tokens(v, L->order, tmp, L->n_text);
    free(tmp);
    for (int32_t k = 0; k < L->n_text; k++) {
        int32_t id = L->order[k];
        int chars = plain_token(v->bytes[id], v->len[id]);
        if (chars > 0 && chars <= GV_SHORT) {
            v->plain_bits[id >> 5] |= 1u << (id & 31), v->n_plain++;
            for (int l = chars; l < GV_SHORT; l++)
                v->plain_le[l - 1][id >> 5] |= 1u << (id & 31), v->n_plain_le[l - 1]++;
        }
    }
    v->n_plain_le[GV_SHORT - 1] = v->n_plain;
    L->n_rest = L->n_text - (int32_t)v->n_plain;
    L->rest = malloc(((size_t)L->n_rest + 1) * sizeof *L->rest);
    L->plain = malloc((v->n_plain + 1) * sizeof *L->plain);
    if (!L->rest || !L->plain) return 0;
    int32_t nr = 0, np = 0;
    for (int32_t k = 0; k < L->n_text; k++) { /* both stay sorted */
        int32_t id = L->order[k];
        if (v->plain_bits[id >> 5] >> (id & 31) & 1)
            L->plain[np++] = id;
        else
            L->rest[nr++] = id;
    }
    L->nodes_all = trie_nodes(v, L->order, L->n_text);
    L->nodes_rest = trie_nodes(v, L->rest, L->n_rest);
    L->nodes_plain = trie_nodes(v, L->plain, np);
    return 1;
}

static void layout_free(gv_layout *L) { free(L->order), free(L->rest), free(L->plain); }

/* What the tables of a layout take (every array vocab_layout and trie_build allocate), and
 * what building them holds besides at its worst: the sort's buffer, or a trie's per-node
 * UTF-8 flags and per-depth scratch, whichever is larger. */
static void layout_bytes(const gvocab *v, const gv_layout *L, size_t *tables, size_t *temporary) {
    size_t n1 = (size_t)v->n_tokens + 1;
    size_t t = sizeof *v + n1 * (sizeof *v->bytes + sizeof *v->len) + ((size_t)L->eos_cap + 1) * sizeof *v->eos +
               GV_SHORT * words_of(v->n_tokens) * sizeof *v->plain_bits + L->text_bytes + 1;
    t += ((size_t)L->n_text + 1 + (size_t)L->n_rest + 1 + v->n_plain + 1) * sizeof(int32_t); /* tok_sorted */
    t += ((size_t)L->nodes_all + 1 + (size_t)L->nodes_rest + 1 + (size_t)L->nodes_plain + 1) * GV_NODE_BYTES;
    *tables = t;
    size_t sort = ((size_t)L->n_text + 1) * sizeof(int32_t) + n1; /* the merge buffer, the marker flags */
    size_t trie = (size_t)L->nodes_all + 1 + GV_DEPTH_BYTES(v->max_len);
    *temporary = sort > trie ? sort : trie;
}

gvocab *gvocab_new(int32_t n_tokens, const char *const *bytes, const uint32_t *len, const uint8_t *special,
                   const int32_t *eos_ids, int n_eos) {
    gvocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    gv_layout L;
    if (!vocab_layout(v, n_tokens, bytes, len, special, eos_ids, n_eos, &L)) goto fail;
    /* each trie takes its order array */
    int ok = trie_build(&v->all, v, L.order, L.n_text, L.nodes_all);
    L.order = NULL;
    if (ok) ok = trie_build(&v->rest, v, L.rest, L.n_rest, L.nodes_rest), L.rest = NULL;
    if (ok) ok = trie_build(&v->plain, v, L.plain, (int32_t)v->n_plain, L.nodes_plain), L.plain = NULL;
    if (!ok) goto fail;
    return v;
fail:
    layout_free(&L);
    gvocab_free(v);
    return NULL;
}

int gvocab_footprint(int32_t n_tokens, const char *const *bytes, const uint32_t *len, const uint8_t *special,
                     const int32_t *eos_ids, int n_eos, size_t *tables, size_t *temporary) {
    *tables = *temporary = 0;
    gvocab *v = calloc(1, sizeof *v);
    gv_layout L;
    int ok = v && vocab_layout(v, n_tokens, bytes, len, special, eos_ids, n_eos, &L);
    if (ok) layout_bytes(v, &L, tables, temporary);
    if (v) layout_free(&L);
    gvocab_free(v);
    return ok;
}

void gvocab_free(gvocab *v) {
    if (!v) return;
    free(v->bytes), free(v->len), free(v->eos), free(v->plain_bits), free(v->text);
    for (int l = 0; l < GV_SHORT - 1; l++) free(v->plain_le[l]);
    trie_free(&v->all);
    trie_free(&v->rest);
    trie_free(&v->plain);
    free(v);
}

int32_t gvocab_size(const gvocab *v) { return v ? v->n_tokens : 0; }

int gvocab_has_special(const gvocab *v, const char *text, size_t n) {
    for (int32_t i = 0; i < v->n_tokens; i++)
        if (v->len[i] == n + 1 && (unsigned char)v->bytes[i][0] == GR_SPECIAL_BYTE && !memcmp(v->bytes[i] + 1, text, n))
            return 1;
    return 0;
}

/* ---- matcher --------------------------------------------------------------------------- */

/* Masks kept per grammar, keyed by set id: JSON strings and whitespace revisit a
 * handful of sets, and an object's members revisit the same string and format states
 * member after member (a mask is a bit per token: 64 of them are 2 MiB for a 262k
 * vocabulary, allocated as they are first used). */
#define GM_MASK_CACHE 64
/* Expansion recursion bound (grammar nesting without a byte). */
#define GM_MAX_DEPTH 2000
/* Expansion steps for one byte and parse stacks in one set: beyond these a
 * (pathologically ambiguous) grammar is given up on, not followed for minutes. JSON
 * Schema grammars stay in the hundreds. */
#define GM_MAX_WORK 50000
#define GM_MAX_SET 2048

typedef struct {
    uint32_t pos;
    int32_t parent;
} gm_node;

/* The parse states of one grammar on one vocabulary: stack nodes, sets, their byte
 * transitions and recent masks. Every matcher of the grammar on that vocabulary shares it
 * (the grammar holds it), so a state one output reached is known to the next; a mutex
 * guards it. */
struct gm_core {
    pthread_mutex_t mu;
    const gvocab *vkey; /* the vocabulary it was built for */
    int32_t start;      /* the set before any byte */
    const grammar *g;
    const gvocab *v;
    /* stacks: node 0 is "empty stack" (the grammar is complete) */
    gm_node *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *node_hash; /* open addressing, -1 empty */
    uint32_t node_hash_cap;
    uint32_t *visit; /* per node: epoch of the last expansion that visited it */
    uint32_t epoch;
    int64_t work; /* expansion steps left for the current byte */
    /* sets: sorted node lists */
    int32_t *set_items;
    int64_t n_items, cap_items;
    int64_t *set_off;
    int32_t *set_len;
    int32_t *trans;     /* 256 per set: -2 unknown, -1 dead */
    int32_t *uni;       /* per set: the set every plain character leads it to; -1 none, -2 unknown */
    int8_t *closed;     /* per set: plain_closed(); -1 unknown */
    gv_class *uclass;   /* per set: ASCII bytes that all lead it to one set, unext (gm_uclass) */
    int32_t *unext;     /* -2: not known yet */
    int8_t *loop_multi; /* per set: every multi-byte plain character leads it back to itself; -1 unknown */
    int32_t n_sets, cap_sets;
    int32_t *set_hash;
    uint32_t set_hash_cap;
    /* scratch */
    int32_t *tmp;
    int32_t n_tmp, cap_tmp;
    int32_t *walk;      /* per trie depth */
    uint32_t *arg_mark; /* per byte set of the grammar: advance()'s stamp when seen */
    uint32_t arg_stamp;
    int oom;
    int32_t mask_key[GM_MASK_CACHE];
    uint32_t *mask_val[GM_MASK_CACHE];
    size_t mask_count[GM_MASK_CACHE];
    int mask_next;
};

/* Whitespace a grammar leaves optional (JSON's between tokens) ends every forced run, yet an
 * output lays its text out the same way throughout. So a matcher remembers, for each pair of
 * bytes, the whitespace its output last wrote between them (empty when the second followed
 * the first at once), and a forced run goes on through a choice between whitespace and one
 * other byte with that guess ('"' then ':' differs from '"' then '}'). A run with a newline
 * is kept relative to the indentation of the line its first byte was on, so a key after an
 * opening brace is one level deeper. Only a proposal: the model verifies it. Longest run
 * kept, in bytes, and pairs kept (the most recently learned; JSON has a dozen): */
#define GM_WS_MAX 32
#define GM_WS_PAIRS 32
typedef struct {
    uint8_t known, len;    /* len: the bytes up to and with the last newline, or the whole run */
    uint8_t before, after; /* the bytes around the run */
    uint8_t indent_char;   /* 0: no newline (the run as written); else ' ' or '\t' after it */
    int8_t indent_delta;   /* indentation after the newline minus the byte's line's */
    char run[GM_WS_MAX];
} gm_ws;
/* The layout of the output so far: the last byte that was not whitespace, the whitespace
 * since, the current line's indentation. */
typedef struct {
    int has_prev;
    uint8_t prev;
    int prev_indent;  /* indentation of prev's line */
    int32_t prev_set; /* the parse state after prev (where the run began) */
    int run_len;      /* whitespace bytes since prev; -1: more than GM_WS_MAX */
    char run[GM_WS_MAX];
    int indent, in_indent; /* the current line's leading whitespace so far; still in it */
} gm_layout;

struct gmatcher {
    gm_core *c;
    int own; /* c is this matcher's alone (the grammar's serves another vocabulary) */
    int32_t cur;
    int done;
    int probe;     /* a copy that tries tokens: it learns no layout into ws */
    gm_layout lay; /* follows every byte accepted */
    gm_ws *ws;     /* [GM_WS_PAIRS], by the bytes around the whitespace */
    int ws_next;   /* the entry a new pair takes */
};

static uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static int node_rehash(gm_core *m) {
    uint32_t cap = m->node_hash_cap ? m->node_hash_cap * 2 : 1024;
    int32_t *h = malloc(cap * sizeof *h);
    if (!h) return 0;
    memset(h, 0xff, cap * sizeof *h);
    for (int32_t i = 1; i < m->n_nodes; i++) {
        uint32_t k = mix(((uint64_t)m->nodes[i].pos << 32) | (uint32_t)m->nodes[i].parent) & (cap - 1);
        while (h[k] >= 0) k = (k + 1) & (cap - 1);
        h[k] = i;
    }
    free(m->node_hash);
    m->node_hash = h, m->node_hash_cap = cap;
    return 1;
}

static int32_t node_intern(gm_core *m, uint32_t pos, int32_t parent) {
    if ((uint32_t)m->n_nodes * 2 >= m->node_hash_cap && !node_rehash(m)) {
        m->oom = 1;
        return -1;
    }
    uint32_t k = mix(((uint64_t)pos << 32) | (uint32_t)parent) & (m->node_hash_cap - 1);
    for (; m->node_hash[k] >= 0; k = (k + 1) & (m->node_hash_cap - 1)) {
        gm_node *n = &m->nodes[m->node_hash[k]];
        if (n->pos == pos && n->parent == parent) return m->node_hash[k];
    }
    if (m->n_nodes >= m->cap_nodes) {
        int32_t nc = m->cap_nodes * 2;
        gm_node *nn = realloc(m->nodes, (size_t)nc * sizeof *nn);
        uint32_t *nv = realloc(m->visit, (size_t)nc * sizeof *nv);
        if (nn) m->nodes = nn;
        if (nv) m->visit = nv;
        if (!nn || !nv) {
            m->oom = 1;
            return -1;
        }
        memset(m->visit + m->cap_nodes, 0, (size_t)(nc - m->cap_nodes) * sizeof *nv);
        m->cap_nodes = nc;
    }
    m->nodes[m->n_nodes] = (gm_node){pos, parent};
    m->node_hash[k] = m->n_nodes;
    return m->n_nodes++;
}

static void tmp_push(gm_core *m, int32_t x) {
    if (m->n_tmp >= m->cap_tmp) {
        int32_t nc = m->cap_tmp ? m->cap_tmp * 2 : 256;
        int32_t *t = realloc(m->tmp, (size_t)nc * sizeof *t);
        if (!t) {
            m->oom = 1;
            return;
        }
        m->tmp = t, m->cap_tmp = nc;
    }
    m->tmp[m->n_tmp++] = x;
}

/* Every stack reachable from (pos, parent) without consuming a byte, as nodes whose top
 * is a byte set (or node 0: the whole grammar is complete). */
static void expand(gm_core *m, uint32_t pos, int32_t parent, int depth) {
    const grammar *g = m->g;
    for (;;) {
        if (m->oom || depth > GM_MAX_DEPTH || --m->work < 0) {
            m->oom = 1;
            return;
        }
        gr_elem e = g->elems[pos];
        if (e.kind == GE_END) {
            if (parent == 0) {
                tmp_push(m, 0);
                return;
            }
            pos = m->nodes[parent].pos, parent = m->nodes[parent].parent;
            continue;
        }
        int32_t id = node_intern(m, pos, parent);
        if (id < 0) return;
        if (e.kind == GE_BYTES) {
            tmp_push(m, id);
            return;
        }
        if (m->visit[id] == m->epoch) return; /* this expansion already ran this round */
        m->visit[id] = m->epoch;
        int32_t ret = g->elems[pos + 1].kind == GE_END ? parent : node_intern(m, pos + 1, parent);
        if (ret < 0) return;
        for (uint32_t a = g->rule_alt0[e.arg]; a < g->rule_alt0[e.arg + 1]; a++)
            expand(m, g->alt_start[a], ret, depth + 1);
        return;
    }
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return a < b ? -1 : a > b;
}

static uint32_t set_hash_of(const int32_t *it, int32_t n) { return mix(fnv1a64_words(FNV1A64_INIT, it, (size_t)n)); }

static int set_rehash(gm_core *m) {
    uint32_t cap = m->set_hash_cap ? m->set_hash_cap * 2 : 256;
    int32_t *h = malloc(cap * sizeof *h);
    if (!h) return 0;
    memset(h, 0xff, cap * sizeof *h);
    for (int32_t i = 0; i < m->n_sets; i++) {
        uint32_t k = set_hash_of(m->set_items + m->set_off[i], m->set_len[i]) & (cap - 1);
        while (h[k] >= 0) k = (k + 1) & (cap - 1);
        h[k] = i;
    }
    free(m->set_hash);
    m->set_hash = h, m->set_hash_cap = cap;
    return 1;
}

/* Interns m->tmp (sorted, deduplicated here) as a set; -1 when empty. */
static int32_t set_intern(gm_core *m) {
    if (m->oom || !m->n_tmp) return -1;
    if (m->n_tmp <= 32) /* most sets are a few stacks: insertion sort beats qsort's calls */
        for (int32_t i = 1; i < m->n_tmp; i++) {
            int32_t x = m->tmp[i], j = i;
            for (; j > 0 && m->tmp[j - 1] > x; j--) m->tmp[j] = m->tmp[j - 1];
            m->tmp[j] = x;
        }
    else
        qsort(m->tmp, (size_t)m->n_tmp, sizeof *m->tmp, cmp_i32);
    int32_t n = 1;
    for (int32_t i = 1; i < m->n_tmp; i++)
        if (m->tmp[i] != m->tmp[n - 1]) m->tmp[n++] = m->tmp[i];
    if (n > GM_MAX_SET) {
        m->oom = 1;
        return -1;
    }
    if ((uint32_t)m->n_sets * 2 >= m->set_hash_cap && !set_rehash(m)) {
        m->oom = 1;
        return -1;
    }
    uint32_t k = set_hash_of(m->tmp, n) & (m->set_hash_cap - 1);
    for (; m->set_hash[k] >= 0; k = (k + 1) & (m->set_hash_cap - 1)) {
        int32_t s = m->set_hash[k];
        if (m->set_len[s] == n && !memcmp(m->set_items + m->set_off[s], m->tmp, (size_t)n * sizeof *m->tmp)) return s;
    }
    if (m->n_sets >= m->cap_sets) {
        int32_t nc = m->cap_sets ? m->cap_sets * 2 : 64;
        int64_t *o = realloc(m->set_off, (size_t)nc * sizeof *o);
        if (o) m->set_off = o;
        int32_t *l = realloc(m->set_len, (size_t)nc * sizeof *l);
        if (l) m->set_len = l;
        int32_t *t = realloc(m->trans, (size_t)nc * 256 * sizeof *t);
        if (t) m->trans = t;
        int32_t *lp = realloc(m->uni, (size_t)nc * sizeof *lp);
        if (lp) m->uni = lp;
        int8_t *cl = realloc(m->closed, (size_t)nc);
        if (cl) m->closed = cl;
        gv_class *lc = realloc(m->uclass, (size_t)nc * sizeof *lc);
        if (lc) m->uclass = lc;
        int32_t *lk = realloc(m->unext, (size_t)nc * sizeof *lk);
        if (lk) m->unext = lk;
        int8_t *lm = realloc(m->loop_multi, (size_t)nc);
        if (lm) m->loop_multi = lm;
        if (!o || !l || !t || !lp || !cl || !lc || !lk || !lm) {
            m->oom = 1;
            return -1;
        }
        m->cap_sets = nc;
    }
    if (m->n_items + n > m->cap_items) {
        int64_t nc = (m->cap_items ? m->cap_items * 2 : 1024) + n;
        int32_t *it = realloc(m->set_items, (size_t)nc * sizeof *it);
        if (!it) {
            m->oom = 1;
            return -1;
        }
        m->set_items = it, m->cap_items = nc;
    }
    int32_t s = m->n_sets++;
    m->set_off[s] = m->n_items, m->set_len[s] = n;
    memcpy(m->set_items + m->n_items, m->tmp, (size_t)n * sizeof *m->tmp);
    m->n_items += n;
    for (int i = 0; i < 256; i++) m->trans[(int64_t)s * 256 + i] = -2;
    m->uni[s] = -2;
    m->closed[s] = -1;
    m->unext[s] = -2;
    m->loop_multi[s] = -1;
    m->set_hash[k] = s;
    return s;
}

/* The set after one byte, computed (not cached). */
static int32_t step(gm_core *m, int32_t set, unsigned byte) {
    m->n_tmp = 0;
    m->epoch++;
    m->work = GM_MAX_WORK;
    const grammar *g = m->g;
    int64_t off = m->set_off[set];
    int32_t len = m->set_len[set];
    for (int32_t i = 0; i < len; i++) {
        int32_t id = m->set_items[off + i];
        if (id == 0) continue;
        gm_node n = m->nodes[id];
        if (gr_has(&g->sets[g->elems[n.pos].arg], byte)) expand(m, n.pos + 1, n.parent, 0);
    }
    return set_intern(m);
}

/* Two bytes that every stack of the set takes or refuses alike lead to the same set: the
 * whole row of transitions is filled with one step per class of such bytes (a JSON string
 * state has a handful of classes, not 256). */
static int32_t advance(gm_core *m, int32_t set, unsigned byte) {
    int32_t *row = &m->trans[(int64_t)set * 256];
    if (row[byte] != -2) return row[byte];
    const grammar *g = m->g;
    int64_t off = m->set_off[set];
    int32_t len = m->set_len[set];
    /* each byte's signature: which of the set's distinct byte sets hold it */
    uint32_t arg[64];
    int k = 0;
    /* distinct byte sets by a stamp per set (a key state holds hundreds of stacks) */
    if (++m->arg_stamp == 0) {
        memset(m->arg_mark, 0, (size_t)g->n_sets * sizeof *m->arg_mark);
        m->arg_stamp = 1;
    }
    for (int32_t i = 0; i < len; i++) {
        int32_t id = m->set_items[off + i];
        if (id == 0) continue;
        uint32_t a = g->elems[m->nodes[id].pos].arg;
        if (m->arg_mark[a] == m->arg_stamp) continue;
        m->arg_mark[a] = m->arg_stamp;
        if (k == 64) {
            k = 65;
            break;
        }
        arg[k++] = a;
    }
    if (k > 64) { /* too many distinct byte sets to classify: this byte alone */
        int32_t r = step(m, set, byte);
        if (m->oom) return -1;
        m->trans[(int64_t)set * 256 + byte] = r;
        return r;
    }
    uint64_t sig[256] = {0};
    for (int j = 0; j < k; j++) { /* the set bits only: key states hold many one-byte sets */
        const gr_byteset *bs = &g->sets[arg[j]];
        for (unsigned w = 0; w < 8; w++)
            for (uint32_t bits = bs->w[w]; bits; bits &= bits - 1)
                sig[w * 32 + (unsigned)__builtin_ctz(bits)] |= (uint64_t)1 << j;
    }
    uint64_t class_sig[256];
    int32_t res[256], out[256];
    int n_class = 0;
    /* classes found through a small open-addressing table on the signature */
    int16_t slot[512];
    memset(slot, 0xff, sizeof slot);
    for (unsigned b = 0; b < 256; b++) {
        if (b && sig[b] == sig[b - 1]) { /* runs of bytes alike are the common case */
            out[b] = out[b - 1];
            continue;
        }
        uint32_t h = mix(sig[b]) & 511;
        while (slot[h] >= 0 && class_sig[slot[h]] != sig[b]) h = (h + 1) & 511;
        int c = slot[h] >= 0 ? slot[h] : n_class;
        if (c == n_class) {
            slot[h] = (int16_t)n_class;
            class_sig[n_class] = sig[b];
            res[n_class++] = sig[b] ? step(m, set, b) : -1; /* no stack takes it: dead */
            if (m->oom) return -1;                          /* not cached: out of memory is not a grammar fact */
        }
        out[b] = res[c];
    }
    row = &m->trans[(int64_t)set * 256]; /* step may have grown the table */
    memcpy(row, out, sizeof out);
    return row[byte];
}

static void core_free(gm_core *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->nodes), free(m->node_hash), free(m->visit);
    free(m->set_items), free(m->set_off), free(m->set_len), free(m->trans), free(m->set_hash), free(m->uni);
    free(m->closed), free(m->uclass), free(m->unext), free(m->loop_multi);
    free(m->tmp), free(m->walk), free(m->arg_mark);
    for (int i = 0; i < GM_MASK_CACHE; i++) free(m->mask_val[i]);
    free(m);
}

void gm_core_free(gm_core *c) { core_free(c); }

static gm_core *core_new(const grammar *g, const gvocab *v) {
    gm_core *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (pthread_mutex_init(&m->mu, NULL)) {
        free(m);
        return NULL;
    }
    m->g = g, m->v = v, m->vkey = v;
    m->cap_nodes = 1024;
    m->nodes = malloc((size_t)m->cap_nodes * sizeof *m->nodes);
    m->visit = calloc((size_t)m->cap_nodes, sizeof *m->visit);
    m->walk = malloc((GV_MAX_TOKEN_BYTES + 2) * sizeof *m->walk);
    m->arg_mark = calloc((size_t)g->n_sets + 1, sizeof *m->arg_mark);
    if (!m->nodes || !m->visit || !m->walk || !m->arg_mark || !node_rehash(m)) {
        core_free(m);
        return NULL;
    }
    m->nodes[0] = (gm_node){UINT32_MAX, -1};
    m->n_nodes = 1;
    for (int i = 0; i < GM_MASK_CACHE; i++) m->mask_key[i] = -1;
    m->epoch = 1;
    m->work = GM_MAX_WORK;
    for (uint32_t a = g->rule_alt0[g->root]; a < g->rule_alt0[g->root + 1]; a++) expand(m, g->alt_start[a], 0, 0);
    m->start = set_intern(m);
    if (m->oom || m->start < 0) {
        core_free(m);
        return NULL;
    }
    return m;
}

/* guards grammar->core, created by the first matcher */
static pthread_mutex_t core_slot_mu = PTHREAD_MUTEX_INITIALIZER;

gmatcher *gmatcher_new(const grammar *g, const gvocab *v) {
    gmatcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_lock(&core_slot_mu);
    grammar *gw = (grammar *)g; /* the cache is not part of the grammar's meaning */
    if (!gw->core) gw->core = core_new(g, v);
    if (gw->core && gw->core->vkey == v)
        m->c = gw->core;
    else
        m->c = core_new(g, v), m->own = 1;
    pthread_mutex_unlock(&core_slot_mu);
    if (!m->c || m->c->oom) {
        gmatcher_free(m);
        return NULL;
    }
    m->ws = calloc(GM_WS_PAIRS, sizeof *m->ws);
    if (!m->ws) {
        gmatcher_free(m);
        return NULL;
    }
    m->cur = m->c->start;
    return m;
}

void gmatcher_free(gmatcher *m) {
    if (!m) return;
    if (m->own) core_free(m->c);
    if (!m->probe) free(m->ws);
    free(m);
}

static int is_space(unsigned b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

/* The byte after state s when the grammar allows exactly one (-1: none; -2: a choice);
 * *ws_other: when the choice is between whitespace and exactly one other byte, that byte
 * (else -1). Called with the core locked. */
static int forced_byte(gm_core *c, int32_t s, int *ws_other) {
    int only = -1, other = -1, n_other = 0, n_ws = 0;
    for (int b = 0; b < 256; b++) {
        int32_t r = c->trans[(int64_t)s * 256 + b];
        if (r == -2) r = advance(c, s, (unsigned)b); /* the first fills the state's whole row */
        if (c->oom) return *ws_other = -1, -2;
        if (r < 0) continue;
        only = only == -1 ? b : -2;
        if (is_space((unsigned)b))
            n_ws++;
        else
            other = b, n_other++;
    }
    *ws_other = n_ws && n_other == 1 ? other : -1;
    return only;
}

/* The entry of the pair (before, after); NULL: not learned. */
static gm_ws *ws_find(gm_ws *ws, unsigned before, unsigned after) {
    for (int i = 0; ws && i < GM_WS_PAIRS; i++)
        if (ws[i].known && ws[i].before == before && ws[i].after == after) return &ws[i];
    return NULL;
}

/* Keeps the whitespace run[0..n) the output wrote between before and after, before's line
 * indented by indent. */
static void ws_learn(gmatcher *m, unsigned before, unsigned after, const char *run, int n, int indent) {
    gm_ws *w = ws_find(m->ws, before, after);
    if (!w) w = &m->ws[m->ws_next], m->ws_next = (m->ws_next + 1) % GM_WS_PAIRS;
    int nl = n - 1;
    while (nl >= 0 && run[nl] != '\n') nl--;
    *w = (gm_ws){.known = 1, .len = (uint8_t)n, .before = (uint8_t)before, .after = (uint8_t)after};
    memcpy(w->run, run, (size_t)n);
    if (nl < 0 || nl == n - 1) return; /* no newline, or nothing after it: as written */
    for (int i = nl + 2; i < n; i++)
        if (run[i] != run[nl + 1]) return; /* mixed indentation: as written */
    int delta = (n - nl - 1) - indent;
    if (delta < -GM_WS_MAX || delta > GM_WS_MAX) return;
    w->len = (uint8_t)(nl + 1), w->indent_char = (uint8_t)run[nl + 1], w->indent_delta = (int8_t)delta;
}

/* The whitespace to guess between the layout's last byte and after, less what the output
 * has written of it already (into out, GM_WS_MAX bytes at most); -1: none known, or the
 * whitespace written is not the start of the guess. */
static int ws_guess(gm_ws *ws, const gm_layout *l, unsigned after, char *out) {
    const gm_ws *w = l->has_prev && l->run_len >= 0 ? ws_find(ws, l->prev, after) : NULL;
    if (!w) return -1;
    char full[GM_WS_MAX];
    int n = w->len;
    memcpy(full, w->run, (size_t)n);
    if (w->indent_char) {
        int indent = l->prev_indent + w->indent_delta;
        if (indent < 0 || n + indent > GM_WS_MAX) return -1;
        memset(full + n, w->indent_char, (size_t)indent);
        n += indent;
    }
    if (l->run_len > n || memcmp(full, l->run, (size_t)l->run_len)) return -1;
    memcpy(out, full + l->run_len, (size_t)(n - l->run_len));
    return n - l->run_len;
}

/* Follows one byte of output in l; m (NULL: none) learns the whitespace between two bytes
 * where the grammar chose between whitespace and the second byte alone, as a guess is made
 * (so a free text's word breaks never crowd out a layout's). s: the state b leads to
 * (m's core locked). */
static void layout_byte(gm_layout *l, gmatcher *m, unsigned b, int32_t s) {
    if (is_space(b)) {
        if (l->run_len >= 0 && l->run_len < GM_WS_MAX)
            l->run[l->run_len++] = (char)b;
        else
            l->run_len = -1;
        if (b == '\n')
            l->indent = 0, l->in_indent = 1;
        else if (l->in_indent)
            l->indent++;
        return;
    }
    int other;
    if (m && l->has_prev && l->run_len >= 0 && forced_byte(m->c, l->prev_set, &other) < 0 && other == (int)b)
        ws_learn(m, l->prev, b, l->run, l->run_len, l->prev_indent);
    l->has_prev = 1, l->prev = (uint8_t)b, l->prev_indent = l->indent, l->prev_set = s;
    l->run_len = 0, l->in_indent = 0;
}

static int set_ends(const gm_core *c, int32_t s, int only) {
    return s >= 0 && (only ? c->set_len[s] == 1 : c->set_len[s] != 0) && c->set_items[c->set_off[s]] == 0;
}

int gmatcher_can_end(const gmatcher *m) {
    if (m->done) return 1;
    pthread_mutex_lock(&m->c->mu);
    int r = set_ends(m->c, m->cur, 0);
    pthread_mutex_unlock(&m->c->mu);
    return r;
}

int gmatcher_is_done(const gmatcher *m) {
    if (m->done) return 1;
    pthread_mutex_lock(&m->c->mu);
    int r = set_ends(m->c, m->cur, 1);
    pthread_mutex_unlock(&m->c->mu);
    return r;
}

/* The set every byte of [lo, hi] leads t to, or -1 when they differ or die. */
static int32_t uniform(gm_core *m, int32_t t, unsigned lo, unsigned hi) {
    int32_t r = advance(m, t, lo);
    for (unsigned b = lo + 1; r >= 0 && b <= hi; b++)
        if (advance(m, t, b) != r) return -1;
    return r;
}

/* uniform() results of one caller: the sets mid-character are few (one per remaining
 * length), so each is checked once, not once per lead byte */
typedef struct {
    int32_t t[8], r[8];
    uint8_t lo[8];
    int n;
} gm_memo;

static int32_t uniform_memo(gm_core *m, gm_memo *mo, int32_t t, unsigned lo, unsigned hi) {
    for (int i = 0; i < mo->n; i++)
        if (mo->t[i] == t && mo->lo[i] == lo) return mo->r[i];
    int32_t r = uniform(m, t, lo, hi);
    if (mo->n < 8) mo->t[mo->n] = t, mo->lo[mo->n] = (uint8_t)lo, mo->r[mo->n++] = r;
    return r;
}

/* The set a plain character starting with lead byte `lead` leads s to, when every such
 * character leads there (-1: they differ or die). */
static int32_t char_target(gm_core *m, gm_memo *mo, int32_t s, unsigned lead) {
    if (lead < 0x80) return advance(m, s, lead);
    const gv_utf8_lead *q = utf8_lead(lead);
    if (!q) return -1;
    int32_t t = advance(m, s, lead);
    if (t >= 0) t = uniform_memo(m, mo, t, q->lo, q->hi);
    for (int k = 0; t >= 0 && k < q->more; k++) t = uniform_memo(m, mo, t, 0x80, 0xBF);
    return t;
}

/* The one set every plain character (plain_token's alphabet) leads set s to, or -1. */
static int32_t plain_next(gm_core *m, int32_t s) {
    if (m->uni[s] != -2) return m->uni[s];
    gm_memo mo = {.n = 0};
    int32_t to = advance(m, s, 'a');
    for (unsigned b = 0x20; to >= 0 && b < 0x80; b++)
        if (b != '"' && b != '\\' && advance(m, s, b) != to) to = -1;
    for (unsigned lead = 0xC2; to >= 0 && lead <= 0xF4; lead++)
        if (char_target(m, &mo, s, lead) != to) to = -1;
    if (m->oom) return -1; /* not cached: out of memory is not a grammar fact */
    m->uni[s] = to;
    return to;
}

/* Every short plain token is allowed from s: GV_SHORT plain characters in a row lead
 * through states where each plain character goes to one next state. */
static int short_plain_ok(gm_core *m, int32_t s) {
    for (int i = 0; i < GV_SHORT && s >= 0; i++) s = plain_next(m, s);
    return s >= 0;
}

/* A class of ASCII bytes that all lead set s to one set, *next (-1: an empty class): of
 * the bytes that letters or digits lead to, the larger class. A string body under a
 * character class (a uri's path, an email's local part, a length-bounded string) moves
 * through such classes: a token whose remaining bytes each stay in the class of the set
 * they reach is allowed, whatever they are. */
static const gv_class *gm_uclass(gm_core *m, int32_t s, int32_t *next) {
    if (m->unext[s] == -2) {
        advance(m, s, 'a');      /* fills the row (but for the bytes of a set too varied to classify) */
        if (m->oom) return NULL; /* not cached: out of memory is not a grammar fact */
        const int32_t *row = &m->trans[(int64_t)s * 256];
        gv_class best = {{0, 0}};
        int32_t best_to = -1;
        int best_n = 0;
        for (int k = 0; k < 2; k++) {
            int32_t to = row[k ? '0' : 'a'];
            if (to < 0 || to == best_to) continue;
            gv_class c = {{0, 0}};
            int n = 0;
            for (unsigned b = 1; b < 0x80; b++)
                if (row[b] == to) c.w[b >> 6] |= (uint64_t)1 << (b & 63), n++;
            if (n > best_n) best = c, best_to = to, best_n = n;
        }
        m->uclass[s] = best, m->unext[s] = best_to;
    }
    *next = m->unext[s];
    return &m->uclass[s];
}

/* Every multi-byte character (plain_token's) leads set s back to s. */
static int loop_multi(gm_core *m, int32_t s) {
    if (m->loop_multi[s] < 0) {
        gm_memo mo = {.n = 0};
        int ok = 1;
        for (unsigned lead = 0xC2; ok && lead <= 0xF4; lead++) ok = char_target(m, &mo, s, lead) == s;
        if (m->oom) return 0; /* not cached: out of memory is not a grammar fact */
        m->loop_multi[s] = (int8_t)ok;
    }
    return m->loop_multi[s];
}

/* Subtrees taller than this are not tried whole through a chain of classes; their children
 * are. (A state's class that leads back to itself takes a subtree of any height.) */
#define GM_WHOLE_HEIGHT 24

/* Every token below trie node i is allowed from set s: each byte at depth d below it is
 * in the class (gm_uclass) of the set the d bytes before it lead to. Multi-byte characters
 * below: only where s's class leads back to s and so does every such character, from a
 * node at a character boundary. */
static int subtree_whole(gm_core *m, const gv_trie *t, int32_t i, int32_t s) {
    int h = t->height[i];
    uint8_t flags = t->below_flags[i];
    if (h == 0 || (flags & GV_BELOW_BAD)) return 0; /* a leaf: the node's own tokens are set anyway */
    const gv_class *b = &t->below[i];
    int32_t next;
    const gv_class *c = gm_uclass(m, s, &next);
    if (!c || (b->w[0] & ~c->w[0]) || (b->w[1] & ~c->w[1])) return 0;
    if (next == s) return !(flags & GV_BELOW_MULTI) || (t->whole[i] && loop_multi(m, s));
    if ((flags & GV_BELOW_MULTI) || h > GM_WHOLE_HEIGHT || next < 0) return 0;
    uint64_t k0 = c->w[0], k1 = c->w[1];
    for (int d = 1; d < h; d++) {
        s = next;
        c = gm_uclass(m, s, &next);
        if (!c) return 0;
        k0 &= c->w[0], k1 &= c->w[1];
        if ((b->w[0] & ~k0) || (b->w[1] & ~k1)) return 0;
        if (next < 0 && d + 1 < h) return 0;
    }
    return 1;
}

/* Sets the bits of every token of trie t's nodes [from, to) (whole subtrees of the root)
 * reachable from set s; returns how many. plain: t holds short plain tokens only, so where
 * a character ends in a state every plain character leads on uniformly GV_SHORT times, the
 * whole subtree is allowed and set without walking it. */
static size_t walk_nodes(gm_core *m, const gv_trie *t, int32_t s, uint32_t *bits, int32_t from, int32_t to, int plain) {
    size_t count = 0;
    int32_t *st = m->walk;
    st[0] = s;
    for (int32_t i = from; i < to;) {
        int32_t from = st[t->depth[i] - 1];
        int32_t nx = m->trans[(int64_t)from * 256 + t->byte[i]];
        if (nx == -2) nx = advance(m, from, t->byte[i]);
        if (nx < 0) {
            i = t->end[i];
            continue;
        }
        st[t->depth[i]] = nx;
        if (subtree_whole(m, t, i, nx) || (plain && t->whole[i] && short_plain_ok(m, nx))) {
            int32_t hi = t->end[i] < t->n_nodes ? t->sub_lo[t->end[i]] : t->n_tok;
            for (int32_t k = t->sub_lo[i]; k < hi; k++) {
                int32_t id = t->tok_sorted[k];
                bits[id >> 5] |= 1u << (id & 31);
            }
            count += (size_t)(hi - t->sub_lo[i]);
            i = t->end[i];
            continue;
        }
        for (int32_t k = 0; k < t->tok_n[i]; k++) {
            int32_t id = t->tok_sorted[t->tok_first[i] + k];
            bits[id >> 5] |= 1u << (id & 31);
            count++;
        }
        i++;
    }
    return count;
}

static size_t walk_trie(gm_core *m, const gv_trie *t, int32_t s, uint32_t *bits) {
    return walk_nodes(m, t, s, bits, 0, t->n_nodes, 0);
}

/* States where most plain characters lead to one state u from which every plain token's
 * remaining characters are allowed (up to *limit characters in all) (a string body whose first character is special for
 * a few bytes: a key that must differ from the declared names, a format excluding some characters). Every short plain
 * token is allowed but those whose first byte is an exception (exc): returns u (-1: no such state). */
/* No plain character can follow s. */
static int plain_dead(gm_core *m, int32_t s) {
    for (unsigned b = 0x20; b < 0x80; b++)
        if (b != '"' && b != '\\' && advance(m, s, b) >= 0) return 0;
    for (unsigned b = 0xC2; b <= 0xF4; b++)
        if (advance(m, s, b) >= 0) return 0;
    return 1;
}

static int32_t plain_main(gm_core *m, int32_t s, gr_byteset *exc, int *limit) {
    int32_t tgt[256];
    int32_t u = -1, best = 0;
    for (unsigned b = 0x20; b < 0x80; b++) {
        if (b == '"' || b == '\\') continue;
        tgt[b] = advance(m, s, b);
        if (tgt[b] < 0 || tgt[b] == u) continue;
        int n = 0;
        for (unsigned c = 0x20; c <= b; c++) n += c != '"' && c != '\\' && tgt[c] == tgt[b];
        if (n > best) best = n, u = tgt[b];
    }
    if (u < 0 || m->oom) return -1;
    /* the characters after the first: uniform steps until GV_SHORT, or until none may
     * follow (a length bound): then tokens of at most that many characters */
    int32_t t = u;
    int j = 0;
    for (; j < GV_SHORT - 1; j++) {
        int32_t nt = plain_next(m, t);
        if (nt < 0) {
            if (m->oom || !plain_dead(m, t)) return -1;
            break;
        }
        t = nt;
    }
    *limit = j + 1;
    memset(exc, 0, sizeof *exc);
    for (unsigned b = 0x20; b < 0x80; b++)
        if (b != '"' && b != '\\' && tgt[b] != u) gr_add(exc, b);
    gm_memo mo = {.n = 0};
    for (unsigned b = 0xC2; b <= 0xF4; b++)
        if (char_target(m, &mo, s, b) != u) gr_add(exc, b);
    /* when the exceptions hold most tokens, walking the whole trie costs less */
    const gv_trie *pt = &m->v->plain;
    int64_t n_exc = 0;
    for (unsigned b = 0; b < 256; b++)
        if (gr_has(exc, b) && pt->root[b] >= 0) n_exc += pt->root_hi[b] - pt->root_lo[b];
    if (n_exc * 2 > pt->n_tok) return -1;
    return m->oom ? -1 : u;
}

/* Every short plain token is allowed from s although plain characters lead it to different
 * states (a pattern searched inside a string, whose progress each character moves): every
 * state fewer than GV_SHORT plain characters away takes every plain character. Breadth
 * first over those states, at most GM_CLOSED_MAX of them (else: not shown, 0). */
#define GM_CLOSED_MAX 256
#define GM_CLOSED_HASH 1024 /* open addressing over the states seen, a power of two */
static int plain_closed(gm_core *m, int32_t s) {
    if (m->closed[s] >= 0) return m->closed[s];
    int32_t seen[GM_CLOSED_MAX], hash[GM_CLOSED_HASH];
    memset(hash, 0xff, sizeof hash);
    int n = 0, lo = 0, ok = 1;
    seen[n++] = s;
    hash[mix((uint64_t)s) & (GM_CLOSED_HASH - 1)] = s;
    for (int level = 0; level < GV_SHORT && ok; level++) {
        int hi = n;
        for (int i = lo; i < hi && ok; i++) {
            gm_memo mo = {.n = 0};
            for (unsigned b = 0x20; b < 0xF5 && ok; b++) {
                if (b == '"' || b == '\\' || (b >= 0x80 && b < 0xC2)) continue;
                int32_t nx = b < 0x80 ? advance(m, seen[i], b) : char_target(m, &mo, seen[i], b);
                if (nx < 0) {
                    ok = 0;
                    break;
                }
                if (level == GV_SHORT - 1) continue; /* the last character's state need not go on */
                uint32_t k = mix((uint64_t)nx) & (GM_CLOSED_HASH - 1);
                while (hash[k] >= 0 && hash[k] != nx) k = (k + 1) & (GM_CLOSED_HASH - 1);
                if (hash[k] == nx) continue;
                if (n == GM_CLOSED_MAX) {
                    ok = 0;
                    break;
                }
                hash[k] = nx, seen[n++] = nx;
            }
        }
        lo = hi;
    }
    if (m->oom) return 0; /* not cached: out of memory is not a grammar fact */
    m->closed[s] = (int8_t)ok;
    return ok;
}

static size_t compute_mask(gm_core *m, int32_t cur, uint32_t *bits) {
    const gvocab *v = m->v;
    size_t words = ((size_t)v->n_tokens + 31) / 32, count = 0;
    memset(bits, 0, words * sizeof *bits);
    gr_byteset exc;
    int limit = GV_SHORT;
    /* every short plain token allowed: plain characters lead on uniformly, or (tried last,
     * a search over the states near) to states that all go on */
    int all_plain = v->n_plain && short_plain_ok(m, cur);
    int main_ok = !all_plain && v->n_plain && plain_main(m, cur, &exc, &limit) >= 0;
    if (!all_plain && !main_ok && v->n_plain) all_plain = plain_closed(m, cur);
    if (all_plain) {
        memcpy(bits, v->plain_bits, words * sizeof *bits);
        count = v->n_plain + walk_trie(m, &v->rest, cur, bits);
    } else if (main_ok) {
        /* the short plain tokens up to the limit, less those of the exception first bytes,
         * which are walked */
        const gv_trie *pt = &v->plain;
        memcpy(bits, v->plain_le[limit - 1], words * sizeof *bits);
        count = v->n_plain_le[limit - 1];
        for (unsigned b = 0; b < 256; b++) {
            if (!gr_has(&exc, b) || pt->root[b] < 0) continue;
            for (int32_t k = pt->root_lo[b]; k < pt->root_hi[b]; k++) {
                int32_t id = pt->tok_sorted[k];
                uint32_t bit = 1u << (id & 31);
                count -= (bits[id >> 5] & bit) != 0;
                bits[id >> 5] &= ~bit;
            }
            count += walk_nodes(m, pt, cur, bits, pt->root[b], pt->end[pt->root[b]], 1);
        }
        count += walk_trie(m, &v->rest, cur, bits);
    } else
        count = walk_trie(m, &v->all, cur, bits);
    if (set_ends(m, cur, 0))
        for (int k = 0; k < v->n_eos; k++)
            if (!(bits[v->eos[k] >> 5] >> (v->eos[k] & 31) & 1))
                bits[v->eos[k] >> 5] |= 1u << (v->eos[k] & 31), count++;
    return count;
}

size_t gmatcher_mask(gmatcher *mt, uint32_t *bits) {
    gm_core *m = mt->c;
    size_t words = ((size_t)m->v->n_tokens + 31) / 32;
    if (mt->done) {
        memset(bits, 0, words * sizeof *bits);
        return 0;
    }
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < GM_MASK_CACHE; i++)
        if (m->mask_key[i] == mt->cur) {
            memcpy(bits, m->mask_val[i], words * sizeof *bits);
            size_t n = m->mask_count[i];
            pthread_mutex_unlock(&m->mu);
            return n;
        }
    size_t n = compute_mask(m, mt->cur, bits);
    if (!m->oom) {
        int slot = m->mask_next;
        if (!m->mask_val[slot]) m->mask_val[slot] = malloc(words * sizeof *bits);
        if (m->mask_val[slot]) {
            memcpy(m->mask_val[slot], bits, words * sizeof *bits);
            m->mask_key[slot] = mt->cur, m->mask_count[slot] = n;
            m->mask_next = (slot + 1) % GM_MASK_CACHE;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

int gmatcher_accept_bytes(gmatcher *mt, const char *bytes, size_t n) {
    if (mt->done) return n == 0;
    gm_core *m = mt->c;
    pthread_mutex_lock(&m->mu);
    int32_t s = mt->cur;
    for (size_t i = 0; i < n && s >= 0; i++) s = advance(m, s, (unsigned char)bytes[i]);
    if (s >= 0) /* again through the transitions just made, for the layout */
        for (size_t i = 0; i < n; i++) {
            mt->cur = m->trans[(int64_t)mt->cur * 256 + (unsigned char)bytes[i]];
            layout_byte(&mt->lay, mt->probe ? NULL : mt, (unsigned char)bytes[i], mt->cur);
        }
    pthread_mutex_unlock(&m->mu);
    return s >= 0;
}

int gmatcher_accept(gmatcher *m, int32_t token) {
    const gvocab *v = m->c->v;
    if (token < 0 || token >= v->n_tokens || m->done) return 0;
    for (int k = 0; k < v->n_eos; k++)
        if (v->eos[k] == token) {
            if (!gmatcher_can_end(m)) return 0;
            m->done = 1;
            return 1;
        }
    if (!v->len[token]) return 0;
    return gmatcher_accept_bytes(m, v->bytes[token], v->len[token]);
}

/* A copy of m that tries tokens: the shared core is only read through it, the state is its own,
 * and it learns no layout. */
static gmatcher probe_of(const gmatcher *m) {
    gmatcher probe = *m;
    probe.own = 0, probe.probe = 1;
    return probe;
}

/* How many of tokens[0..n) the probe accepts in order (it moves over them). */
static size_t probe_accept(gmatcher *probe, const int32_t *tokens, size_t n) {
    size_t k = 0;
    while (k < n && gmatcher_accept(probe, tokens[k])) k++;
    return k;
}

size_t gmatcher_allowed_prefix(const gmatcher *m, const int32_t *tokens, size_t n) {
    gmatcher probe = probe_of(m);
    return probe_accept(&probe, tokens, n);
}


/* The longest token of t spelled by a prefix of b[0..n) (-1: none), its length in *len. */
static int32_t trie_longest(const gv_trie *t, const uint8_t *b, size_t n, size_t *len) {
    int32_t best = -1, i = n ? t->root[b[0]] : -1;
    for (size_t d = 1; i >= 0; d++) {
        if (t->tok_n[i] > 0) best = t->tok_sorted[t->tok_first[i]], *len = d;
        if (d == n) break;
        int32_t c = i + 1, next = -1; /* the children: the nodes one deeper, each subtree skipped */
        while (c < t->end[i] && next < 0) {
            if (t->byte[c] == b[d]) next = c;
            c = t->end[c];
        }
        i = next;
    }
    return best;
}

/* gmatcher_forced_bytes from the probe's own state (it does not move). */
static size_t forced_from(const gmatcher *probe, char *out, size_t cap) {
    if (probe->done) return 0;
    size_t nb = 0;
    gm_core *c = probe->c;
    gm_layout lay = probe->lay;
    pthread_mutex_lock(&c->mu);
    for (int32_t s = probe->cur; nb < cap && s >= 0 && !set_ends(c, s, 0);) {
        int other, b = forced_byte(c, s, &other);
        if (b < 0 && other >= 0) { /* optional whitespace before a forced byte: as this output lays it out */
            char guess[GM_WS_MAX];
            int g = ws_guess(probe->ws, &lay, (unsigned)other, guess);
            if (g < 0 || nb + (size_t)g >= cap) break;
            int32_t t = s;
            for (int i = 0; i < g && t >= 0; i++) t = advance(c, t, (unsigned char)guess[i]);
            if (t < 0 || advance(c, t, (unsigned)other) < 0) break;
            for (int i = 0; i < g; i++) out[nb++] = guess[i], layout_byte(&lay, NULL, (unsigned char)guess[i], -1);
            s = t, b = other;
        }
        if (b < 0) break; /* none, or a choice: nothing more is forced */
        out[nb++] = (char)b;
        s = advance(c, s, (unsigned)b);
        layout_byte(&lay, NULL, (unsigned)b, s);
    }
    pthread_mutex_unlock(&c->mu);
    return nb;
}

size_t gmatcher_forced_bytes(const gmatcher *m, const int32_t *tokens, size_t n, char *out, size_t cap) {
    gmatcher probe = probe_of(m);
    return probe_accept(&probe, tokens, n) == n ? forced_from(&probe, out, cap) : 0;
}

size_t gmatcher_extend_forced(const gmatcher *m, int32_t *tokens, size_t n, size_t cap, gm_spell_fn spell,
                              void *spell_ctx) {
    if (n >= cap) return n;
    char forced[128];
    gmatcher probe = probe_of(m);
    size_t nb = probe_accept(&probe, tokens, n) == n ? forced_from(&probe, forced, sizeof forced) : 0;
    if (!nb) return n;
    const gvocab *v = probe.c->v;
    size_t at = 0; /* forced bytes spelled so far */
    if (spell)     /* the tokenizer's own spelling, what the model most likely writes */
        for (size_t k = 0, got = spell(spell_ctx, forced, nb, tokens + n, cap - n); k < got; k++) {
            int32_t tok = tokens[n];
            if (!gmatcher_accept(&probe, tok)) break;
            n++;
            /* a spelling of other bytes (a tokenizer that normalizes) is proposed as far as the
             * grammar allows it, and not continued */
            if (at + v->len[tok] > nb || memcmp(forced + at, v->bytes[tok], v->len[tok])) return n;
            at += v->len[tok];
        }
    /* the rest (no speller, a spelling the grammar stops, a special token's marker that a
     * tokenizer does not spell) by the longest tokens */
    while (at < nb && n < cap) {
        size_t len = 0;
        int32_t tok = trie_longest(&v->all, (const uint8_t *)forced + at, nb - at, &len);
        if (tok < 0 || !gmatcher_accept(&probe, tok)) break;
        tokens[n++] = tok, at += len;
    }
    return n;
}
