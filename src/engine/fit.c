/* fit.c: hearth_fit, the memory contract: predicts an engine's footprint without creating
 * it, from the sizing function the engine allocates by (engine_plan) plus what this
 * process already holds and the model file pages that loading will map. The GPU's
 * report (--device cuda) is fit_cuda.c's. Reads /proc;
 * allocates no engine memory (only the bandwidth probe's buffer when asked to measure). */
#define _GNU_SOURCE
#include "model/model_handle.h"
#include "backend/cpu/bandwidth.h"
#include "base/err.h"
#include "base/threadpool.h"
#include "engine/engine_device.h"
#include "engine/engine_internal.h"
#include "engine/engine_plan.h"
#include "kv/kv_cache.h"
#include "engine/fit_internal.h"
#include "model/model.h"
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Streaming read of a 1 GiB buffer on the development VM (bench/results/kernels.md,
 * 9.9 GB/s with 1 and 2 threads): a conservative figure for a desktop or laptop with
 * dual-channel DDR4, used only when this machine's cannot be read or probed. */
#define FIT_DEFAULT_BANDWIDTH_GBS 9.9

/* Resident bytes one worker thread adds: the stack pages it touches plus its TLS and
 * guard bookkeeping. Measured with tests/parity/test_fit.py (RSS with --threads 1 vs
 * 2 vs 4); the engine's own thread adds nothing, it is the caller's. */
#define FIT_THREAD_RESIDENT_BYTES (16 * 1024)

/* hearth's own code pages that starting an engine and running the first step map in
 * (loader, kernels, forward pass, threads): measured as the growth of RssFile beyond the
 * model's file pages with the tiny test models, 190-250 KiB. Matters only for tiny
 * models: 256 KiB is 2-3% of a 10 MiB process and noise for a real one. */
#define FIT_ENGINE_CODE_BYTES (256 * 1024)

