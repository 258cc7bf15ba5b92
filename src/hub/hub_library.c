/* hub_library.c: hearth_library_json, the model library behind `hearth ls` and
 * GET /library: every model the resolver finds, opened (headers only, no weights) for
 * its family, parameters, quantization, context and capabilities, with its size on disk
 * and the fit prediction at its default context on this machine. */
#define _GNU_SOURCE
#include "hub/hub.h"
#include "io/resolve.h"
#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static __thread long long walk_bytes;

static int add_size(const char *path, const struct stat *st, int type, struct FTW *f) {
    if (type == FTW_F) walk_bytes += (long long)st->st_size;
    return 0;
}

/* Bytes on disk, following the snapshot's symlinks to their blobs. */
static long long disk_size(const char *path) {
    struct stat st;
    if (stat(path, &st)) return -1;
    if (!S_ISDIR(st.st_mode)) return (long long)st.st_size;
    walk_bytes = 0;
    nftw(path, add_size, 16, 0);
    return walk_bytes;
}

/* GGUF general.file_type values (the ftype enum GGUF writers record) for the types
 * hearth loads; others fall back to the commonest tensor type. */
static const char *gguf_file_type(json_int_t t) {
    static const struct {
        int id;
        const char *name;
    } types[] = {
        {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
        {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
        {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {32, "BF16"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].id == t) return types[i].name;
    return NULL;
}

/* "Q4_K_M" (GGUF file type), "mlx-q4g64", "bf16" (the commonest float type)... */
static void quant_label(const json_t *q, char *out, size_t cap) {
    const char *fmt = json_string_value(json_object_get(q, "format"));
    const json_t *types = json_object_get(q, "tensor_types"), *ft = json_object_get(q, "file_type");
    if (fmt && !strcmp(fmt, "mlx")) {
        snprintf(out, cap, "mlx-q%dg%d", (int)json_integer_value(json_object_get(q, "bits")),
                 (int)json_integer_value(json_object_get(q, "group_size")));
        return;
    }
    int gguf = fmt && !strcmp(fmt, "gguf");
    if (gguf && json_is_integer(ft) && gguf_file_type(json_integer_value(ft))) {
        snprintf(out, cap, "%s", gguf_file_type(json_integer_value(ft)));
        return;
    }
    const char *best = NULL;
    json_int_t best_n = -1;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)types, k, v) {
        int is_float = !strcmp(k, "F32") || !strcmp(k, "F16") || !strcmp(k, "BF16");
        if (!gguf && !is_float) continue; /* integer buffers (position ids) are not weights */
        json_int_t n = json_integer_value(v) + (is_float ? 0 : 1000000); /* quantized types win */
        if (n > best_n) {
            best_n = n;
            best = k;
        }
    }
    snprintf(out, cap, "%s", best ? best : "unknown");
    for (char *p = out; !gguf && *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
}

static int is_embedding_arch(const char *arch) {
    static const char *const archs[] = {"bert", "nomic_bert", "xlm-roberta", "roberta", "modernbert"};
    for (size_t i = 0; arch && i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(arch, archs[i])) return 1;
    return 0;
}

static json_t *describe(const model_entry *e) {
    json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "name", e->name, "path", e->path, "format",
                          e->format == MODEL_FORMAT_GGUF ? "gguf" : "safetensors", "source", e->source);
    json_object_set_new(o, "size_bytes", json_integer(disk_size(e->path)));
    hearth_model *m;
    hearth_error err = {0};
    if (hearth_model_open(e->path, &m, &err)) {
        json_object_set_new(o, "error", json_string(err.message));
        return o;
    }
    char *info_text = hearth_model_info_json(m);
    json_t *info = info_text ? json_loads(info_text, 0, NULL) : NULL;
    hearth_free(info_text);
    const char *arch = json_string_value(json_object_get(info, "architecture"));
    json_object_set_new(o, "family", json_string(arch ? arch : "unknown"));
    json_object_set(o, "parameters",
                    json_object_get(info, "parameters") ? json_object_get(info, "parameters") : json_null());
    json_object_set(o, "context_length",
                    json_object_get(info, "context_length") ? json_object_get(info, "context_length") : json_null());
    char q[64];
    quant_label(json_object_get(info, "quantization"), q, sizeof q);
    json_object_set_new(o, "quantization", json_string(q));
    const char *tmpl = hearth_model_chat_template(m);
    int embeddings = is_embedding_arch(arch), chat = !embeddings && tmpl && *tmpl;
    json_t *caps = json_array();
    if (chat) json_array_append_new(caps, json_string("chat"));
    if (chat && strstr(tmpl, "tools")) json_array_append_new(caps, json_string("tools"));
    if (embeddings) json_array_append_new(caps, json_string("embeddings"));
    json_object_set_new(o, "capabilities", caps);
    json_decref(info);
    /* fit the way `hearth serve` would start it: its default context and sequences */
    hearth_fit_options fo = {.engine = {.max_sequences = HEARTH_SERVE_MAX_SEQUENCES}};
    char *report = NULL;
    if (!embeddings && !hearth_fit(m, &fo, &report, &err)) {
        json_t *r = json_loads(report, 0, NULL);
        json_object_set(o, "fits", json_object_get(r, "fits") ? json_object_get(r, "fits") : json_null());
        json_object_set(o, "fit_context", json_object_get(r, "context_length"));
        json_object_set(o, "predicted_peak_bytes", json_object_get(r, "predicted_peak_bytes"));
        json_decref(r);
    } else {
        json_object_set_new(o, "fits", json_null()); /* fit models generation engines only */
    }
    hearth_free(report);
    hearth_model_close(m);
    return o;
}

char *hearth_library_json(const hearth_library_options *opt) {
    model_list l;
    resolve_list_models(&l);
    json_t *arr = json_array();
    for (size_t i = 0; i < l.count; i++) {
        json_t *o = describe(&l.items[i]);
        if (!o) continue;
        long long size = (long long)json_integer_value(json_object_get(o, "size_bytes"));
        const char *fam = json_string_value(json_object_get(o, "family"));
        int keep = !(opt && opt->max_size_bytes > 0 && size > opt->max_size_bytes) &&
                   !(opt && opt->family && (!fam || strcasecmp(fam, opt->family)));
        if (keep)
            json_array_append_new(arr, o);
        else
            json_decref(o);
    }
    resolve_list_free(&l);
    char *s = json_dumps(arr, JSON_INDENT(2));
    json_decref(arr);
    return s;
}
