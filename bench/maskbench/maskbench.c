/* maskbench.c: the grammar engine on MaskBench cases. Reads JSON lines
 * {"name", "schema" (text), "tests": [{"valid", "text"}]} prepared by maskbench.py,
 * tokenizes each instance with a GGUF model's tokenizer, feeds it token by token
 * (every token must be in the mask; the end must be accepted) and writes one JSON line
 * per schema: compile time, error, per-instance verdicts, per-token mask times (us of
 * thread CPU time). With MASKBENCH_MASK_HASH=1 in the environment each verdict also
 * carries a hash of every mask it saw ("mask_hash"), so that two builds of the engine can
 * be shown to compute the same masks.
 * Usage: maskbench MODEL.gguf CASES.jsonl [VOCAB.txt] > RESULTS.jsonl (VOCAB.txt: the
 * token byte strings, written for the llguidance run). */
#include "base/hash.h"
#include "grammar/grammar.h"
#include "io/gguf.h"
#include "tok/tokenizer.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* this thread's CPU time: a mask's cost without the time other processes on a shared
 * machine take the core away (maskbench.py times llguidance the same way) */
static double cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The vocabulary as hex bytes, one token a line with its special flag: the same byte
 * strings for the llguidance run. */
static void dump_vocab(const tok_tokenizer *t, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    char buf[4096];
    for (int32_t i = 0; i < tok_vocab_size(t); i++) {
        int l = tok_token_bytes(t, i, buf, sizeof buf);
        fprintf(f, "%d ", tok_is_special(t, i));
        for (int k = 0; k < l && k < (int)sizeof buf; k++) fprintf(f, "%02x", (unsigned char)buf[k]);
        fputc('\n', f);
    }
    fclose(f);
}

static gvocab *vocab_of(const tok_tokenizer *t) {
    int32_t n = tok_vocab_size(t);
    char **bytes = calloc((size_t)n, sizeof *bytes);
    uint32_t *len = calloc((size_t)n, sizeof *len);
    uint8_t *special = calloc((size_t)n, 1);
    char buf[4096];
    for (int32_t i = 0; i < n; i++) {
        int l = tok_token_bytes(t, i, buf, sizeof buf);
        if (l < 0 || l > (int)sizeof buf) l = 0;
        bytes[i] = malloc((size_t)l + 1);
        memcpy(bytes[i], buf, (size_t)l);
        len[i] = (uint32_t)l;
        special[i] = (uint8_t)tok_is_special(t, i);
    }
    int32_t eos = tok_eos_id(t);
    gvocab *v = gvocab_new(n, (const char *const *)bytes, len, special, &eos, 1);
    for (int32_t i = 0; i < n; i++) free(bytes[i]);
    free(bytes), free(len), free(special);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf CASES.jsonl\n", argv[0]);
        return 2;
    }
    gguf_file g;
    hearth_error err = {0};
    tok_tokenizer *t = NULL;
    if (gguf_open(argv[1], &g, &err) || tok_load_gguf(&g, &t, &err)) {
        fprintf(stderr, "maskbench: %s\n", err.message);
        return 1;
    }
    if (argc > 3) dump_vocab(t, argv[3]);
    double t0 = now_us();
    gvocab *v = vocab_of(t);
    fprintf(stderr, "maskbench: vocabulary of %d tokens indexed in %.1f ms\n", tok_vocab_size(t),
            (now_us() - t0) / 1e3);
    FILE *f = fopen(argv[2], "r");
    if (!f || !v) return 1;
    size_t words = ((size_t)tok_vocab_size(t) + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask);
    char *line = NULL;
    size_t cap = 0;
    int32_t eos = tok_eos_id(t);
    const char *hash_env = getenv("MASKBENCH_MASK_HASH");
    int hash_masks = hash_env && *hash_env && strcmp(hash_env, "0");
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *c = json_loads(line, 0, &je);
        if (!c) continue;
        const char *schema = json_string_value(json_object_get(c, "schema"));
        json_t *out = json_object();
        json_object_set(out, "name", json_object_get(c, "name"));
        grammar *gr = NULL;
        hearth_error e = {0};
        double c0 = now_us();
        hearth_status st = grammar_compile(GRAMMAR_JSON_SCHEMA, schema, strlen(schema), NULL, &gr, &e);
        json_object_set_new(out, "compile_us", json_real(now_us() - c0));
        json_object_set_new(out, "error", st ? json_string(e.message) : json_null());
        json_t *verdicts = json_array(), *times = json_array();
        size_t i;
        json_t *test;
        json_array_foreach(json_object_get(c, "tests"), i, test) {
            if (st) break;
            const char *text = json_string_value(json_object_get(test, "text"));
            int valid = json_is_true(json_object_get(test, "valid"));
            int32_t *ids = NULL;
            size_t n_ids = 0;
            if (tok_encode(t, text, strlen(text), 0, &ids, &n_ids, &e)) {
                free(ids);
                continue;
            }
            gmatcher *m = gmatcher_new(gr, v);
            long reject_at = -1;
            uint64_t mask_hash = FNV1A64_INIT;
            for (size_t k = 0; m && k <= n_ids; k++) {
                int32_t id = k < n_ids ? ids[k] : eos;
                double m0 = cpu_us();
                gmatcher_mask(m, mask);
                double dt = cpu_us() - m0;
                if (valid) json_array_append_new(times, json_real(dt));
                if (hash_masks) mask_hash = fnv1a64_words(mask_hash, (const int32_t *)mask, words);
                if (!(mask[id >> 5] >> (id & 31) & 1) || !gmatcher_accept(m, id)) {
                    reject_at = (long)k;
                    break;
                }
            }
            json_t *vd = json_object();
            json_object_set_new(vd, "valid", json_boolean(valid));
            json_object_set_new(vd, "accepted", json_boolean(m && reject_at < 0));
            json_object_set_new(vd, "tokens", json_integer((json_int_t)n_ids));
            json_object_set_new(vd, "reject_at", json_integer(reject_at));
            if (hash_masks) {
                char hx[17];
                snprintf(hx, sizeof hx, "%016llx", (unsigned long long)mask_hash);
                json_object_set_new(vd, "mask_hash", json_string(hx));
            }
            json_t *ja = json_array();
            for (size_t k = 0; k < n_ids; k++) json_array_append_new(ja, json_integer(ids[k]));
            json_object_set_new(vd, "ids", ja);
            json_array_append_new(verdicts, vd);
            gmatcher_free(m);
            free(ids);
        }
        json_object_set_new(out, "tests", verdicts);
        json_object_set_new(out, "mask_us", times);
        char *s = json_dumps(out, JSON_COMPACT);
        printf("%s\n", s);
        fflush(stdout);
        free(s);
        json_decref(out);
        json_decref(c);
        grammar_free(gr);
    }
    free(line);
    free(mask);
    fclose(f);
    gvocab_free(v);
    tok_free(t);
    gguf_close(&g);
    return 0;
}
