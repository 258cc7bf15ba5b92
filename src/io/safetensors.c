/* safetensors.c: parses safetensors images (8-byte LE header length, JSON header,
 * byte buffer) into a tensor catalog, and gathers the files of a model folder into a
 * sorted set. Every length, offset and shape is checked against the buffer before a
 * pointer is made; nothing here copies or converts tensor data. */
#include "io/safetensors.h"
#include "base/err.h"
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* The reference implementation (safetensors crate) refuses headers above 100 MB; a
 * real header is a few hundred KB even for models with tens of thousands of tensors. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

static const struct { const char *name; tensor_dtype dtype; } st_dtypes[] = {
    {"F64", DT_F64}, {"F32", DT_F32}, {"F16", DT_F16}, {"BF16", DT_BF16}, {"I64", DT_I64},
    {"I32", DT_I32}, {"I16", DT_I16}, {"I8", DT_I8},   {"U64", DT_U64},   {"U32", DT_U32},
    {"U16", DT_U16}, {"U8", DT_U8},   {"BOOL", DT_BOOL},
};

static int st_dtype_from_name(const char *s, tensor_dtype *out) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = st_dtypes[i].dtype;
            return 1;
        }
    return 0;
}

/* Reads a JSON integer that must lie in [0, INT64_MAX]. */
static int st_json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0) return 0;
    *out = (uint64_t)x;
    return 1;
}

/* Fills one catalog entry from its header object; `data`/`data_len` is the byte
 * buffer after the header, which data_offsets are relative to. */
static hearth_status st_parse_entry(const char *fname, const char *name, json_t *entry, const uint8_t *data,
                                    uint64_t data_len, tensor_info *t, hearth_error *err) {
    if (!json_is_object(entry))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': header entry is not a JSON object", fname, name);
    json_t *jd = json_object_get(entry, "dtype"), *js = json_object_get(entry, "shape");
    json_t *jo = json_object_get(entry, "data_offsets");
    if (!json_is_string(jd))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", fname, name);
    if (!st_dtype_from_name(json_string_value(jd), &t->dtype))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype '%s'", fname, name,
                       json_string_value(jd));
    if (!json_is_array(js))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", fname, name);
    size_t ndim = json_array_size(js);
    if (ndim > TENSOR_MAX_DIMS)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions, at most %d supported", fname,
                       name, ndim, TENSOR_MAX_DIMS);
    t->ndim = (int)ndim;
    uint64_t elems = 1;
    int overflow = 0;
    for (size_t i = 0; i < ndim; i++) {
        uint64_t d;
        if (!st_json_u64(json_array_get(js, i), &d))
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                           fname, name, i);
        t->shape[i] = (int64_t)d;
        if (d && elems > UINT64_MAX / d) overflow = 1;
        else elems *= d;
    }
    uint64_t esize = (uint64_t)tensor_dtype_block_bytes(t->dtype);
    if (overflow || (elems && elems > UINT64_MAX / esize))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': shape is too large (size overflows)", fname, name);
    uint64_t want = elems * esize;
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be an array of two integers",
                       fname, name);
    uint64_t begin, end;
    if (!st_json_u64(json_array_get(jo, 0), &begin) || !st_json_u64(json_array_get(jo, 1), &end))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be non-negative integers",
                       fname, name);
    if (begin > end)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", fname, name,
                       (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets end %llu is past the end of the data (%llu bytes)", fname, name,
                       (unsigned long long)end, (unsigned long long)data_len);
    if (end - begin != want)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype %s need %llu", fname, name,
                       (unsigned long long)(end - begin), tensor_dtype_name(t->dtype), (unsigned long long)want);
    t->data = data + begin;
    t->nbytes = want;
    return HEARTH_OK;
}

static void st_free_tensors(st_file *f) {
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    f->tensors = NULL;
    f->n_tensors = 0;
}

