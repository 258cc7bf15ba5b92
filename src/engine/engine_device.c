/* engine_device.c: where the engine's forward pass runs (--device cpu|cuda|auto): picks
 * the device, opens the CUDA backend of the op table when it is the GPU, and says so in
 * one line on stderr. Builds without CUDA too (then only the CPU exists). Must not contain
 * forward-pass logic: that is model/, the same on every backend. */
#include "engine/engine_device.h"
#include "backend/cuda/cuda_plan.h"
#include "base/err.h"
#include "engine/engine_plan.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef HEARTH_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include <cuda_runtime_api.h>
#endif

int hearth_device_parse(const char *name, int *out) {
    static const char *names[] = {"cpu", "cuda", "auto"};
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, names[i])) return (*out = i), 1;
    return 0;
}

/* --expert-offload N: a device pool of N >= 3 slots (an expert's gate, up and down at once),
 * for a model with experts. */
hearth_status engine_expert_offload_check(const op_model *om, int device, int expert_offload, hearth_error *err) {
    if (!expert_offload) return HEARTH_OK;
    if (expert_offload < 3)
        return err_set(err, HEARTH_ERR_INVALID,
                       "--expert-offload takes the number of device slots for expert weights, at least 3 (got %d)",
                       expert_offload);
    if (om->dims.n_experts <= 0)
        return err_set(err, HEARTH_ERR_INVALID,
                       "--expert-offload: this model has no experts (it is for mixture-of-experts models)");
    if (device == HEARTH_DEVICE_CPU)
        return err_set(err, HEARTH_ERR_INVALID,
                       "--expert-offload needs --device cuda (on the CPU the experts are in host memory already)");
    return HEARTH_OK;
}

hearth_status engine_device_open(const op_model *om, const kv_cache *kv, int device, int cuda_exact, int expert_offload,
                                 int max_tokens, int max_out, threadpool *tp, op_backend **gpu, hearth_error *err) {
    *gpu = NULL;
    hearth_status st0 = engine_expert_offload_check(om, device, expert_offload, err);
    if (st0) return st0;
    if (device == HEARTH_DEVICE_CPU) return HEARTH_OK;
    if (device != HEARTH_DEVICE_CUDA && device != HEARTH_DEVICE_AUTO)
        return err_set(err, HEARTH_ERR_INVALID, "engine: unknown device %d (--device takes cpu, cuda or auto)", device);
#ifndef HEARTH_HAVE_CUDA
    (void)om, (void)kv, (void)cuda_exact, (void)max_tokens, (void)max_out, (void)tp;
    if (device == HEARTH_DEVICE_CUDA || expert_offload)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "--device cuda: this hearth was built without the CUDA backend "
                       "(no nvcc at build time); use --device cpu");
    fprintf(stderr, "hearth: device auto: cpu (built without the CUDA backend)\n");
    return HEARTH_OK;
#else
    if (device == HEARTH_DEVICE_AUTO && cuda_device_count() == 0) {
        if (expert_offload)
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "--expert-offload needs a CUDA device (--device auto found none)");
        fprintf(stderr, "hearth: device auto: cpu (no CUDA device found)\n");
        return HEARTH_OK;
    }
    char note[384] = ""; /* the start note: device, memory, graphs, expansions, expert offload */
    hearth_error e2 = {0};
    hearth_status st =
        cuda_model_create(om, kv, max_tokens, max_out, cuda_exact, expert_offload, tp, gpu, note, sizeof note, &e2);
    if (st && device == HEARTH_DEVICE_AUTO && !expert_offload) { /* offload asked for the GPU: its failure is the answer */
        fprintf(stderr, "hearth: device auto: cpu (the GPU path failed: %s)\n", e2.message);
        return HEARTH_OK;
    }
    if (st) {
        if (err) *err = e2;
        return st;
    }
    fprintf(stderr, "hearth: %s\n", note);
    return HEARTH_OK;
#endif
}

hearth_status engine_device_sampler_open(int max_out, int vocab, cuda_sampler **smp, hearth_error *err) {
    *smp = NULL;
#ifdef HEARTH_HAVE_CUDA
    return cuda_sampler_create(max_out, vocab, smp, err);
#else
    (void)max_out, (void)vocab, (void)err;
    return HEARTH_OK;
#endif
}