/* A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent or unreadable. */
long long hearth_proc_kb_field(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            v = strtoll(line + n + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

void hearth_process_memory_get(hearth_process_memory *out) {
    out->resident_bytes = hearth_proc_kb_field("/proc/self/status", "VmRSS");
    out->peak_resident_bytes = hearth_proc_kb_field("/proc/self/status", "VmHWM");
    out->available_bytes = hearth_proc_kb_field("/proc/meminfo", "MemAvailable");
}

/* Resident bytes of the mapping that starts at addr (from /proc/self/smaps); 0 if none. */
static size_t mapping_rss(const void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    char line[512];
    int in = 0;
    size_t rss = 0;
    while (fgets(line, sizeof line, f)) {
        char *end;
        unsigned long long start = strtoull(line, &end, 16);
        if (end != line && *end == '-') { /* a mapping's header line */
            in = start == (unsigned long long)(uintptr_t)addr;
            continue;
        }
        if (in && !strncmp(line, "Rss:", 4)) {
            rss = (size_t)strtoull(line + 4, NULL, 10) * 1024;
            break;
        }
    }
    fclose(f);
    return rss;
}

static size_t page_round(size_t n) {
    long ps = sysconf(_SC_PAGESIZE);
    size_t p = ps > 0 ? (size_t)ps : 4096;
    return (n + p - 1) / p * p;
}

/* File pages the loader will map in: it reads every tensor, and the kernel maps the
 * pages around each fault too, so in practice the whole file ends up resident. */
static size_t file_pages_to_come(const hearth_model *hm) {
    size_t total = 0;
    if (hm->entry.format == MODEL_FORMAT_GGUF) {
        if (hm->gguf.map.data) {
            size_t all = page_round(hm->gguf.map.size), now = mapping_rss(hm->gguf.map.data);
            total += all > now ? all - now : 0;
        }
    } else {
        for (size_t i = 0; i < hm->st.n_files; i++) {
            const file_map *fm = &hm->st.files[i].map;
            if (!fm->data) continue;
            size_t all = page_round(fm->size), now = mapping_rss(fm->data);
            total += all > now ? all - now : 0;
        }
    }
    return total;
}

typedef struct fit_base {
    size_t resident_now;  /* this process before the engine: binary, libraries, tokenizer, metadata */
    size_t file_pages;    /* model file pages loading will add */
    size_t thread_stacks; /* the pool's worker threads */
    size_t code_pages;    /* hearth code first run when the engine starts */
    int keeps_file;       /* --mmap: the weights are the file pages, which stay */
    size_t grammar;       /* constrained decoding's vocabulary tables and their build (fit_grammar) */
} fit_base;

/* Two moments: the worst point of the load, when the arena written so far and the file pages
 * of the tensor being copied are resident (model_load drops each tensor's pages once it is
 * copied: model_load_peak_bytes), and the running engine (the arena, KV pool, scratch and
 * threads, and the grammar tables once a constrained request came). With --mmap the pages
 * stay: both at once. */
static size_t fit_peak(const fit_base *b, const engine_plan *p) {
    size_t run = engine_plan_bytes(p) + b->thread_stacks + b->grammar, load = p->weights_load_peak;
    if (b->keeps_file) return b->resident_now + b->code_pages + b->file_pages + run;
    return b->resident_now + b->code_pages + (load > run ? load : run);
}

static fit_base fit_base_now(const hearth_model *hm, int n_threads, int use_mmap) {
    engine_trim_heap();
    /* the loader drops the tensor pages it copied: measure this process without them too
     * (opening the model may have faulted some in), so file_pages counts all of them */
    if (!use_mmap) model_drop_file_pages(hm);
    long long rss = hearth_proc_kb_field("/proc/self/status", "VmRSS");
    return (fit_base){.resident_now = rss > 0 ? (size_t)rss : 0,
                      .file_pages = file_pages_to_come(hm),
                      .thread_stacks = (size_t)(n_threads > 1 ? n_threads - 1 : 0) * FIT_THREAD_RESIDENT_BYTES,
                      .code_pages = FIT_ENGINE_CODE_BYTES,
                      .keeps_file = use_mmap != 0};
}

size_t fit_process_base(const hearth_model *hm, int threads) {
    fit_base b = fit_base_now(hm, threads, 0);
    return b.resident_now + b.code_pages + b.thread_stacks;
}

/* Host bytes constrained decoding adds (engine_grammar_footprint for the model's tokenizer):
 * the vocabulary tables the engine keeps from its first constrained request on, plus what
 * their build holds besides (freed, but often kept by the heap); returns their sum. Called
 * after fit_base_now: its layout is allocated meanwhile. */
static size_t fit_grammar(const hearth_model *hm, const model *m, size_t *tables, size_t *temporary) {
    if (!engine_grammar_footprint(hm, m->cfg.vocab, tables, temporary)) *tables = *temporary = 0;
    return *tables + *temporary;
}

size_t fit_host_peak(const hearth_model *hm, const model *m, const engine_plan *p, int use_mmap, size_t *grammar_tables,
                     size_t *grammar_temporary) {
    fit_base b = fit_base_now(hm, p->n_threads, use_mmap);
    b.grammar = fit_grammar(hm, m, grammar_tables, grammar_temporary);
    return fit_peak(&b, p);
}

json_t *fit_grammar_json(size_t tables, size_t temporary) {
    return json_pack("{s:I, s:I, s:s}", "vocab_tables_bytes", (json_int_t)tables, "build_temporary_bytes",
                     (json_int_t)temporary, "built",
                     "at the first constrained request (response_format json_schema / json_object, a forced tool "
                     "call, a grammar), not at start: in predicted_peak_bytes, not in predicted_start_bytes");
}

int fit_largest_context(const model *m, const hearth_engine_options *eo,
                        int (*fits)(const model *, const hearth_engine_options *, const void *), const void *arg) {
    int hi = m->cfg.context_length > 0 ? m->cfg.context_length : 8192, lo = 0;
    if (hi > (1 << 24)) hi = 1 << 24;
    while (lo < hi) { /* invariant: lo fits (or is 0), everything above hi does not */
        int mid = lo + (hi - lo + 1) / 2;
        hearth_engine_options o = *eo;
        o.context_length = mid;
        if (fits(m, &o, arg))
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

typedef struct host_room {
    const fit_base *b;
    size_t available, room; /* room: engine_host_room(), the default pool's cut */
} host_room;

/* Whether the engine of these options fits in `available` more bytes than the process holds now. */
static int fits_host(const model *m, const hearth_engine_options *o, const void *arg) {
    const host_room *r = arg;
    engine_plan p;
    hearth_error ignore = {0};
    return engine_plan_host(m, o, r->room, &p, &ignore) == HEARTH_OK &&
           fit_peak(r->b, &p) - r->b->resident_now <= r->available;
}

static double fit_bandwidth(const hearth_fit_options *o, int n_threads, const char **source, char *recorded,
                            size_t cap, hearth_error *err, hearth_status *st) {
    *st = HEARTH_OK;
    if (o->bandwidth_gbs > 0) {
        *source = "given";
        return o->bandwidth_gbs;
    }
    double gbs;
    if (!o->measure_bandwidth) { /* this machine's recorded figure (a bench run's), else a quick probe */
        if (!hearth_machine_bandwidth(&gbs, recorded, cap, NULL)) {
            *source = recorded;
            return gbs;
        }
        *source = "default";
        return FIT_DEFAULT_BANDWIDTH_GBS;
    }
    threadpool *tp;
    if ((*st = tp_create(n_threads, &tp, err))) return 0;
    gbs = cpu_read_bandwidth_gbs(tp, (size_t)1 << 30, 5);
    tp_destroy(tp);
    if (gbs <= 0) *st = err_set(err, HEARTH_ERR_NOMEM, "fit: cannot allocate the 1 GiB bandwidth probe");
    *source = "measured";
    return gbs;
}

#define JSON_SIZE(v) json_integer((json_int_t)(v))

const char *fit_context_source(const hearth_engine_options *o, const engine_plan *p) {
    return o->context_length ? "given" : p->context_cut_from ? "the largest that fits (below the model's own)"
                                                             : "the model's own";
}

hearth_status hearth_fit(hearth_model *hm, const hearth_fit_options *opts, char **report_json, hearth_error *err) {
    *report_json = NULL;
    hearth_fit_options o = opts ? *opts : (hearth_fit_options){0};
    int device;
    hearth_status st = fit_device(&o, &device, err);
    if (st) return st;
    if (device == HEARTH_DEVICE_CUDA) return fit_cuda(hm, &o, report_json, err);
    model *m;
    st = model_plan(hm, o.engine.use_mmap > 0, &m, err);
    if (!st && (st = engine_expert_offload_check(model_ops(m), device, o.engine.expert_offload, err))) model_free(m);
    if (st) return st;
    engine_plan p;
    size_t room = engine_plan_is_auto(&o.engine) ? engine_host_room() : 0; /* as hearth_engine_create reads it */
    if ((st = engine_plan_host(m, &o.engine, room, &p, err))) {
        model_free(m);
        return st;
    }
    /* a draft model (--draft-model) or the model's MTP head (--speculate mtp): its engine
     * beside the target's, created after it (the head's file is the model's own) */
    int mtp = o.engine.speculate == HEARTH_SPEC_MTP;
    const hearth_model *dhm = mtp ? hm : o.engine.speculate != HEARTH_SPEC_NONE ? o.engine.draft_model : NULL;
    model *dm = NULL;
    engine_plan dp = {0};
    if (dhm) {
        hearth_engine_options dop = engine_draft_options(&o.engine, &p);
        size_t target = engine_plan_bytes(&p) - model_kv_storage_bytes(&m->cfg, p.n_blocks, o.engine.kv_quant);
        st = mtp ? model_plan_mtp(hm, m, &dm, err) : model_plan(dhm, o.engine.use_mmap > 0, &dm, err);
        if (st || (st = engine_plan_host(dm, &dop, room > target ? room - target : room ? 1 : 0, &dp, err))) {
            if (mtp)
                err_prefix(err, "--speculate mtp");
            else
                err_prefix(err, "--draft-model %s", dhm->entry.path);
            model_free(dm);
            model_free(m);
            return st;
        }
    }
    fit_base b = fit_base_now(hm, p.n_threads, o.engine.use_mmap > 0);
    size_t grammar_tables, grammar_temporary; /* after fit_base_now: the layout it allocates is freed */
    b.grammar = fit_grammar(hm, m, &grammar_tables, &grammar_temporary);
    long long avail = hearth_proc_kb_field("/proc/meminfo", "MemAvailable");
    size_t peak = fit_peak(&b, &p), available = avail > 0 ? (size_t)avail : 0, alone = peak;
    if (dhm) { /* the target's load, or the target running while the draft loads, or both running */
        size_t run_t = engine_plan_bytes(&p) + b.thread_stacks + b.grammar;
        size_t run_d = engine_plan_bytes(&dp) + b.thread_stacks, load_d = dp.weights_load_peak;
        if (o.engine.use_mmap <= 0 && !mtp) model_drop_file_pages(dhm);
        if (b.keeps_file && !mtp) {
            peak = b.resident_now + b.code_pages + b.file_pages + file_pages_to_come(dhm) + run_t + run_d;
        } else {
            size_t after = run_t + (load_d > run_d ? load_d : run_d);
            peak = b.resident_now + b.code_pages + (p.weights_load_peak > after ? p.weights_load_peak : after);
        }
    }
    const char *bw_source;
    char recorded[128];
    double bw = fit_bandwidth(&o, p.n_threads, &bw_source, recorded, sizeof recorded, err, &st);
    if (st) {
        model_free(m);
        return st;
    }
    double full = engine_decode_bytes(m, p.context, o.engine.kv_quant),
           empty = engine_decode_bytes(m, 1, o.engine.kv_quant);
    json_t *r = json_object();
    json_object_set_new(r, "model", json_string(hm->entry.path));
    json_object_set_new(r, "context_length", json_integer(p.context));
    json_object_set_new(r, "context_source", json_string(fit_context_source(&o.engine, &p)));
    json_object_set_new(r, "max_sequences", json_integer(p.max_seqs));
    json_object_set_new(r, "threads", json_integer(p.n_threads));
    json_object_set_new(r, "step_tokens", json_integer(p.step_tokens));
    json_object_set_new(r, "weights_bytes", JSON_SIZE(p.weights));
    json_object_set_new(r, "weights_load_peak_bytes", JSON_SIZE(p.weights_load_peak));
    json_object_set_new(r, "kv_pool_bytes", JSON_SIZE(p.kv));
    json_object_set_new(r, "kv_blocks", json_integer(p.n_blocks));
    json_object_set_new(r, "kv_blocks_cut_from", json_integer(p.kv_cut_from));
    json_object_set_new(r, "kv_quant", json_string(hearth_kv_quant_name(o.engine.kv_quant)));
    json_object_set_new(r, "scratch_bytes", JSON_SIZE(p.scratch));
    json_object_set_new(r, "buffers_bytes", JSON_SIZE(p.buffers + p.sampler));
    json_object_set_new(r, "engine_bytes", JSON_SIZE(engine_plan_bytes(&p)));
    json_object_set_new(r, "grammar_bytes", JSON_SIZE(b.grammar));
    json_object_set_new(r, "grammar", fit_grammar_json(grammar_tables, grammar_temporary));
    json_object_set_new(r, "runtime_overhead_bytes", JSON_SIZE(fit_peak(&b, &p) - engine_plan_bytes(&p) - b.grammar));
    if (dhm) { /* draft_bytes / mtp_bytes: what the draft or head adds to the peak (the parts still sum to it) */
        json_object_set_new(r, mtp ? "mtp_bytes" : "draft_bytes", JSON_SIZE(peak - alone));
        json_object_set_new(r, mtp ? "mtp" : "draft",
                            json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:i}", "model", dhm->entry.path, "weights_bytes",
                                      (json_int_t)dp.weights, "kv_pool_bytes", (json_int_t)dp.kv, "scratch_bytes",
                                      (json_int_t)dp.scratch, "buffers_bytes", (json_int_t)(dp.buffers + dp.sampler),
                                      "engine_bytes", (json_int_t)engine_plan_bytes(&dp), "kv_blocks", dp.n_blocks));
    }
    json_object_set_new(r, "runtime_overhead",
                        json_pack("{s:I, s:I, s:I, s:I}", "process_resident_bytes", (json_int_t)b.resident_now,
                                  "model_file_pages_bytes", (json_int_t)b.file_pages, "thread_stacks_bytes",
                                  (json_int_t)b.thread_stacks, "code_pages_bytes", (json_int_t)b.code_pages));
    json_object_set_new(r, "predicted_peak_bytes", JSON_SIZE(peak));
    /* the KV storage is reserved, not touched (kv_cache.c): at start the process holds the
     * rest; the peak is reached once every block has been written */
    engine_plan untouched = p;
    untouched.kv -= model_kv_storage_bytes(&m->cfg, p.n_blocks, o.engine.kv_quant);
    fit_base at_start = b;
    at_start.grammar = 0; /* built at the first constrained request */
    json_object_set_new(r, "predicted_start_bytes", JSON_SIZE(fit_peak(&at_start, &untouched)));
    json_object_set_new(r, "kv_pool_counted_as",
                        json_string("reserved: predicted_peak_bytes holds the whole pool resident (every block "
                                    "written); at start-up it is untouched (predicted_start_bytes) and grows as "
                                    "requests fill blocks"));
    json_object_set_new(r, "available_bytes", JSON_SIZE(available));
    json_object_set_new(r, "fits", json_boolean(peak - b.resident_now <= available));
    json_object_set_new(r, "model_max_context", json_integer(m->cfg.context_length));
    json_object_set_new(r, "max_context_that_fits",
                        json_integer(fit_largest_context(m, &o.engine, fits_host, &(host_room){&b, available, room})));
    json_object_set_new(r, "bandwidth_gbs", json_real(bw));
    json_object_set_new(r, "bandwidth_source", json_string(bw_source));
    json_object_set_new(r, "decode_bytes_per_token", json_real(full));
    json_object_set_new(r, "decode_tok_s", json_real(bw * 1e9 / full));
    json_object_set_new(r, "decode_tok_s_empty_cache", json_real(bw * 1e9 / empty));
    model_free(dm);
    model_free(m);
    *report_json = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(r);
    return *report_json ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "fit: out of memory");
}
