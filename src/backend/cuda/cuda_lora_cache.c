/* cuda_lora_cache.c: device copies of LoRA / DoRA adapters and a step's row tables
 * (cuda_lora_cache.h). An adapter's floats go up as one block (op_adapter.data) and its
 * op_lora table is rewritten with device pointers at the same offsets (plain cudaMemcpy, at
 * an adapter's first use). A step's row tables go up stream-ordered from pinned memory, as
 * cuda_model.c's step inputs do: no host wait, and a replayed graph reads them; the host
 * copies are rewritten only at the next step, after this one's final synchronization. */
#ifdef HEARTH_HAVE_CUDA
#include "backend/cuda/cuda_lora_cache.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_lora.h"
#include "base/err.h"
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(CUDA_LORA_MAX_RANK == OP_LORA_MAX_RANK, "the kernel's shared memory holds the ops' widest rank");

typedef struct lora_copy {
    uint64_t key;
    const float *host; /* op_adapter.data it was made from (a second check beside the key) */
    float *data;       /* device: the adapter's floats */
    cuda_lora *table;  /* device: [n_layers * OP_N_PROJ] */
    size_t bytes;
    uint64_t used; /* the step that last used it */
} lora_copy;

struct cuda_lora_cache {
    int n_layers, max_tokens;
    lora_copy *copies;
    int n, cap;
    uint64_t step;
    const cuda_lora **host_sets; /* pinned, [max_tokens * CUDA_LORA_MAX_SET]: device tables of each row's adapters */
    int32_t *host_n;             /* pinned, [max_tokens] */
    const cuda_lora **sets;      /* device copies of the two */
    int32_t *n_set;
    float *u; /* device: the fast tier's rank values, CUDA_LORA_FAST_FLOATS(max_tokens) */
    /* a step whose rows have at most one adapter each (and no more than CUDA_LORA_FAST_ROWS
     * rows) runs the grouped kernels: the adapters' tables, then {U, offsets, rows}
     * (cuda_lora_apply_grouped), pinned on the host and on the device in one buffer each */
    int grouped, T;
    void *host_groups, *groups;
    /* device: the row tables of one expert's gathered rows (cuda_lora_cache_apply_rows) */
    const cuda_lora **g_sets;
    int32_t *g_n;
};

hearth_status cuda_lora_cache_create(int n_layers, int max_tokens, cuda_lora_cache **out, hearth_error *err) {
    *out = NULL;
    cuda_lora_cache *c = calloc(1, sizeof *c);
    cuda_lora_cache_sizes z; /* the sizes cuda_plan counts */
    cuda_lora_cache_sizes_make(max_tokens, &z);
    if (!c) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory for the adapter tables");
    if (cudaMallocHost((void **)&c->host_sets, z.sets) != cudaSuccess ||
        cudaMallocHost((void **)&c->host_n, z.counts) != cudaSuccess ||
        cudaMallocHost(&c->host_groups, z.groups) != cudaSuccess) {
        cudaGetLastError();
        cuda_lora_cache_free(c);
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: cannot allocate pinned host tables for %d adapter rows",
                       max_tokens);
    }
    c->n_layers = n_layers;
    c->max_tokens = max_tokens;
    hearth_status st = cuda_alloc((void **)&c->sets, z.sets, "adapter row tables", err);
    if (!st) st = cuda_alloc((void **)&c->n_set, z.counts, "adapter row counts", err);
    if (!st) st = cuda_alloc((void **)&c->u, z.fast - z.sets - z.counts - z.groups, "adapter rank values", err);
    if (!st) st = cuda_alloc((void **)&c->g_sets, z.sets, "adapter rows of an expert", err);
    if (!st) st = cuda_alloc((void **)&c->g_n, z.counts, "adapter row counts of an expert", err);
    if (!st) st = cuda_alloc(&c->groups, z.groups, "adapter groups", err);
    if (st) {
        cuda_lora_cache_free(c);
        return st;
    }
    *out = c;
    return HEARTH_OK;
}

static void copy_free(lora_copy *l) {
    cuda_free(l->data);
    cuda_free(l->table);
}

void cuda_lora_cache_free(cuda_lora_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) copy_free(&c->copies[i]);
    free(c->copies);
    if (c->host_sets) cudaFreeHost(c->host_sets);
    if (c->host_n) cudaFreeHost(c->host_n);
    if (c->host_groups) cudaFreeHost(c->host_groups);
    cuda_free(c->groups);
    cuda_free(c->sets);
    cuda_free(c->n_set);
    cuda_free(c->u);
    cuda_free(c->g_sets);
    cuda_free(c->g_n);
    free(c);
}

/* The device address of host pointer p of an adapter whose floats start at base (n of
 * them) and were copied to dev; NULL stays NULL, a pointer outside the block is an error. */
static int translate(const float *p, const float *base, size_t n, float *dev, const float **out) {
    if (!p) return *out = NULL, 0;
    if (p < base || p >= base + n) return -1;
    *out = dev + (p - base);
    return 0;
}