/* Parses the JSON header text into f; f->path is already set. */
static hearth_status st_parse_header(const uint8_t *hdr, size_t hlen, const uint8_t *data, uint64_t data_len,
                                     st_file *f, hearth_error *err) {
    const char *fname = f->path;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: header is not valid JSON (line %d column %d): %s", fname,
                       jerr.line, jerr.column, jerr.text);
    hearth_status st = HEARTH_OK;
    if (!json_is_object(root)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: header is not a JSON object", fname);
        goto done;
    }
    /* mlx writes "__metadata__": null when there is none */
    json_t *meta = json_object_get(root, "__metadata__");
    size_t n = json_object_size(root) - (meta ? 1 : 0);
    if (json_is_null(meta)) meta = NULL;
    if (meta && !json_is_object(meta)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", fname);
        goto done;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory for %zu tensors", fname, n);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        tensor_info *t = &f->tensors[f->n_tensors];
        memset(t, 0, sizeof *t);
        st = st_parse_entry(fname, key, val, data, data_len, t, err);
        if (st != HEARTH_OK) goto done;
        t->name = strdup(key);
        if (!t->name) {
            st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
            goto done;
        }
        t->file = f->path;
        f->n_tensors++;
    }
    if (meta) f->metadata = json_incref(meta);
done:
    json_decref(root);
    return st;
}

hearth_status st_parse(const uint8_t *buf, size_t len, const char *fname, st_file *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    if (!fname) fname = "<memory>";
    out->path = strdup(fname);
    if (!out->path) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
    hearth_status st;
    if (len < 8 || !buf) {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors header", fname, len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > len - 8) {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: header length %llu is past the end of the file (%zu bytes)",
                     fname, (unsigned long long)hlen, len);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        st = err_set(err, HEARTH_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", fname,
                     (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    const uint8_t *data = buf + 8 + hlen;
    st = st_parse_header(buf + 8, (size_t)hlen, data, (uint64_t)(len - 8 - hlen), out, err);
    if (st != HEARTH_OK) goto fail;
    return HEARTH_OK;
fail:
    st_close(out);
    return st;
}

hearth_status st_open(const char *path, st_file *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    file_map map;
    hearth_status st = file_map_open(path, &map, err);
    if (st != HEARTH_OK) return st;
    st = st_parse(map.data, map.size, path, out, err);
    if (st != HEARTH_OK) {
        file_map_close(&map);
        return st;
    }
    out->map = map;
    return HEARTH_OK;
}

void st_close(st_file *f) {
    if (!f) return;
    st_free_tensors(f);
    file_map_close(&f->map);
    if (f->metadata) json_decref(f->metadata);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- sets of files --------------------------------------------------------- */

static int st_cmp_tensor_ptr(const void *a, const void *b) {
    const tensor_info *x = *(const tensor_info *const *)a, *y = *(const tensor_info *const *)b;
    return strcmp(x->name, y->name);
}

static int st_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void st_free_names(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Appends a copy of s to names unless already present (the list stays small: shards). */
static int st_names_add(char ***names, size_t *n, const char *s) {
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*names)[i], s) == 0) return 1;
    char **nn = realloc(*names, (*n + 1) * sizeof *nn);
    if (!nn) return 0;
    *names = nn;
    if (!(nn[*n] = strdup(s))) return 0;
    (*n)++;
    return 1;
}

/* Shard file names from model.safetensors.index.json, in first-seen order. Names
 * that leave the folder ('/' or "..") are refused: the index is untrusted input. */
static hearth_status st_index_shards(const char *index_path, char ***names, size_t *n, json_t **weight_map,
                                     hearth_error *err) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: not valid JSON (line %d): %s", index_path, jerr.line,
                       jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return err_set(err, HEARTH_ERR_FORMAT, "%s: missing \"weight_map\" object", index_path);
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *shard = json_string_value(val);
        hearth_status st = HEARTH_OK;
        if (!shard || !*shard || strchr(shard, '/') || strcmp(shard, "..") == 0 || strcmp(shard, ".") == 0)
            st = err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': shard must be a file name in the same folder",
                         index_path, key);
        else if (!st_names_add(names, n, shard))
            st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", index_path);
        if (st != HEARTH_OK) { /* key lives in root: report before freeing it */
            json_decref(root);
            return st;
        }
    }
    *weight_map = json_incref(wm);
    json_decref(root);
    return HEARTH_OK;
}

