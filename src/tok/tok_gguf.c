/* tok_gguf.c: builds a tokenizer from GGUF vocabulary metadata, equivalent to what
 * transformers' GGUF conversion builds (integrations/gguf/gguf_tokenizer_mapping.py):
 * "gpt2" -> byte-level BPE with the pre-tokenizer regex picked by tokenizer.ggml.pre;
 * "llama" -> SentencePiece-style BPE with byte fallback, merges recovered from the
 * vocabulary when the file has none (Gemma: by token position);
 * "gemma4" -> Gemma 4's tokenizer.json: spaces replaced by U+2581, no pre-tokenizer, BPE
 * with the file's merges and byte fallback, always a BOS. Reads metadata only. */
#include "tok/tok_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *LLAMA3_SPLIT =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *QWEN2_SPLIT =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *GPT4O_SPLIT =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *TEKKEN_SPLIT =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* tokenizer.ggml.pre -> split regex; names not listed keep plain ByteLevel (GPT-2). */
static const char *split_for_pre(const char *pre) {
    static const char *llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                                   "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"};
    static const char *qwen2[] = {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"};
    static const char *gpt4o[] = {"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"};
    if (!pre) return NULL;
    for (size_t i = 0; i < sizeof llama3 / sizeof *llama3; i++) if (!strcmp(pre, llama3[i])) return LLAMA3_SPLIT;
    for (size_t i = 0; i < sizeof qwen2 / sizeof *qwen2; i++) if (!strcmp(pre, qwen2[i])) return QWEN2_SPLIT;
    for (size_t i = 0; i < sizeof gpt4o / sizeof *gpt4o; i++) if (!strcmp(pre, gpt4o[i])) return GPT4O_SPLIT;
    if (!strcmp(pre, "tekken")) return TEKKEN_SPLIT;
    return NULL;
}

/* tokenizer.ggml.pre names whose text llama.cpp splits at every numeric character first (its
 * "\\p{N}" expression) and then with GPT-2's regex: what HF's Sequence of Digits(individual)
 * and ByteLevel does, SmolLM2's own tokenizer.json. transformers' GGUF conversion reads them
 * as plain ByteLevel, which tokenizes a numeral after a space (" ½", " ٣") otherwise. */
static int digits_first(const char *pre) {
    static const char *names[] = {"smollm", "codeshell", "exaone", "minerva", "mellum2"};
    for (size_t i = 0; pre && i < sizeof names / sizeof *names; i++)
        if (!strcmp(pre, names[i])) return 1;
    return 0;
}

const char *tok_gguf_pre_digits_name(void) { return "smollm"; }

const char *tok_gguf_pre_name(const char *split_regex) {
    if (!split_regex) return "gpt-2"; /* plain ByteLevel with its own (GPT-2) regex */
    if (!strcmp(split_regex, LLAMA3_SPLIT)) return "llama-bpe";
    if (!strcmp(split_regex, QWEN2_SPLIT)) return "qwen2";
    if (!strcmp(split_regex, GPT4O_SPLIT)) return "gpt-4o";
    if (!strcmp(split_regex, TEKKEN_SPLIT)) return "tekken";
    return NULL;
}

static int all_in_byte_alphabet(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int l;
        if (tok_cp_to_byte(tok_utf8_decode(s + i, n - i, &l)) < 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

static int only_spaces_with_one(const char *s, size_t n, size_t *chars) {
    int space = 0;
    *chars = 0;
    for (size_t i = 0; i < n;) {
        int l;
        int32_t c = tok_utf8_decode(s + i, n - i, &l);
        if (!tok_is_whitespace(c) && c != 0x1C && c != 0x1D && c != 0x1E && c != 0x1F) return 0; /* Python's str.strip set */
        space |= c == ' ';
        i += (size_t)l;
        (*chars)++;
    }
    return space && n > 0;
}

/* ---- merges recovered from the vocabulary (transformers' generate_merges) ---------- */
typedef struct cand { int32_t l, r; double score; uint32_t ll, rl; size_t order; } cand;

static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    /* descending (score, len l, len r); ties keep their original order */
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->ll != b->ll) return a->ll > b->ll ? -1 : 1;
    if (a->rl != b->rl) return a->rl > b->rl ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}
static int local_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    return a->r < b->r ? -1 : a->r > b->r;
}

