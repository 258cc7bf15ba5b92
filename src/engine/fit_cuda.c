/* fit_cuda.c: hearth_fit for --device cuda: the device memory `hearth serve --device cuda`
 * will hold, from the sizing functions the engine allocates by (engine_plan for the host
 * side and the pool shape, cuda_plan for every device buffer) plus the CUDA runtime's own
 * share (data/cuda_runtime.json, per compute capability), for the local GPU or a GPU of
 * data/skus.json. Allocates no engine memory; touches the GPU only to read its memory. */
#include "backend/cuda/cuda_plan.h"
#include "base/err.h"
#include "engine/engine_device.h"
#include "engine/engine_plan.h"
#include "engine/fit_internal.h"
#include "io/data_files.h"
#include "model/model.h"
#include "model/model_handle.h"
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The machine the prediction is for: the local GPU or a row of data/skus.json. */
typedef struct fit_gpu {
    char name[256], cc[16];
    int present;         /* 1: the local device, measured now */
    size_t memory, free; /* total; free now (local) or total (a SKU) */
    double bandwidth_gbs;
    const char *bandwidth_source;
    size_t context_bytes, host_bytes; /* the runtime row of cuda_runtime.json */
    size_t
        engine_bytes; /* and its extra_engine_bytes: what a second engine's cuBLAS handle adds (a draft, an MTP head) */
    int runtime_measured;
    char runtime_source[512];
} fit_gpu;

hearth_status fit_device(const hearth_fit_options *o, int *device, hearth_error *err) {
    int d = o->engine.device;
    if (d != HEARTH_DEVICE_CPU && d != HEARTH_DEVICE_CUDA && d != HEARTH_DEVICE_AUTO)
        return err_set(err, HEARTH_ERR_INVALID, "fit: unknown device (--device takes cpu, cuda or auto)");
    if (o->sku && *o->sku) d = HEARTH_DEVICE_CUDA; /* a named GPU: its device report */
    if (d == HEARTH_DEVICE_AUTO) {
        engine_gpu_info info;
        d = engine_device_query(&info) ? HEARTH_DEVICE_CUDA : HEARTH_DEVICE_CPU;
    }
    *device = d;
    return HEARTH_OK;
}

/* needle in hay as whole words, any case ("l4" is in "NVIDIA L4 (24 GB)", not in "L40S"). */
static int contains_words(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (const char *h = hay; n && *h; h++) {
        if (h > hay && isalnum((unsigned char)h[-1])) continue;
        size_t i = 0;
        while (i < n && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n && !isalnum((unsigned char)h[n])) return 1;
    }
    return 0;
}

/* The GPU row of skus.json named `want` (or whose name holds it as whole words): exactly one must match. */
static hearth_status sku_lookup(const char *want, fit_gpu *g, hearth_error *err) {
    char *text = data_file_load("skus.json", err);
    if (!text) return err->status ? err->status : HEARTH_ERR_IO;
    json_t *t = json_loads(text, 0, NULL), *skus = json_object_get(t, "skus"), *found = NULL;
    free(text);
    char names[1024] = "";
    int matches = 0;
    size_t i;
    json_t *s;
    json_array_foreach(skus, i, s) {
        const char *kind = json_string_value(json_object_get(s, "kind")),
                   *name = json_string_value(json_object_get(s, "name"));
        if (!kind || strcmp(kind, "gpu") || !name) continue;
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s'%s'", len ? ", " : "", name);
        if (!strcasecmp(name, want)) { /* an exact name wins over parts of others */
            found = s, matches = 1;
            break;
        }
        if (contains_words(name, want)) found = s, matches++;
    }
    hearth_status st = HEARTH_OK;
    if (matches != 1)
        st = err_set(err, matches ? HEARTH_ERR_AMBIGUOUS : HEARTH_ERR_NOT_FOUND,
                     "fit: --sku '%s' %s the GPUs of data/skus.json (%s)", want,
                     matches ? "matches several of" : "matches none of", names);
    else {
        snprintf(g->name, sizeof g->name, "%s", json_string_value(json_object_get(found, "name")));
        const char *cc = json_string_value(json_object_get(found, "compute_capability"));
        snprintf(g->cc, sizeof g->cc, "%s", cc ? cc : "default");
        g->memory = g->free = (size_t)json_integer_value(json_object_get(found, "memory_bytes"));
        g->bandwidth_gbs = json_number_value(json_object_get(found, "bandwidth_gbs"));
        g->bandwidth_source = "sku";
    }
    json_decref(t);
    return st;
}

