/* tok_util.c: small building blocks of the tokenizer: string lists, the string->id
 * hash map, UTF-8 walking and lossy repair, Unicode character classes, the GPT-2
 * byte alphabet and PCRE2 helpers. No tokenizer logic lives here. */
#include "base/hash.h"
#include "tok/tok_internal.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

void tok_sl_init(tok_strlist *l) { memset(l, 0, sizeof *l); sbuf_init(&l->text); }
void tok_sl_free(tok_strlist *l) {
    sbuf_free(&l->text);
    free(l->off); free(l->len); free(l->at_start);
    memset(l, 0, sizeof *l);
}
void tok_sl_reset(tok_strlist *l) { sbuf_reset(&l->text); l->n = 0; }

int tok_sl_push(tok_strlist *l, const char *s, size_t n, int at_start) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        size_t *off = realloc(l->off, cap * sizeof *off);
        if (off) l->off = off;
        size_t *len = realloc(l->len, cap * sizeof *len);
        if (len) l->len = len;
        uint8_t *st = realloc(l->at_start, cap);
        if (st) l->at_start = st;
        if (!off || !len || !st) return 0;
        l->cap = cap;
    }
    size_t o = l->text.len;
    sbuf_append(&l->text, s, n);
    if (l->text.oom) return 0;
    l->off[l->n] = o;
    l->len[l->n] = n;
    l->at_start[l->n] = (uint8_t)(at_start != 0);
    l->n++;
    return 1;
}

int tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return 0;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 1;
}

/* FNV-1a, 64-bit: simple and good enough for vocabulary strings. */
uint64_t tok_hash_bytes(const char *s, size_t n) { return fnv1a64(FNV1A64_INIT, s, n); }

int tok_strmap_init(tok_strmap *m, size_t expected, char **keys, uint32_t *key_lens) {
    uint32_t cap = 16;
    while (cap < expected * 2 + 16 && cap < (1u << 30)) cap <<= 1; /* load factor <= 0.5 */
    m->slots = malloc((size_t)cap * sizeof *m->slots);
    if (!m->slots) return 0;
    memset(m->slots, 0xff, (size_t)cap * sizeof *m->slots);
    m->cap = cap;
    m->keys = keys;
    m->key_lens = key_lens;
    return 1;
}
void tok_strmap_free(tok_strmap *m) { free(m->slots); m->slots = NULL; m->cap = 0; }

void tok_strmap_put(tok_strmap *m, int32_t id) {
    const char *k = m->keys[id];
    uint32_t kl = m->key_lens[id];
    uint32_t i = (uint32_t)tok_hash_bytes(k, kl) & (m->cap - 1);
    for (;;) {
        int32_t s = m->slots[i];
        if (s < 0) { m->slots[i] = id; return; }
        if (m->key_lens[s] == kl && memcmp(m->keys[s], k, kl) == 0) { m->slots[i] = id; return; }
        i = (i + 1) & (m->cap - 1);
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint32_t i = (uint32_t)tok_hash_bytes(s, n) & (m->cap - 1);
    for (;;) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        if (m->key_lens[id] == n && memcmp(m->keys[id], s, n) == 0) return id;
        i = (i + 1) & (m->cap - 1);
    }
}

int tok_utf8_len(const uint8_t *s, size_t avail) {
    if (avail == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) { n = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) { n = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) { n = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) { n = 4; hi = 0x8F; }
    else return 0;
    if (avail < 2 || s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if ((size_t)i >= avail || (s[i] & 0xC0) != 0x80) return 0;
    return n;
}

int32_t tok_utf8_decode(const char *s, size_t avail, int *n) {
    const uint8_t *u = (const uint8_t *)s;
    int l = tok_utf8_len(u, avail);
    if (l == 0) { *n = 1; return 0xFFFD; }
    *n = l;
    if (l == 1) return u[0];
    if (l == 2) return ((u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    if (l == 3) return ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}

int tok_utf8_encode(int32_t cp, char out[4]) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_utf8_valid(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int l = tok_utf8_len((const uint8_t *)s + i, n - i);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* Length of the longest prefix of s that is the start of a valid sequence (the
 * "maximal subpart" Rust and WHATWG replace with one U+FFFD). At least 1. */
static size_t maximal_subpart(const uint8_t *s, size_t avail) {
    uint8_t c = s[0];
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) { n = 3; lo = 0xA0; }
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) n = 3;
    else if (c == 0xED) { n = 3; hi = 0x9F; }
    else if (c == 0xF0) { n = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) { n = 4; hi = 0x8F; }
    else return 1;
    size_t i = 1;
    if (i < avail && s[i] >= lo && s[i] <= hi) i++;
    else return 1;
    while ((int)i < n && i < avail && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

void tok_utf8_lossy(sbuf *out, const char *s, size_t n) {
    size_t i = 0, run = 0;
    while (i < n) {
        int l = tok_utf8_len((const uint8_t *)s + i, n - i);
        if (l) { i += (size_t)l; continue; }
        sbuf_append(out, s + run, i - run);
        sbuf_append(out, "\xEF\xBF\xBD", 3);
        i += maximal_subpart((const uint8_t *)s + i, n - i);
        run = i;
    }
    sbuf_append(out, s + run, n - run);
}

int tok_is_whitespace(int32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

int tok_is_punctuation(int32_t c) {
    if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

int tok_is_alnum(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68
 * bytes to U+0100.. in byte order, so every byte has a visible, non-space char. */
int32_t tok_byte_to_cp[256];
static int16_t cp_to_byte_tab[324];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;
static void bytelevel_build(void) {
    int next = 256;
    for (int i = 0; i < 324; i++) cp_to_byte_tab[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        tok_byte_to_cp[b] = printable ? b : next++;
        cp_to_byte_tab[tok_byte_to_cp[b]] = (int16_t)b;
    }
}
void tok_bytelevel_init(void) { pthread_once(&bytelevel_once, bytelevel_build); }
int tok_cp_to_byte(int32_t cp) { return (cp >= 0 && cp < 324) ? cp_to_byte_tab[cp] : -1; }

pcre2_code *tok_regex_compile(const char *pattern, hearth_error *err) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        err_set(err, HEARTH_ERR_UNSUPPORTED, "regex '%.200s' at offset %zu: %s", pattern, (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort: falls back to the interpreter */
    return re;
}

int tok_regex_spans(const pcre2_code *re, const char *s, size_t n, size_t **spans, size_t *n_spans, size_t *cap) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return 0;
    int ok = tok_regex_spans_md(re, md, s, n, spans, n_spans, cap);
    pcre2_match_data_free(md);
    return ok;
}

int tok_regex_spans_md(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, size_t **spans,
                       size_t *n_spans, size_t *cap) {
    size_t pos = 0;
    *n_spans = 0;
    int ok = 1;
    while (pos <= n) {
        /* The input was validated as UTF-8 once, so PCRE2 need not check it again. */
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) { ok = (rc == PCRE2_ERROR_NOMATCH); break; }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (b > a) {
            if (*n_spans + 2 > *cap) {
                size_t c = *cap ? *cap * 2 : 64;
                size_t *v = realloc(*spans, c * sizeof *v);
                if (!v) { ok = 0; break; }
                *spans = v;
                *cap = c;
            }
            (*spans)[(*n_spans)++] = a;
            (*spans)[(*n_spans)++] = b;
            pos = b;
        } else {
            if (a >= n) break;
            int l = tok_utf8_len((const uint8_t *)s + a, n - a);
            pos = a + (size_t)(l ? l : 1);
        }
    }
    *n_spans /= 2;
    return ok;
}