/* Uploads adapter a into a new copy (its floats, then its table with device pointers). */
static hearth_status copy_make(cuda_lora_cache *c, const op_adapter *a, lora_copy *l, hearth_error *err) {
    size_t entries = (size_t)c->n_layers * OP_N_PROJ;
    *l = (lora_copy){.key = a->key, .host = a->data, .bytes = a->floats * sizeof(float)};
    cuda_lora *table = calloc(entries, sizeof *table);
    if (!table) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory for an adapter table");
    hearth_status st = cuda_alloc((void **)&l->data, l->bytes, "LoRA adapter", err);
    if (!st) st = cuda_upload(l->data, a->data, l->bytes, err);
    for (size_t i = 0; !st && i < entries; i++) {
        const op_lora *h = &a->proj[i];
        if (!h->a) continue;
        cuda_lora *d = &table[i];
        if (h->rank <= 0 || h->rank > CUDA_LORA_MAX_RANK || translate(h->a, a->data, a->floats, l->data, &d->a) ||
            translate(h->b, a->data, a->floats, l->data, &d->b) ||
            translate(h->dora, a->data, a->floats, l->data, &d->dora) || !d->b)
            st = err_set(err, HEARTH_ERR_INVALID,
                         "cuda: adapter entry %zu (layer %zu) has rank %d or a pointer outside its data block", i,
                         i / OP_N_PROJ, h->rank);
        d->rank = h->rank;
        d->scale = h->scale;
    }
    if (!st) st = cuda_alloc((void **)&l->table, entries * sizeof *table, "LoRA adapter table", err);
    if (!st) st = cuda_upload(l->table, table, entries * sizeof *table, err);
    free(table);
    l->bytes += entries * sizeof *table;
    if (st) copy_free(l);
    return st;
}

/* The device table of adapter a, copied now if the device lacks it. */
static hearth_status copy_of(cuda_lora_cache *c, const op_adapter *a, const cuda_lora **out, hearth_error *err) {
    for (int i = 0; i < c->n; i++)
        if (c->copies[i].key == a->key && c->copies[i].host == a->data) {
            c->copies[i].used = c->step;
            *out = c->copies[i].table;
            return HEARTH_OK;
        }
    if (!a->key || !a->data || !a->floats || !a->proj)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: an adapter without a key or data block has no device copy");
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        lora_copy *grown = realloc(c->copies, (size_t)cap * sizeof *grown);
        if (!grown) return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory");
        c->copies = grown, c->cap = cap;
    }
    lora_copy *l = &c->copies[c->n];
    hearth_status st = copy_make(c, a, l, err);
    if (st) return st;
    l->used = c->step;
    c->n++;
    *out = l->table;
    return HEARTH_OK;
}

/* Past CUDA_LORA_KEEP copies, drops the least recently used ones this step does not use. */
static void evict(cuda_lora_cache *c) {
    while (c->n > CUDA_LORA_KEEP) {
        int oldest = -1;
        for (int i = 0; i < c->n; i++)
            if (c->copies[i].used < c->step && (oldest < 0 || c->copies[i].used < c->copies[oldest].used)) oldest = i;
        if (oldest < 0) return; /* every copy serves this step */
        copy_free(&c->copies[oldest]);
        c->copies[oldest] = c->copies[--c->n];
    }
}

/* Groups the step's rows by adapter into the pinned group tables when every row has at most
 * one adapter and T <= CUDA_LORA_FAST_ROWS (1: the grouped kernels apply), rows in order
 * within a group; 0 leaves the step to the row-major kernels. */
static int make_groups(cuda_lora_cache *c, int T) {
    if (T > CUDA_LORA_FAST_ROWS) return 0;
    for (int t = 0; t < T; t++)
        if (c->host_n[t] > 1) return 0;
    const cuda_lora **tab = c->host_groups;
    int32_t *gi = (int32_t *)(tab + T), *off = gi + 1, *rows = gi + 2 + T;
    int U = 0;
    for (int t = 0; t < T; t++) { /* the distinct tables, in order of first use; their row counts in off[u + 1] */
        if (!c->host_n[t]) continue;
        const cuda_lora *a = c->host_sets[(size_t)t * CUDA_LORA_MAX_SET];
        int u = 0;
        while (u < U && tab[u] != a) u++;
        if (u == U) tab[U] = a, off[++U] = 0;
        off[u + 1]++;
    }
    off[0] = 0;
    for (int u = 0; u < U; u++) off[u + 1] += off[u];
    int fill[CUDA_LORA_FAST_ROWS];
    for (int u = 0; u < U; u++) fill[u] = off[u];
    for (int t = 0; t < T; t++) {
        if (!c->host_n[t]) continue;
        const cuda_lora *a = c->host_sets[(size_t)t * CUDA_LORA_MAX_SET];
        int u = 0;
        while (tab[u] != a) u++;
        rows[fill[u]++] = t;
    }
    gi[0] = U;
    return 1;
}