/* The runtime row of cuda_runtime.json for g->cc (else its "default" row). */
static hearth_status runtime_lookup(fit_gpu *g, hearth_error *err) {
    char *text = data_file_load("cuda_runtime.json", err);
    if (!text) return err->status ? err->status : HEARTH_ERR_IO;
    json_t *t = json_loads(text, 0, NULL), *rows = json_object_get(t, "runtimes"), *pick = NULL;
    free(text);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const char *cc = json_string_value(json_object_get(r, "compute_capability"));
        if (cc && !strcmp(cc, g->cc)) pick = r;
        if (cc && !strcmp(cc, "default") && !pick) pick = r;
    }
    hearth_status st = HEARTH_OK;
    if (!pick || !json_is_integer(json_object_get(pick, "context_bytes")))
        st = err_set(err, HEARTH_ERR_FORMAT, "cuda_runtime.json: no row for compute capability %s and no default",
                     g->cc);
    else {
        g->context_bytes = (size_t)json_integer_value(json_object_get(pick, "context_bytes"));
        g->host_bytes = (size_t)json_integer_value(json_object_get(pick, "host_bytes"));
        g->engine_bytes = (size_t)json_integer_value(json_object_get(pick, "extra_engine_bytes")); /* absent: 0 */
        g->runtime_measured = json_is_true(json_object_get(pick, "measured"));
        const char *src = json_string_value(json_object_get(pick, "source"));
        snprintf(g->runtime_source, sizeof g->runtime_source, "%s", src ? src : "");
    }
    json_decref(t);
    return st;
}

static hearth_status fit_gpu_resolve(const hearth_fit_options *o, fit_gpu *g, hearth_error *err) {
    memset(g, 0, sizeof *g);
    hearth_status st;
    if (o->sku && *o->sku) {
        if ((st = sku_lookup(o->sku, g, err))) return st;
    } else {
        engine_gpu_info info;
        if (!engine_device_query(&info))
            return err_set(err, HEARTH_ERR_UNSUPPORTED,
                           "fit --device cuda: no CUDA device is present here (no driver, no GPU, or a build without "
                           "the CUDA backend); name a GPU to predict for with --sku (e.g. --sku h200) or compare them "
                           "all with --skus");
        snprintf(g->name, sizeof g->name, "%s", info.name);
        snprintf(g->cc, sizeof g->cc, "%d.%d", info.cc_major, info.cc_minor);
        g->present = 1;
        g->memory = info.total_bytes;
        g->free = info.free_bytes;
    }
    if (g->present && o->bandwidth_gbs <= 0 && !o->measure_bandwidth) {
        fit_gpu spec; /* the local GPU's spec-sheet row, when skus.json has it */
        hearth_error ignore = {0};
        if (sku_lookup(g->name, &spec, &ignore) == HEARTH_OK) {
            g->bandwidth_gbs = spec.bandwidth_gbs;
            g->bandwidth_source = "sku";
        }
    }
    if (o->bandwidth_gbs > 0) {
        g->bandwidth_gbs = o->bandwidth_gbs;
        g->bandwidth_source = "given";
    } else if (o->measure_bandwidth || (g->present && g->bandwidth_gbs <= 0)) {
        if (!g->present)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "fit: --measure needs the GPU here; --sku uses its spec sheet");
        g->bandwidth_gbs = engine_device_bandwidth_gbs(); /* the device copy rate, read + write */
        g->bandwidth_source = "measured";
        if (g->bandwidth_gbs <= 0) return err_set(err, HEARTH_ERR_NOMEM, "fit: cannot measure the GPU's copy rate");
    }
    return runtime_lookup(g, err);
}

typedef struct fit_cuda_sizes {
    engine_plan host;
    cuda_plan dev;
    size_t peak; /* device: the plan plus the runtime */
} fit_cuda_sizes;

/* The engine's plan and the device plan cuda_model_create makes from it (engine.c hands
 * the host pool's shape, step tokens and logits rows to cuda_model_create). */
