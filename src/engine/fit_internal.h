/* fit_internal.h: what fit.c (the host report) and fit_cuda.c (the device report) share.
 * Internal to src/engine. */
#ifndef HEARTH_ENGINE_FIT_INTERNAL_H
#define HEARTH_ENGINE_FIT_INTERNAL_H
#include "engine/engine_plan.h"
#include "hearth.h"

/* A "Key:   123 kB" field of a /proc file in bytes (e.g. "/proc/meminfo", "MemTotal"), -1
 * when absent or unreadable. Internal: consumers read hearth_process_memory_get. */
long long hearth_proc_kb_field(const char *path, const char *key);
struct model;
/* The process's predicted resident high-water mark once an engine of plan p for model m
 * exists: what it holds now, the model file pages loading maps, worker stacks, code pages,
 * the plan, and constrained decoding's grammar tables (*grammar_tables, built at the first
 * constrained request) with what their build holds besides (*grammar_temporary). */
size_t fit_host_peak(const hearth_model *hm, const struct model *m, const engine_plan *p, int use_mmap,
                     size_t *grammar_tables, size_t *grammar_temporary);
/* What this process holds besides the weights it is about to load (without --mmap): its
 * resident set now with the model's tensor file pages dropped, hearth's code pages and
 * threads - 1 worker stacks. hearth_train_fit's base. */
size_t fit_process_base(const hearth_model *hm, int threads);
/* Resolves o->engine.device (and o->sku, which implies cuda) to HEARTH_DEVICE_CPU or
 * HEARTH_DEVICE_CUDA: auto is cuda when a GPU is present. */
hearth_status fit_device(const hearth_fit_options *o, int *device, hearth_error *err);
/* The report's "grammar" object: the tables, their build's temporaries, when they are built. */
struct json_t;
struct json_t *fit_grammar_json(size_t tables, size_t temporary);
/* The largest context (at most the model's) for which fits(m, options with that context,
 * arg) holds, by bisection (the footprint grows with the context); 0 when none does. */
int fit_largest_context(const struct model *m, const hearth_engine_options *eo,
                        int (*fits)(const struct model *, const hearth_engine_options *, const void *),
                        const void *arg);
/* Where the plan's context came from, for the report: "given", "the model's own" or
 * "the largest that fits (below the model's own)". */
const char *fit_context_source(const hearth_engine_options *o, const engine_plan *p);
/* hearth_fit for --device cuda (fit_cuda.c). */
hearth_status fit_cuda(hearth_model *hm, const hearth_fit_options *o, char **report_json, hearth_error *err);
#endif
