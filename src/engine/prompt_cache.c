/* prompt_cache.c: the batch's prefix cache kept on disk (hearth_batch_prompt_cache,
 * `serve --prompt-cache-dir`): at start every saved KV file in the folder is loaded into
 * the pool as cached, unreferenced blocks (the prefix cache then hands them out as if the
 * requests had run in this process). While serving, only the token histories of finished
 * requests are noted (no disk work on the stepping thread); when the batch ends, each
 * history's KV still in the pool is saved (one file per history; a file whose history a
 * newer one continues is removed) and the oldest files go past the byte bound. The file
 * format and its checks are seq_file.c's. */
#define _GNU_SOURCE
#include "base/err.h"
#include "base/hash.h"
#include "engine/engine_internal.h"
#include "kv/kv_file.h"
#include "kv/kv_prefix.h"
#include "kv/kv_state.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct pc_entry {
    char *path;
    int32_t *tokens;
    int n;
    long long bytes;
    double mtime;
} pc_entry;

/* Histories noted but not saved yet: at most this many (the oldest are forgotten), a
 * bound on the memory the notes take (4 bytes a token). */
#define PC_MAX_NOTES 1024

struct prompt_cache {
    char *dir;
    long long max_bytes;
    pc_entry *v; /* the folder's files, oldest first */
    size_t n, cap;
    pc_entry *notes; /* finished requests' histories (path NULL), oldest first */
    size_t n_notes;
};

static void entry_free(pc_entry *x) {
    free(x->path);
    free(x->tokens);
}

void prompt_cache_free(prompt_cache *pc) {
    if (!pc) return;
    for (size_t i = 0; i < pc->n; i++) entry_free(&pc->v[i]);
    for (size_t i = 0; i < pc->n_notes; i++) entry_free(&pc->notes[i]);
    free(pc->notes);
    free(pc->v);
    free(pc->dir);
    free(pc);
}

static int add_entry(prompt_cache *pc, char *path, const int32_t *tokens, int n, long long bytes, double mtime) {
    if (pc->n == pc->cap) {
        size_t cap = pc->cap ? 2 * pc->cap : 16;
        pc_entry *v = realloc(pc->v, cap * sizeof *v);
        if (!v) return -1;
        pc->v = v;
        pc->cap = cap;
    }
    int32_t *t = malloc((size_t)n * sizeof *t);
    if (!t) return -1;
    memcpy(t, tokens, (size_t)n * sizeof *t);
    pc->v[pc->n++] = (pc_entry){.path = path, .tokens = t, .n = n, .bytes = bytes, .mtime = mtime};
    return 0;
}

static void drop_entry(prompt_cache *pc, size_t i) {
    unlink(pc->v[i].path);
    entry_free(&pc->v[i]);
    memmove(pc->v + i, pc->v + i + 1, (pc->n - i - 1) * sizeof *pc->v);
    pc->n--;
}

/* The token count a file's header claims (unchecked: only to see whether it can fit). */
static long long header_tokens(const char *path) {
    unsigned char h[KV_FILE_HEADER_BYTES];
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t got = fread(h, 1, sizeof h, f);
    fclose(f);
    if (got != sizeof h) return -1;
    return (long long)h[40] | (long long)h[41] << 8 | (long long)h[42] << 16 | (long long)h[43] << 24;
}

typedef struct pc_file {
    char *path;
    long long bytes;
    double mtime;
} pc_file;