static hearth_status derive_merges(tok_tokenizer *t, const double *score, hearth_error *err) {
    const tok_strmap *v = &t->model.vocab;
    size_t n = 0, cap = 1024;
    cand *c = malloc(cap * sizeof *c);
    if (!c) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int32_t id = 0; id < t->n_strs; id++) {
        const char *s = t->strs[id];
        if (!s || tok_strmap_get(v, s, t->str_lens[id]) != id) continue; /* one entry per distinct token */
        size_t len = t->str_lens[id], start = n;
        uint32_t lchars = 0, total = 0;
        for (size_t i = 0; i < len; i += (size_t)tok_utf8_len((const uint8_t *)s + i, len - i)) total++;
        for (size_t i = 0; i < len;) {
            int l = tok_utf8_len((const uint8_t *)s + i, len - i);
            if (i > 0) {
                int32_t a = tok_strmap_get(v, s, i), b = tok_strmap_get(v, s + i, len - i);
                if (a >= 0 && b >= 0) {
                    if (n == cap) {
                        cand *nc = realloc(c, (cap *= 2) * sizeof *c);
                        if (!nc) { free(c); return err_set(err, HEARTH_ERR_NOMEM, "out of memory"); }
                        c = nc;
                    }
                    c[n++] = (cand){a, b, score[id], lchars, total - lchars, 0};
                }
            }
            lchars++;
            i += (size_t)l;
        }
        qsort(c + start, n - start, sizeof *c, local_cmp);
    }
    for (size_t i = 0; i < n; i++) c[i].order = i;
    qsort(c, n, sizeof *c, cand_cmp);
    int32_t *pairs = malloc((n + 1) * 2 * sizeof *pairs);
    if (!pairs) { free(c); return err_set(err, HEARTH_ERR_NOMEM, "out of memory"); }
    for (size_t i = 0; i < n; i++) { pairs[2 * i] = c[i].l; pairs[2 * i + 1] = c[i].r; }
    free(c);
    hearth_status st = tok_bpe_build_merges(t, pairs, n, err);
    free(pairs);
    return st;
}

static hearth_status file_merges(tok_tokenizer *t, const gguf_kv *m, hearth_error *err) {
    int32_t *pairs = malloc((m->v.arr.n + 1) * 2 * sizeof *pairs);
    if (!pairs) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < m->v.arr.n; i++) {
        const char *s = m->v.arr.strs[i].ptr;
        size_t n = m->v.arr.strs[i].len;
        const char *sp = memchr(s, ' ', n);
        int32_t a = sp ? tok_strmap_get(&t->model.vocab, s, (size_t)(sp - s)) : -1;
        int32_t b = sp ? tok_strmap_get(&t->model.vocab, sp + 1, n - (size_t)(sp - s) - 1) : -1;
        if (a < 0 || b < 0) {
            free(pairs);
            return err_set(err, HEARTH_ERR_FORMAT, "tokenizer.ggml.merges[%llu] '%.*s' is not two vocabulary tokens",
                           (unsigned long long)i, (int)(n > 80 ? 80 : n), s);
        }
        pairs[2 * i] = a;
        pairs[2 * i + 1] = b;
    }
    hearth_status st = tok_bpe_build_merges(t, pairs, m->v.arr.n, err);
    free(pairs);
    return st;
}

static const gguf_kv *get_arr(const gguf_file *g, const char *key, gguf_type et) {
    const gguf_kv *kv = gguf_find(g, key);
    return kv && kv->type == GGUF_ARRAY && (et == GGUF_ARRAY || kv->v.arr.type == et) ? kv : NULL;
}

static int32_t get_id(const gguf_file *g, const char *key, int32_t n) {
    int64_t v;
    return gguf_get_i64(g, key, &v) && v >= 0 && v < n ? (int32_t)v : -1;
}