hearth_status cuda_lora_cache_step(cuda_lora_cache *c, const op_batch *b, hearth_error *err) {
    if (b->T > c->max_tokens)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: a step of %d rows (adapter tables hold %d)", b->T,
                       c->max_tokens);
    c->step++;
    c->grouped = 0; /* until this step's tables are up */
    for (int t = 0; t < b->T; t++) {
        const op_adapter_set *s = b->row_adapters ? b->row_adapters[t] : NULL;
        int n = s ? s->n : 0;
        if (n > CUDA_LORA_MAX_SET)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: a row combines %d adapters (at most %d)", n,
                           CUDA_LORA_MAX_SET);
        c->host_n[t] = n;
        for (int i = 0; i < n; i++) {
            hearth_status st = copy_of(c, s->a[i], &c->host_sets[(size_t)t * CUDA_LORA_MAX_SET + i], err);
            if (st) return st;
        }
    }
    evict(c);
    c->T = b->T;
    hearth_status st = cuda_upload_async(c->sets, c->host_sets, (size_t)b->T * CUDA_LORA_MAX_SET * sizeof(void *), err);
    if (!st) st = cuda_upload_async(c->n_set, c->host_n, (size_t)b->T * sizeof(int32_t), err);
    if (!st && (c->grouped = make_groups(c, b->T)))
        st = cuda_upload_async(c->groups, c->host_groups, CUDA_LORA_GROUP_BYTES(b->T), err);
    return st;
}

hearth_status cuda_lora_cache_apply(const cuda_lora_cache *c, int T, int layer, op_proj p, int np, const float *x,
                                    int64_t k, float *const *ys, const int64_t *ns, int exact, hearth_error *err) {
    if (layer < 0 || layer >= c->n_layers)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: adapter update of layer %d (the model has %d)", layer,
                       c->n_layers);
    if (np < 1 || np > CUDA_LORA_MAX_GROUP || (int)p < 0 || (int)p + np > OP_N_PROJ)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: adapter update of projections %d to %d", (int)p,
                       (int)p + np - 1);
    int idx[CUDA_LORA_MAX_GROUP];
    for (int g = 0; g < np; g++) idx[g] = layer * OP_N_PROJ + (int)p + g;
    if (!exact && c->grouped && T == c->T) {
        const cuda_lora *const *tab = c->groups;
        return cuda_lora_apply_grouped(tab, (const int32_t *)(tab + T), np, idx, ys, ns, x, k, T, c->u, err);
    }
    if (!exact) return cuda_lora_apply_fast(c->sets, c->n_set, np, idx, 0, ys, ns, x, k, T, c->u, err);
    for (int g = 0; g < np; g++) {
        hearth_status st = cuda_lora_apply(c->sets, c->n_set, idx[g], 0, x, k, ys[g], ns[g], T, err);
        if (st) return st;
    }
    return HEARTH_OK;
}

hearth_status cuda_lora_cache_apply_rows(const cuda_lora_cache *c, const int32_t *rows, int n, int layer, op_proj p,
                                         int expert, const float *x, int64_t k, float *y, int64_t n_out, int exact,
                                         hearth_error *err) {
    if (layer < 0 || layer >= c->n_layers || (int)p < 0 || (int)p >= OP_N_PROJ || n > c->max_tokens || expert < 0)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: adapter update of layer %d, projection %d, %d rows, expert %d",
                       layer, (int)p, n, expert);
    if (n <= 0) return HEARTH_OK;
    hearth_status st = cuda_lora_gather_sets(c->sets, c->n_set, rows, n, c->g_sets, c->g_n, err);
    int idx = layer * OP_N_PROJ + (int)p;
    if (!st && !exact)
        st = cuda_lora_apply_fast(c->g_sets, c->g_n, 1, &idx, expert, &y, &n_out, x, k, n, c->u, err);
    else if (!st)
        st = cuda_lora_apply(c->g_sets, c->g_n, idx, expert, x, k, y, n_out, n, err);
    return st;
}

void cuda_lora_cache_forget(cuda_lora_cache *c, uint64_t key) {
    for (int i = 0; c && i < c->n; i++)
        if (c->copies[i].key == key) {
            cuda_stream_sync(NULL); /* a step still in flight may read it (its error surfaces at the next step) */
            copy_free(&c->copies[i]);
            c->copies[i] = c->copies[--c->n];
            return;
        }
}

int cuda_lora_cache_grouped(const cuda_lora_cache *c) { return c && c->grouped; }

int cuda_lora_cache_count(const cuda_lora_cache *c) { return c ? c->n : 0; }

size_t cuda_lora_cache_bytes(const cuda_lora_cache *c) {
    size_t total = 0;
    for (int i = 0; c && i < c->n; i++) total += c->copies[i].bytes;
    return total;
}
#endif
