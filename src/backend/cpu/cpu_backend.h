/* cpu_backend.h: the CPU backend: the op table (ops/ops.h) run on the host's cores with
 * the kernels of matmul.h and cpu_ops.h, over the host KV pool, with scratch sized once for
 * the largest step. */
#ifndef HEARTH_BACKEND_CPU_BACKEND_H
#define HEARTH_BACKEND_CPU_BACKEND_H
#include "ops/ops.h"

/* A CPU backend for steps of up to max_tokens tokens and max_out logits rows of model om
 * over pools shaped like kv, on thread pool tp (NULL: the calling thread; n_threads sizes
 * the attention scratch). Scratch is allocated and touched now. */
hearth_status cpu_backend_create(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int n_threads,
                                 threadpool *tp, op_backend **out, hearth_error *err);
/* Grows the matmul scratch of a CPU backend to what weight w needs for its steps: for a
 * weight put in place after the backend was made (model_set_weight), whose format may
 * quantize the activations where the model's own weights did not. */
hearth_status cpu_backend_fit_weight(op_backend *be, const op_weight *w, hearth_error *err);
/* Bytes cpu_backend_create allocates (for fit). */
size_t cpu_backend_bytes(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int n_threads);
#endif