static hearth_status build(tok_tokenizer *t, const gguf_file *g, const char *model, const char *arch, hearth_error *err) {
    const gguf_kv *toks = get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING);
    if (!toks || toks->v.arr.n == 0 || toks->v.arr.n >= (1u << 24))
        return err_set(err, HEARTH_ERR_FORMAT, "tokenizer.ggml.tokens is missing or has a bad length");
    int32_t n = (int32_t)toks->v.arr.n;
    const gguf_kv *types = get_arr(g, "tokenizer.ggml.token_type", GGUF_ARRAY);
    int byte_level = !strcmp(model, "gpt2"), gemma4 = !strcmp(model, "gemma4");
    int gemma = !byte_level && !gemma4 && arch && (!strcmp(arch, "gemma") || !strcmp(arch, "gemma2") || !strcmp(arch, "gemma3"));
    tok_bytelevel_init();
    sbuf tmp;
    sbuf_init(&tmp);
    for (int32_t i = 0; i < n; i++) {
        const char *s = toks->v.arr.strs[i].ptr;
        size_t l = toks->v.arr.strs[i].len, chars;
        if (!tok_utf8_valid(s, l)) { sbuf_free(&tmp); return err_set(err, HEARTH_ERR_FORMAT, "token %d is not valid UTF-8", i); }
        sbuf_reset(&tmp);
        if (byte_level && !all_in_byte_alphabet(s, l)) {
            for (size_t k = 0; k < l; k++) { char b[4]; sbuf_append(&tmp, b, (size_t)tok_utf8_encode(tok_byte_to_cp[(uint8_t)s[k]], b)); }
        } else if (gemma && only_spaces_with_one(s, l, &chars)) {
            for (size_t k = 0; k < chars; k++) sbuf_puts(&tmp, "\xE2\x96\x81"); /* runs of spaces are spelled as U+2581 */
        } else sbuf_append(&tmp, s, l);
        if (tmp.oom || !tok_set_str(t, i, tmp.data ? tmp.data : "", tmp.len)) { sbuf_free(&tmp); return err_set(err, HEARTH_ERR_NOMEM, "out of memory"); }
    }
    sbuf_free(&tmp);
    if (!tok_strmap_init(&t->model.vocab, (size_t)n, t->strs, t->str_lens)) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n; i++) tok_strmap_put(&t->model.vocab, i);
    t->model.kind = TOK_MODEL_BPE;
    t->model.prefix = strdup("");
    t->model.suffix = strdup("");
    if (!t->model.prefix || !t->model.suffix) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");

    hearth_status st;
    const gguf_kv *merges = get_arr(g, "tokenizer.ggml.merges", GGUF_STRING);
    if (merges) st = file_merges(t, merges, err);
    else {
        const gguf_kv *scores = get_arr(g, "tokenizer.ggml.scores", GGUF_ARRAY);
        if (!gemma && (!scores || scores->v.arr.n != (uint64_t)n))
            return err_set(err, HEARTH_ERR_FORMAT, "no tokenizer.ggml.merges and no scores of %d entries to derive them from", n);
        double *score = malloc((size_t)n * sizeof *score);
        if (!score) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        /* Gemma's scores do not follow its merge order; token position does (see file header). */
        for (int32_t i = 0; i < n; i++) score[i] = gemma ? -(double)i : gguf_arr_f64(scores, (uint64_t)i);
        /* a repeated token counts once, at its last id, as in a Python dict */
        st = derive_merges(t, score, err);
        free(score);
    }
    if (st) return st;

    /* Control tokens become special added tokens, user-defined ones plain added tokens. */
    for (int32_t i = 0; types && i < n && (uint64_t)i < types->v.arr.n; i++) {
        int64_t ty = gguf_arr_i64(types, (uint64_t)i);
        if (ty == 3 && (!byte_level || all_in_byte_alphabet(t->strs[i], t->str_lens[i]))) {
            if (!tok_add_added(t, i, t->strs[i], t->str_lens[i], 1, 0)) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        } else if (ty == 4 && tok_strmap_get(&t->model.vocab, t->strs[i], t->str_lens[i]) >= 0) {
            if (!tok_add_added(t, i, t->strs[i], t->str_lens[i], 0, 0)) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        }
    }

    char *pre = gguf_get_str(g, "tokenizer.ggml.pre");
    if (byte_level) {
        t->kind_name = "bpe-byte-level";
        const char *split = split_for_pre(pre);
        if (digits_first(pre)) {
            json_t *pj = json_pack("{s:s,s:[{s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence", "pretokenizers", "type",
                                   "Digits", "individual_digits", 1, "type", "ByteLevel", "add_prefix_space", 0,
                                   "trim_offsets", 1, "use_regex", 1);
            st = pj ? tok_pre_parse(pj, &t->pre, err) : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            json_decref(pj);
            if (st) { free(pre); return st; }
        } else if (split) {
            t->pre = calloc(1, sizeof *t->pre);
            if (!t->pre) { free(pre); return err_set(err, HEARTH_ERR_NOMEM, "out of memory"); }
            t->pre->kind = TOK_PRE_SEQUENCE;
            t->pre->kids = calloc(2, sizeof *t->pre->kids);
            if (!t->pre->kids) { free(pre); return err_set(err, HEARTH_ERR_NOMEM, "out of memory"); }
            if (!(t->pre->kids[0] = tok_pre_new_split_regex(split, err))) { free(pre); return err->status; }
            t->pre->n_kids = 1;
            if (!(t->pre->kids[1] = tok_pre_new_bytelevel(0, 0, err))) { free(pre); return err->status; }
            t->pre->n_kids = 2;
        } else if (!(t->pre = tok_pre_new_bytelevel(0, 1, err))) { free(pre); return err->status; }
        json_t *d = json_pack("{s:s}", "type", "ByteLevel");
        st = d ? tok_dec_parse(d, &t->dec, err) : err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        json_decref(d);
    } else {
        t->kind_name = "bpe-sentencepiece";
        t->model.byte_fallback = 1;
        t->model.fuse_unk = 1;
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->model.byte_ids[b] = tok_strmap_get(&t->model.vocab, name, 6);
        }
        json_t *norm = NULL, *pj, *dj;
        if (gemma || gemma4) {
            int32_t unk = get_id(g, "tokenizer.ggml.unknown_token_id", n);
            t->model.unk_id = unk >= 0 ? tok_strmap_get(&t->model.vocab, t->strs[unk], t->str_lens[unk]) : tok_token_id(t, "<unk>");
            norm = json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "String", " ", "content", "\xE2\x96\x81");
            /* Gemma 4's tokenizer.json has no pre-tokenizer: BPE over the whole normalized text */
            pj = gemma4 ? NULL
                        : json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "String", " ", "behavior",
                                    "MergedWithPrevious", "invert", 0);
            dj = json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s}]}", "type", "Sequence", "decoders", "type", "Replace", "pattern",
                           "String", "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse");
        } else if (arch && !strcmp(arch, "phi3")) {
            norm = json_pack("{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]}", "type", "Sequence", "normalizers", "type", "Prepend", "prepend",
                             "\xE2\x96\x81", "type", "Replace", "pattern", "String", " ", "content", "\xE2\x96\x81");
            pj = NULL;
            dj = json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]}", "type", "Sequence", "decoders", "type", "Replace",
                           "pattern", "String", "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
                           "content", " ", "start", 1, "stop", 0);
        } else {
            pj = json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement", "\xE2\x96\x81", "prepend_scheme", "first", "split", 0);
            dj = json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]}", "type", "Sequence", "decoders", "type", "Replace",
                           "pattern", "String", "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
                           "content", " ", "start", 1, "stop", 0);
        }
        st = HEARTH_OK;
        if (norm) st = tok_norm_parse(norm, &t->norm, err);
        if (!st && pj) st = tok_pre_parse(pj, &t->pre, err);
        if (!st && dj) st = tok_dec_parse(dj, &t->dec, err);
        json_decref(norm);
        json_decref(pj);
        json_decref(dj);
    }
    free(pre);
    return st;
}

