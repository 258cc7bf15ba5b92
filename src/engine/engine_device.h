/* engine_device.h: the engine's choice of device and its GPU model (engine_device.c).
 * Internal to src/engine. */
#ifndef HEARTH_ENGINE_DEVICE_H
#define HEARTH_ENGINE_DEVICE_H
#include "backend/cuda/cuda_model.h"

/* Resolves device (hearth_device); *gpu stays NULL when the CPU runs the model. */
hearth_status engine_device_open(const model *m, const kv_cache *kv, int device, int max_tokens, int max_out,
                                 cuda_model **gpu, hearth_error *err);
hearth_status engine_device_forward(cuda_model *gpu, const kv_cache *kv, const model_batch *b, hearth_error *err);
/* The step with the greedy id of each logits row chosen on the device (cuda_model_forward_ids). */
hearth_status engine_device_forward_ids(cuda_model *gpu, const kv_cache *kv, const model_batch *b, int32_t *ids,
                                        hearth_error *err);
/* Device bytes of the KV storage of n_blocks blocks (cuda_kv_bytes) when the engine may run
 * on the GPU (device cuda, or auto with a CUDA device present); 0 otherwise. */
size_t engine_device_kv_bytes(int n_layers, int n_kv_heads, int head_dim, int n_blocks, int quant, int device);
/* The GPU's copy bandwidth (GB/s, read + write; cuda_copy_bandwidth_gbs), 0 without CUDA. */
double engine_device_bandwidth_gbs(void);
void engine_device_close(cuda_model *gpu);
#endif