static hearth_status sizes_make(const model *m, const hearth_engine_options *eo, const fit_gpu *g, fit_cuda_sizes *z,
                                hearth_error *err) {
    hearth_engine_options on_gpu = *eo; /* the engine as it would be made on the GPU (fp8 KV is GPU-only) */
    on_gpu.device = HEARTH_DEVICE_CUDA;
    /* the default pool's cut, as hearth_engine_create makes it: the host's room and the
     * device's free memory (a SKU's total less the runtime's share) */
    size_t host_room = 0, dev_room = 0;
    if (engine_plan_is_auto(eo)) {
        host_room = engine_host_room();
        size_t free_b = g->present ? g->free : g->free > g->context_bytes ? g->free - g->context_bytes : 1;
        dev_room = engine_device_room(free_b, g->memory);
    }
    hearth_status st = engine_plan_rooms(m, &on_gpu, host_room, dev_room, &z->host, err);
    if (st) return st;
    const model_config *c = &m->cfg;
    kv_cache shape = {.n_layers = c->n_kv_layers,
                      .n_kv_heads = c->n_kv_heads,
                      .head_dim = c->head_dim,
                      .n_blocks = z->host.n_blocks,
                      .max_slots = z->host.max_seqs,
                      .max_blocks_per_slot = (z->host.context + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE,
                      .layer_heads = c->kv_heads, /* Gemma 4: each KV layer's own shape (NULL: uniform) */
                      .layer_dims = c->kv_dims};
    cuda_plan_make(model_ops(m), &shape, z->host.step_tokens, z->host.max_out, cuda_kv_device_dtype(eo->kv_quant),
                   eo->cuda_exact, eo->expert_offload, &z->dev);
    z->peak = cuda_plan_bytes(&z->dev) + g->context_bytes;
    return HEARTH_OK;
}

/* Whether the device peak of these options fits in the GPU's free memory. */
static int fits_device(const model *m, const hearth_engine_options *o, const void *arg) {
    fit_cuda_sizes z;
    hearth_error ignore = {0};
    return sizes_make(m, o, arg, &z, &ignore) == HEARTH_OK && z.peak <= ((const fit_gpu *)arg)->free;
}

#define JSON_SIZE(v) json_integer((json_int_t)(v))

/* Host bytes of a load that maps the weights (engine_maps_weights) on the GPU, beyond its
 * arena (the vectors): the tables the host reads (host_only items, the embeddings: their
 * pages as prompts touch them, counted whole) and the file pages of the one weight being
 * uploaded (an expert stack's one expert; each leaves once its device copy is made), with a
 * fault-around window on either side. */
static size_t mapped_host_bytes(const model *m) {
    const op_model *om = model_ops(m);
    size_t tables = 0, unit = 0;
    for (int i = 0; i < om->n_items; i++) {
        const op_weight *w = om->items[i].w;
        if (!w) continue;
        size_t b = (size_t)w->n * (size_t)op_weight_row_bytes(w) + 2 * op_weight_sb_bytes(w);
        size_t one = om->items[i].experts > 0 ? b / (size_t)om->items[i].experts : b; /* what one release drops */
        if (om->items[i].host_only)
            tables += b;
        else if (one > unit)
            unit = one;
    }
    return tables + unit + ((size_t)128 << 10);
}

/* A draft model's engine on the same GPU (--draft-model): created after the target's, with
 * the target's context, sequences and step (engine_draft_options), from the device memory the
 * target left free; the CUDA context and cuBLAS are the process's, counted once. */
typedef struct fit_cuda_draft {
    const hearth_model *hm;
    size_t mapped; /* mapped_host_bytes of its model (0: copied into its arena) */
    fit_cuda_sizes z;
    /* --speculate mtp: the model's own MTP head in the draft's place (model_plan_mtp), and the
     * model's hidden rows the head reads (a device buffer of a step's rows, made at its first step) */
    int mtp;
    size_t hidden_rows;
} fit_cuda_draft;

static json_t *report(const hearth_model *hm, const model *m, const hearth_fit_options *o, const fit_gpu *g,
                      const fit_cuda_sizes *z, const fit_cuda_draft *dr) {
    const cuda_plan *d = &z->dev;
    json_t *r = json_object();
    json_object_set_new(r, "model", json_string(hm->entry.path));
    json_object_set_new(r, "device", json_string("cuda"));
    json_object_set_new(r, "gpu", json_string(g->name));
    json_object_set_new(r, "compute_capability", json_string(g->cc));
    json_object_set_new(r, "device_present", json_boolean(g->present));
    json_object_set_new(r, "context_length", json_integer(z->host.context));
    json_object_set_new(r, "context_source", json_string(fit_context_source(&o->engine, &z->host)));
    json_object_set_new(r, "max_sequences", json_integer(z->host.max_seqs));
    json_object_set_new(r, "step_tokens", json_integer(z->host.step_tokens));
    json_object_set_new(r, "weights_bytes", JSON_SIZE(d->weights));
    json_object_set_new(r, "kv_pool_bytes", JSON_SIZE(d->kv));
    json_object_set_new(r, "kv_blocks", json_integer(z->host.n_blocks));
    json_object_set_new(r, "kv_blocks_cut_from", json_integer(z->host.kv_cut_from));
    json_object_set_new(r, "kv_quant", json_string(hearth_kv_quant_name(o->engine.kv_quant)));
    json_object_set_new(r, "kv_device_dtype", json_string(cuda_kv_dtype_name(d->kv_dtype)));
    json_object_set_new(r, "scratch_bytes", JSON_SIZE(d->scratch));
    /* of the scratch: each step row's LoRA adapter tables and the serving tier's rank values,
     * made whatever adapters are mounted (cuda_lora_cache_create) */
    json_object_set_new(r, "lora_scratch_bytes",
                        JSON_SIZE(d->lora_sets_bytes + d->lora_counts_bytes + d->lora_fast_bytes));
    /* the logits rows are device scratch; the engine's buffers on the device are the
     * sampler's (as the CPU report's buffers_bytes holds its sampler) */
    json_object_set_new(r, "buffers_bytes", JSON_SIZE(d->sampler));
    json_object_set_new(r, "sampler_bytes", JSON_SIZE(d->sampler));
    json_object_set_new(r, "engine_bytes", JSON_SIZE(cuda_plan_bytes(d)));
    json_object_set_new(r, "runtime_overhead_bytes", JSON_SIZE(g->context_bytes));
    json_object_set_new(r, "runtime_overhead",
                        json_pack("{s:I, s:b, s:s}", "cuda_context_and_cublas_bytes", (json_int_t)g->context_bytes,
                                  "measured", g->runtime_measured, "source", g->runtime_source));
    json_object_set_new(r, "device_allocations",
                        json_pack("{s:i, s:I, s:I}", "count", d->n_allocs, "requested_bytes", (json_int_t)d->requested,
                                  "page_rounding_bytes", (json_int_t)(cuda_plan_bytes(d) - d->requested)));
    if (model_ops(m)->dims.n_experts > 0) /* resident (in weights_bytes), or offloaded (--expert-offload N: in host.pinned_bytes) */
        json_object_set_new(r, "experts",
                            json_pack("{s:b, s:I, s:i, s:I}", "offloaded", d->expert_slots > 0, "bytes",
                                      (json_int_t)d->expert_bytes, "device_slots", d->expert_slots, "slot_bytes",
                                      (json_int_t)(d->slot_data_bytes + d->slot_scale_bytes)));
    json_object_set_new(r, "weights_expanded_to_f32", json_integer(d->n_expanded));
    if (d->n_expanded) json_object_set_new(r, "expanded_format", json_string(tensor_dtype_name(d->expanded_from)));
    size_t draft = dr ? cuda_plan_bytes(&dr->z.dev) + dr->hidden_rows + g->engine_bytes : 0, peak = z->peak + draft;
    if (dr) {
        const cuda_plan *dd = &dr->z.dev;
        json_object_set_new(r, dr->mtp ? "mtp_bytes" : "draft_bytes", JSON_SIZE(draft));
        json_object_set_new(r, dr->mtp ? "mtp" : "draft",
                            json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:i,s:I,s:I}", "model", dr->hm->entry.path,
                                      "weights_bytes", (json_int_t)dd->weights, "kv_pool_bytes", (json_int_t)dd->kv,
                                      "scratch_bytes", (json_int_t)dd->scratch, "buffers_bytes",
                                      (json_int_t)dd->sampler, "engine_bytes", (json_int_t)cuda_plan_bytes(dd),
                                      "kv_blocks", dr->z.host.n_blocks, "runtime_bytes", (json_int_t)g->engine_bytes,
                                      "hidden_rows_bytes", (json_int_t)dr->hidden_rows));
    }
    json_object_set_new(r, "predicted_peak_bytes", JSON_SIZE(peak));
    json_object_set_new(r, "device_memory_bytes", JSON_SIZE(g->memory));
    json_object_set_new(r, "available_bytes", JSON_SIZE(g->free));
    json_object_set_new(r, "fits", json_boolean(peak <= g->free));
    json_object_set_new(r, "model_max_context", json_integer(m->cfg.context_length));
    json_object_set_new(r, "max_context_that_fits", json_integer(fit_largest_context(m, &o->engine, fits_device, g)));
    /* the host holds its engine (engine_plan: the weights' arena, the whole weights with
     * --no-mmap, else the vectors only), the mapped pages (mapped_host_bytes), the pinned
     * staging buffers, the largest upload's temporary and the driver's share */
    size_t gt, gtmp; /* constrained decoding's tables: host memory (the mask is made on the host) */
    int maps = engine_maps_weights(o->engine.use_mmap, HEARTH_DEVICE_CUDA);
    size_t mapped = maps ? mapped_host_bytes(m) : 0;
    size_t host = fit_host_peak(hm, m, &z->host, 0, &gt, &gtmp) + mapped + d->pinned_host + d->upload_host +
                  d->sampler_host + g->host_bytes;
    if (dr) /* the draft's host side: its engine, its mapped pages and staging */
        host += engine_plan_bytes(&dr->z.host) + dr->mapped + dr->z.dev.pinned_host + dr->z.dev.upload_host +
                dr->z.dev.sampler_host;
    json_t *h =
        json_pack("{s:I, s:I, s:b, s:I, s:I, s:I, s:I, s:I, s:I}", "predicted_peak_bytes", (json_int_t)host,
                  "engine_bytes", (json_int_t)engine_plan_bytes(&z->host), "weights_mapped", maps, "mapped_pages_bytes",
                  (json_int_t)mapped, "pinned_bytes", (json_int_t)d->pinned_host, "upload_temporary_bytes",
                  (json_int_t)d->upload_host, "device_sampler_bytes", (json_int_t)d->sampler_host, "cuda_runtime_bytes",
                  (json_int_t)g->host_bytes, "grammar_bytes", (json_int_t)(gt + gtmp));
    json_object_set_new(h, "grammar", fit_grammar_json(gt, gtmp));
    json_object_set_new(r, "host", h);
    double full = cuda_plan_decode_bytes(d, model_ops(m), z->host.context), empty = cuda_plan_decode_bytes(d, model_ops(m), 1);
    if (g->bandwidth_gbs > 0) {
        json_object_set_new(r, "bandwidth_gbs", json_real(g->bandwidth_gbs));
        json_object_set_new(r, "bandwidth_source", json_string(g->bandwidth_source));
        json_object_set_new(r, "decode_bytes_per_token", json_real(full));
        json_object_set_new(r, "decode_tok_s", json_real(g->bandwidth_gbs * 1e9 / full));
        json_object_set_new(r, "decode_tok_s_empty_cache", json_real(g->bandwidth_gbs * 1e9 / empty));
    }
    return r;
}