/* Every *.safetensors file in dir, sorted so the set is the same on every run. */
static hearth_status st_glob_dir(const char *dir, char ***names, size_t *n, hearth_error *err) {
    DIR *d = opendir(dir);
    if (!d) return err_set(err, HEARTH_ERR_IO, "%s: cannot open folder", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 12 && strcmp(e->d_name + l - 12, ".safetensors") == 0 && !st_names_add(names, n, e->d_name)) {
            closedir(d);
            return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", dir);
        }
    }
    closedir(d);
    if (*n) qsort(*names, *n, sizeof **names, st_cmp_str);
    return HEARTH_OK;
}

/* Builds the sorted name index and refuses a name that two files both define. */
static hearth_status st_set_index(st_set *s, hearth_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < s->n_files; i++) total += s->files[i].n_tensors;
    s->by_name = malloc((total ? total : 1) * sizeof *s->by_name);
    if (!s->by_name) return err_set(err, HEARTH_ERR_NOMEM, "out of memory indexing %zu tensors", total);
    for (size_t i = 0; i < s->n_files; i++)
        for (size_t j = 0; j < s->files[i].n_tensors; j++) s->by_name[s->n_tensors++] = &s->files[i].tensors[j];
    qsort(s->by_name, s->n_tensors, sizeof *s->by_name, st_cmp_tensor_ptr);
    for (size_t i = 1; i < s->n_tensors; i++)
        if (strcmp(s->by_name[i - 1]->name, s->by_name[i]->name) == 0)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s' is defined in both %s and %s", "safetensors set",
                           s->by_name[i]->name, s->by_name[i - 1]->file, s->by_name[i]->file);
    return HEARTH_OK;
}

/* Each tensor the index assigns to a shard must be in that shard. */
static hearth_status st_check_weight_map(const st_set *s, json_t *wm, const char *index_path, hearth_error *err) {
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const tensor_info *t = st_set_find(s, key);
        if (!t)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s' is listed in shard %s but not found there",
                           index_path, key, json_string_value(val));
        const char *base = strrchr(t->file, '/');
        base = base ? base + 1 : t->file;
        if (strcmp(base, json_string_value(val)) != 0)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s' is listed in shard %s but found in %s",
                           index_path, key, json_string_value(val), t->file);
    }
    return HEARTH_OK;
}

hearth_status st_set_open(const char *dir, st_set *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    char **names = NULL, *index_path = path_join(dir, "model.safetensors.index.json");
    size_t n = 0;
    json_t *wm = NULL;
    hearth_status st = HEARTH_OK;
    if (!index_path) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", dir);
    if (file_exists(index_path)) {
        st = st_index_shards(index_path, &names, &n, &wm, err);
    } else {
        char *single = path_join(dir, "model.safetensors");
        if (!single) st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", dir);
        else if (file_exists(single)) st = st_names_add(&names, &n, "model.safetensors")
                                               ? HEARTH_OK
                                               : err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", dir);
        else st = st_glob_dir(dir, &names, &n, err);
        free(single);
    }
    if (st == HEARTH_OK && n == 0)
        st = err_set(err, HEARTH_ERR_NOT_FOUND, "%s: no .safetensors files in this folder", dir);
    if (st == HEARTH_OK && !(out->files = calloc(n, sizeof *out->files)))
        st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", dir);
    for (size_t i = 0; st == HEARTH_OK && i < n; i++) {
        char *p = path_join(dir, names[i]);
        if (!p) st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", dir);
        else st = st_open(p, &out->files[i], err);
        free(p);
        if (st == HEARTH_OK) out->n_files++;
    }
    if (st == HEARTH_OK) st = st_set_index(out, err);
    if (st == HEARTH_OK && wm) st = st_check_weight_map(out, wm, index_path, err);
    if (wm) json_decref(wm);
    st_free_names(names, n);
    free(index_path);
    if (st != HEARTH_OK) st_set_close(out);
    return st;
}

void st_set_close(st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_files; i++) st_close(&s->files[i]);
    free(s->files);
    free(s->by_name);
    memset(s, 0, sizeof *s);
}

const tensor_info *st_set_find(const st_set *s, const char *name) {
    size_t lo = 0, hi = s->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->by_name[mid]->name, name);
        if (c == 0) return s->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
