/* engine_device.h: the engine's choice of device and its GPU model (engine_device.c).
 * Internal to src/engine. */
#ifndef HEARTH_ENGINE_DEVICE_H
#define HEARTH_ENGINE_DEVICE_H
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_sample.h"

/* Resolves device (hearth_device): opens the CUDA backend of the op table for model om into
 * *gpu (cuda_exact, expert_offload: hearth_engine_options), or leaves *gpu NULL when the CPU runs
 * the model. tp: the engine's host threads,
 * which the GPU steps use for their host work (embedding rows). */
hearth_status engine_device_open(const op_model *om, const kv_cache *kv, int device, int cuda_exact, int expert_offload,
                                 int max_tokens, int max_out, threadpool *tp, op_backend **gpu, hearth_error *err);
/* --expert-offload N (hearth_engine_options.expert_offload) for model om on device: 0 (off),
 * or N >= 3 slots for a model with experts on a device other than the CPU; else an error
 * that says which. */
hearth_status engine_expert_offload_check(const op_model *om, int device, int expert_offload, hearth_error *err);
/* The device sampler (cuda_sample.h), made with the GPU model: rows up to max_out. *smp
 * stays NULL without CUDA. */
hearth_status engine_device_sampler_open(int max_out, int vocab, cuda_sampler **smp, hearth_error *err);
void engine_device_sampler_close(cuda_sampler *smp);
/* Whether the device sampler takes p (cuda_sample_supported); 0 without CUDA. */
int engine_device_sample_supported(const hearth_sampling *p);
/* After a step whose logits stayed on the device (OP_OUT_KEEP): each row's token sampled
 * there (req[i] for row i); only the ids (and the requested logprobs, into req[i].lp) come
 * back. */
hearth_status engine_device_sample(op_backend *gpu, cuda_sampler *smp, int n_out, const cuda_sample_req *req,
                                   int32_t *ids, hearth_error *err);
/* Device bytes of the KV storage of n_blocks blocks (cuda_kv_bytes) when the engine may run
 * on the GPU (device cuda, or auto with a CUDA device present); 0 otherwise. */
size_t engine_device_kv_bytes(int n_layers, int n_kv_heads, int head_dim, int n_blocks, int quant, int device);
struct engine_plan;
/* Device bytes cuda_model_create allocates for the engine of plan p (cuda_plan_make with the
 * pool's shape, as `hearth fit --device cuda` sizes it; weights + KV + scratch, without the
 * runtime). Computable in any build: it allocates nothing. */
size_t engine_device_plan_bytes(const op_model *om, const struct engine_plan *p, int kv_quant, int cuda_exact,
                                int expert_offload);
/* The GPU's copy bandwidth (GB/s, read + write; cuda_copy_bandwidth_gbs), 0 without CUDA. */
double engine_device_bandwidth_gbs(void);
void engine_device_close(op_backend *gpu);
/* The local GPU (device 0): name, compute capability, total and free memory, as
 * cudaMemGetInfo sees them (creating this process's context). 0 when there is none (or
 * no CUDA backend), 1 when filled. */
typedef struct engine_gpu_info {
    char name[256];
    int cc_major, cc_minor;
    size_t total_bytes, free_bytes;
} engine_gpu_info;
int engine_device_query(engine_gpu_info *info);
/* Device bytes in use now (cudaMemGetInfo total - free: every process on the GPU); 0 without one. */
size_t engine_device_used_bytes(void);
#endif