void engine_device_sampler_close(cuda_sampler *smp) {
#ifdef HEARTH_HAVE_CUDA
    cuda_sampler_free(smp);
#else
    (void)smp;
#endif
}

int engine_device_sample_supported(const hearth_sampling *p) {
#ifdef HEARTH_HAVE_CUDA
    return cuda_sample_supported(p);
#else
    (void)p;
    return 0;
#endif
}

hearth_status engine_device_sample(op_backend *gpu, cuda_sampler *smp, int n_out, const cuda_sample_req *req,
                                   int32_t *ids, hearth_error *err) {
#ifdef HEARTH_HAVE_CUDA
    static int said; /* one line per process: says which sampler runs (and tests see it ran) */
    if (!said) {
        said = 1;
        fprintf(stderr, "hearth: tokens sampled on the device (%d rows)\n", n_out);
    }
    return cuda_sampler_run(smp, cuda_model_device_logits(gpu), n_out, req, ids, err);
#else
    (void)gpu, (void)smp, (void)n_out, (void)req, (void)ids;
    return err_set(err, HEARTH_ERR_UNSUPPORTED, "built without the CUDA backend");
#endif
}

size_t engine_device_kv_bytes(int n_layers, int n_kv_heads, int head_dim, int n_blocks, int quant, int device) {
#ifdef HEARTH_HAVE_CUDA
    if (device == HEARTH_DEVICE_CUDA || (device == HEARTH_DEVICE_AUTO && cuda_device_count() > 0))
        return cuda_kv_bytes(n_layers, n_kv_heads, head_dim, n_blocks, quant);
#endif
    (void)n_layers, (void)n_kv_heads, (void)head_dim, (void)n_blocks, (void)quant, (void)device;
    return 0;
}

double engine_device_bandwidth_gbs(void) {
#ifdef HEARTH_HAVE_CUDA
    return cuda_copy_bandwidth_gbs((size_t)1 << 30, 10);
#else
    return 0.0;
#endif
}

void engine_device_close(op_backend *gpu) {
    if (gpu) gpu->t->free(gpu);
}

size_t engine_device_plan_bytes(const op_model *om, const engine_plan *p, int kv_quant, int cuda_exact,
                                int expert_offload) {
    const op_dims *c = &om->dims;
    kv_cache shape = {.n_layers = c->n_layers - c->n_state_layers, /* attention layers only */
                      .n_kv_heads = c->n_kv_heads,
                      .head_dim = c->head_dim,
                      .n_blocks = p->n_blocks,
                      .max_slots = p->max_seqs,
                      .max_blocks_per_slot = (p->context + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE};
    if (om->kv_heads) { /* layers of their own shape, shared-KV layers storing none (Gemma 4) */
        shape.n_layers = om->n_kv_layers;
        shape.layer_heads = (int *)om->kv_heads; /* read only: the plan's arithmetic */
        shape.layer_dims = (int *)om->kv_dims;
    }
    cuda_plan d;
    cuda_plan_make(om, &shape, p->step_tokens, p->max_out, cuda_kv_device_dtype(kv_quant), cuda_exact, expert_offload, &d);
    return cuda_plan_bytes(&d);
}

int engine_device_query(engine_gpu_info *info) {
    memset(info, 0, sizeof *info);
#ifdef HEARTH_HAVE_CUDA
    cuda_device_info d;
    hearth_error ignore = {0};
    if (cuda_device_count() == 0 || cuda_device_open(0, &d, &ignore)) return 0;
    snprintf(info->name, sizeof info->name, "%s", d.name);
    info->cc_major = d.cc_major;
    info->cc_minor = d.cc_minor;
    if (cudaMemGetInfo(&info->free_bytes, &info->total_bytes) != cudaSuccess) {
        cudaGetLastError();
        info->total_bytes = d.total_mem;
    }
    return 1;
#else
    return 0;
#endif
}

size_t engine_device_used_bytes(void) {
#ifdef HEARTH_HAVE_CUDA
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return total - free_b;
#else
    return 0;
#endif
}

size_t hearth_device_peak_bytes(void) {
    static size_t peak; /* a high-water mark across HTTP threads: an atomic max */
    size_t now = engine_device_used_bytes(), seen = __atomic_load_n(&peak, __ATOMIC_RELAXED);
    while (now > seen && !__atomic_compare_exchange_n(&peak, &seen, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return now > seen ? now : seen;
}