hearth_status fit_cuda(hearth_model *hm, const hearth_fit_options *o, char **report_json, hearth_error *err) {
    fit_gpu g;
    hearth_status st = fit_gpu_resolve(o, &g, err);
    if (st) return st;
    model *m;
    int maps = engine_maps_weights(o->engine.use_mmap, HEARTH_DEVICE_CUDA);
    if ((st = model_plan(hm, maps, &m, err))) return st;
    fit_cuda_sizes z;
    int mtp = o->engine.speculate == HEARTH_SPEC_MTP;
    fit_cuda_draft dr = {.hm = mtp                                       ? hm
                               : o->engine.speculate != HEARTH_SPEC_NONE ? o->engine.draft_model
                                                                         : NULL,
                         .mtp = mtp};
    model *dm = NULL;
    st = engine_expert_offload_check(model_ops(m), HEARTH_DEVICE_CUDA, o->engine.expert_offload, err);
    if (!st) st = sizes_make(m, &o->engine, &g, &z, err);
    if (!st && dr.hm) { /* the draft sees the memory the target's engine left */
        hearth_engine_options dop = engine_draft_options(&o->engine, &z.host);
        fit_gpu gd = g;
        size_t target = cuda_plan_bytes(&z.dev);
        gd.free = g.free > target ? g.free - target : 1;
        st = mtp ? model_plan_mtp(hm, m, &dm, err) : model_plan(dr.hm, maps, &dm, err);
        if (!st && !mtp && maps) dr.mapped = mapped_host_bytes(dm);
        if (!st) st = sizes_make(dm, &dop, &gd, &dr.z, err);
        if (st && mtp)
            err_prefix(err, "--speculate mtp");
        else if (st)
            err_prefix(err, "--draft-model %s", dr.hm->entry.path);
        if (mtp) dr.hidden_rows = (size_t)z.host.step_tokens * (size_t)m->cfg.hidden * sizeof(float);
    }
    if (!st) {
        json_t *r = report(hm, m, o, &g, &z, dr.hm ? &dr : NULL);
        *report_json = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        json_decref(r);
        if (!*report_json) st = err_set(err, HEARTH_ERR_NOMEM, "fit: out of memory");
    }
    model_free(dm);
    model_free(m);
    return st;
}