hearth_status tok_load_gguf(const gguf_file *g, tok_tokenizer **out, hearth_error *err) {
    *out = NULL;
    char *model = gguf_get_str(g, "tokenizer.ggml.model");
    char *arch = gguf_get_str(g, "general.architecture");
    hearth_status st = HEARTH_OK;
    tok_tokenizer *t = NULL;
    if (!model) { st = err_set(err, HEARTH_ERR_NOT_FOUND, "no tokenizer.ggml.model in the GGUF metadata"); goto done; }
    if (strcmp(model, "gpt2") && strcmp(model, "llama") && strcmp(model, "gemma4")) {
        st = err_set(err, HEARTH_ERR_UNSUPPORTED, "GGUF tokenizer model '%.60s' is not supported (gpt2, llama and gemma4 are)",
                     model);
        goto done;
    }
    if (!(t = tok_alloc())) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = build(t, g, model, arch, err))) goto done;
    int32_t n = t->n_strs;
    t->bos_id = get_id(g, "tokenizer.ggml.bos_token_id", n);
    t->eos_id = get_id(g, "tokenizer.ggml.eos_token_id", n);
    /* llama.cpp (and transformers after it) add BOS to a SentencePiece vocabulary unless told not to. */
    int add_bos = !strcmp(model, "llama"), add_eos = 0;
    gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos);
    if (!strcmp(model, "gemma4")) add_bos = 1; /* llama.cpp overrides a false add_bos_token for Gemma 4 */
    t->post.present = 1;
    int32_t none = 0;
    tok_tmpl_piece pieces[3];
    size_t np = 0;
    if (add_bos && t->bos_id >= 0) pieces[np++] = (tok_tmpl_piece){0, &t->bos_id, 1};
    pieces[np++] = (tok_tmpl_piece){1, &none, 0};
    if (add_eos && t->eos_id >= 0) pieces[np++] = (tok_tmpl_piece){0, &t->eos_id, 1};
    t->post.single = calloc(np, sizeof *t->post.single);
    if (!t->post.single) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
    for (size_t i = 0; i < np; i++) {
        t->post.single[i] = pieces[i];
        t->post.single[i].ids = malloc(sizeof(int32_t));
        if (!t->post.single[i].ids) { st = err_set(err, HEARTH_ERR_NOMEM, "out of memory"); goto done; }
        t->post.single[i].ids[0] = pieces[i].ids[0];
        t->post.n_single++;
    }
    st = tok_finish_load(t, err);
done:
    free(model);
    free(arch);
    if (st) {
        tok_free(t);
        err_prefix(err, "%s", g->path ? g->path : "gguf");
        return st;
    }
    *out = t;
    return HEARTH_OK;
}