static int newest_first(const void *a, const void *b) {
    double x = ((const pc_file *)a)->mtime, y = ((const pc_file *)b)->mtime;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Loads one file into a fresh slot and leaves its blocks in the cache. */
static hearth_status warm_one(hearth_engine *e, prompt_cache *pc, const pc_file *f, size_t *tokens, hearth_error *err) {
    int seq;
    hearth_status st = hearth_seq_open(e, &seq, err);
    size_t n = 0;
    if (!st) st = hearth_seq_load(e, seq, f->path, NULL, 0, &n, err);
    if (!st) {
        kv_cache *kv = engine_kv(e);
        kv_prefix_commit_tail(kv, seq, engine_history(e, seq), (int)n);
        /* a hybrid's file ends at a block boundary with the state there: kept as that
         * prefix's snapshot, so the prefix cache can start a request after it */
        if (kv->state && n % KV_BLOCK_SIZE == 0)
            engine_state_snap_save(e, seq, (int)n, kv_state_chain_hash(0, engine_history(e, seq), (int)n), 0);
        char *path = strdup(f->path);
        if (!path || add_entry(pc, path, engine_history(e, seq), (int)n, f->bytes, f->mtime)) {
            free(path);
            st = err_set(err, HEARTH_ERR_NOMEM, "prompt cache: out of memory");
        }
        *tokens += n;
    }
    hearth_seq_close(e, seq);
    return st;
}

static hearth_status warm(hearth_engine *e, prompt_cache *pc, hearth_prompt_cache_report *rep, hearth_error *err) {
    DIR *d = opendir(pc->dir);
    if (!d) return err_set(err, HEARTH_ERR_IO, "%s: cannot open the prompt cache folder: %m", pc->dir);
    pc_file *files = NULL;
    size_t n = 0, cap = 0;
    hearth_status st = HEARTH_OK;
    for (struct dirent *de; !st && (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".hkv")) continue;
        char *path = NULL;
        struct stat sb;
        if (asprintf(&path, "%s/%s", pc->dir, de->d_name) < 0) {
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            break;
        }
        if (stat(path, &sb) || !S_ISREG(sb.st_mode)) {
            free(path);
            continue;
        }
        if (n == cap) {
            pc_file *v = realloc(files, (cap = cap ? 2 * cap : 16) * sizeof *v);
            if (!v) {
                free(path);
                st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                break;
            }
            files = v;
        }
        files[n++] = (pc_file){path, (long long)sb.st_size, sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec * 1e-9};
    }
    closedir(d);
    qsort(files, n, sizeof *files, newest_first);
    kv_cache *kv = engine_kv(e);
    for (size_t i = 0; !st && i < n; i++) {
        long long t = header_tokens(files[i].path);
        /* only into free blocks: a file loaded later must not evict one loaded earlier (newer) */
        if (t > 0 && (t + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE > kv->n_free) {
            rep->files_skipped++;
            continue;
        }
        hearth_error why = {0};
        hearth_status s = warm_one(e, pc, &files[i], &rep->tokens_loaded, &why);
        if (s) {
            if (!rep->files_refused++) { /* the message, cut to the report's room */
                size_t k = strnlen(why.message, sizeof rep->first_refusal - 1);
                memcpy(rep->first_refusal, why.message, k);
                rep->first_refusal[k] = 0;
            }
        } else
            rep->files_loaded++;
    }
    for (size_t i = 0; i < n; i++) free(files[i].path);
    free(files);
    /* the entries oldest first, as later saves append */
    for (size_t i = 0; i < pc->n / 2; i++) {
        pc_entry x = pc->v[i];
        pc->v[i] = pc->v[pc->n - 1 - i];
        pc->v[pc->n - 1 - i] = x;
    }
    return st;
}

hearth_status prompt_cache_open(hearth_engine *e, const char *dir, long long max_bytes, prompt_cache **out,
                                hearth_prompt_cache_report *rep, hearth_error *err) {
    *out = NULL;
    memset(rep, 0, sizeof *rep);
    if (max_bytes <= 0) return err_set(err, HEARTH_ERR_INVALID, "--prompt-cache-bytes must be positive");
    if (mkdir(dir, 0755) && access(dir, W_OK))
        return err_set(err, HEARTH_ERR_IO, "%s: cannot create or write the prompt cache folder: %m", dir);
    prompt_cache *pc = calloc(1, sizeof *pc);
    if (!pc || !(pc->dir = strdup(dir))) {
        free(pc);
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    }
    pc->max_bytes = max_bytes;
    hearth_status st = warm(e, pc, rep, err);
    if (st) {
        prompt_cache_free(pc);
        return st;
    }
    *out = pc;
    return HEARTH_OK;
}

static uint64_t tokens_hash(const int32_t *t, int n) { return fnv1a64_words(FNV1A64_INIT, t, (size_t)n); }

/* Whether history a (m tokens) is continued by b (n > m tokens): b repeats a but for at
 * most a last block. The next turn of a conversation re-renders the last answer, whose
 * final tokens (the end of the turn, a piece tokenized differently) may differ from what
 * was generated, hence the slack. */
static int continues(const int32_t *a, int m, const int32_t *b, int n) {
    if (m >= n) return 0;
    int k = 0;
    while (k < m && a[k] == b[k]) k++;
    return k >= m - KV_BLOCK_SIZE;
}

static int holds(const pc_entry *x, const int32_t *t, int n) {
    return x->n >= n && !memcmp(x->tokens, t, (size_t)n * sizeof *t);
}

void prompt_cache_note(prompt_cache *pc, hearth_engine *e, int seq, int n) {
    if (n <= 0) return;
    const int32_t *t = engine_history(e, seq);
    for (size_t i = 0; i < pc->n_notes; i++)
        if (holds(&pc->notes[i], t, n)) return;
    for (size_t i = pc->n_notes; i-- > 0;)
        if (continues(pc->notes[i].tokens, pc->notes[i].n, t, n) || (i == 0 && pc->n_notes == PC_MAX_NOTES)) {
            entry_free(&pc->notes[i]);
            memmove(pc->notes + i, pc->notes + i + 1, (pc->n_notes - i - 1) * sizeof *pc->notes);
            pc->n_notes--;
        }
    if (!pc->notes && !(pc->notes = calloc(PC_MAX_NOTES, sizeof *pc->notes))) return;
    int32_t *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return;
    memcpy(copy, t, (size_t)n * sizeof *copy);
    pc->notes[pc->n_notes++] = (pc_entry){.tokens = copy, .n = n};
}

/* Saves what the pool still holds of one noted history (its cached blocks, attached to a
 * scratch slot as the scheduler would for a new request); 0 when nothing was saved. */
static int flush_one(prompt_cache *pc, hearth_engine *e, const pc_entry *note, hearth_error *err) {
    int seq;
    if (hearth_seq_open(e, &seq, err)) return 0;
    kv_cache *kv = engine_kv(e);
    int n = kv_prefix_attach(kv, seq, note->tokens, note->n);
    kv_block_copy cp;
    int part = kv_prefix_attach_partial(kv, seq, note->tokens, note->n, &cp);
    if (part) {
        if (engine_kv_copy_rows(e, cp.src, cp.dst, cp.rows, err)) part = 0;
        kv_block_drop(kv, cp.src);
    }
    n += part;
    if (kv->state) { /* a hybrid: the recurrent state too, known only where a snapshot kept it */
        int len = n / KV_BLOCK_SIZE * KV_BLOCK_SIZE, snap = -1;
        for (; len > 0 && snap < 0; len -= KV_BLOCK_SIZE)
            snap = kv_state_snap_find(kv, len, kv_state_chain_hash(0, note->tokens, len));
        if (snap >= 0 && engine_state_snap_load(e, snap, seq, err)) snap = -1;
        n = snap >= 0 ? len + KV_BLOCK_SIZE : 0;
    }
    char *path = NULL;
    struct stat sb;
    int saved = 0;
    if (n > 0 && asprintf(&path, "%s/%016llx.hkv", pc->dir, (unsigned long long)tokens_hash(note->tokens, n)) >= 0) {
        engine_history_write(e, seq, note->tokens, n);
        if (!engine_seq_save_n(e, seq, n, path, err) && !stat(path, &sb) &&
            !add_entry(pc, path, note->tokens, n, (long long)sb.st_size,
                       sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec * 1e-9)) {
            path = NULL; /* the entry owns it */
            saved = 1;
        }
    }
    free(path);
    hearth_seq_close(e, seq);
    return saved;
}

void prompt_cache_flush(prompt_cache *pc, hearth_engine *e) {
    for (size_t k = 0; k < pc->n_notes; k++) {
        const pc_entry *note = &pc->notes[k];
        int held = 0;
        for (size_t i = 0; i < pc->n && !held; i++) held = holds(&pc->v[i], note->tokens, note->n);
        if (held) continue;
        hearth_error err = {0};
        if (!flush_one(pc, e, note, &err)) {
            if (err.message[0]) fprintf(stderr, "hearth: prompt cache: %s\n", err.message);
            continue;
        }
        /* the new file (last) makes the files of the histories it continues redundant */
        const pc_entry *x = &pc->v[pc->n - 1];
        for (size_t i = pc->n - 1; i-- > 0;)
            if (continues(pc->v[i].tokens, pc->v[i].n, x->tokens, x->n)) {
                drop_entry(pc, i);
                x = &pc->v[pc->n - 1];
            }
    }
    long long total = 0;
    for (size_t i = 0; i < pc->n; i++) total += pc->v[i].bytes;
    while (pc->n > 0 && total > pc->max_bytes) {
        total -= pc->v[0].bytes;
        drop_entry(pc, 0);
    }
}
