/* cuda_backend.h: the C-callable CUDA backend: device discovery, device buffers, weights
 * uploaded once in a device layout, and the decode kernels (GEMV per weight format,
 * rmsnorm, rope, activations, paged decode attention) mirroring the CPU ops. Only built
 * when nvcc is present (HEARTH_HAVE_CUDA); never allocates per step, never exits. */
#ifndef HEARTH_BACKEND_CUDA_BACKEND_H
#define HEARTH_BACKEND_CUDA_BACKEND_H
#include "hearth.h"
#include "io/tensor.h"
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpu_weight cpu_weight;
typedef struct kv_cache kv_cache;

typedef struct cuda_device_info {
    int index;
    char name[256];
    int cc_major, cc_minor;
    int n_sms;
    int l2_bytes;
    size_t total_mem;
} cuda_device_info;

/* Number of usable devices; 0 when there is no driver or no GPU (never fails). */
int cuda_device_count(void);
/* Selects device `index` and fills info. Fails with HEARTH_ERR_UNSUPPORTED and a message
 * starting "no CUDA device" when there is none. */
hearth_status cuda_device_open(int index, cuda_device_info *info, hearth_error *err);

/* Device memory: plain cudaMalloc (no managed memory). `what` names the buffer in errors. */
hearth_status cuda_alloc(void **dev, size_t bytes, const char *what, hearth_error *err);
void cuda_free(void *dev);
hearth_status cuda_upload(void *dev, const void *host, size_t bytes, hearth_error *err);
hearth_status cuda_download(void *host, const void *dev, size_t bytes, hearth_error *err);
/* Waits for all queued kernels; reports any asynchronous kernel fault. */
hearth_status cuda_sync(hearth_error *err);

/* A weight matrix resident on the device. F16/BF16 rows are stored as on the host;
 * Q8_0 is split into an int8 plane [n][k] and an f16 scale plane [n][k/32] so every
 * quant load is a 16-byte aligned vector (the GGUF 34-byte block defeats that); Q4_K
 * keeps its 144-byte super-blocks, which are already 16-byte aligned. */
typedef struct cuda_weight {
    tensor_dtype dtype;
    int64_t n, k;
    void *data;   /* rows (F16/BF16/Q4_K) or int8 quants (Q8_0) */
    void *scales; /* Q8_0 only: f16 scales */
    size_t bytes; /* device bytes read by one GEMV (data + scales) */
} cuda_weight;

/* Whether the GEMV kernels handle this host weight (F16, BF16, Q8_0, Q4_K for now). */
int cuda_weight_supported(const cpu_weight *w);
/* Uploads a host weight (any pointer alignment) once; fails for unsupported formats. */
hearth_status cuda_weight_upload(cuda_weight *dw, const cpu_weight *w, const char *what, hearth_error *err);
void cuda_weight_free(cuda_weight *dw);

/* y[T, n] = x[T, k] · W^T, all pointers device memory, float32 activations. Meant for
 * decode (T small); any T works, in chunks of 8 rows. Launches on the default stream. */
hearth_status cuda_gemv(const cuda_weight *w, const float *x, int T, float *y, hearth_error *err);

/* Element-wise ops: same semantics as ops.h, device pointers. */
hearth_status cuda_rmsnorm(float *out, const float *x, const float *w, float shift, int T, int n, float eps,
                           hearth_error *err);
hearth_status cuda_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                        int adjacent, hearth_error *err);
hearth_status cuda_silu_mul(float *gate, const float *up, size_t n, hearth_error *err);
hearth_status cuda_gelu_tanh_mul(float *gate, const float *up, size_t n, hearth_error *err);

/* Device copy of the paged KV pool: same block layout and tables as kv_cache. */
typedef struct cuda_kv {
    int n_layers, n_kv_heads, head_dim;
    int n_blocks, max_slots, max_blocks_per_slot;
    float *k, *v;
    int32_t *tables;
} cuda_kv;
/* Allocates the device pool for kv's sizes and copies keys, values and tables. */
hearth_status cuda_kv_upload(cuda_kv *dkv, const kv_cache *kv, hearth_error *err);
void cuda_kv_free(cuda_kv *dkv);

/* Decode attention over the device pool: ops_attention's contract (causal, window,
 * grouped KV heads), q/out/pos/slot in device memory. head_dim <= 256. */
typedef struct cuda_attention_args {
    const cuda_kv *kv;
    int layer;
    const float *q;
    float *out;
    int T, n_heads, n_kv_heads, head_dim;
    const int32_t *pos, *slot;
    int window;
    float scale;
} cuda_attention_args;
hearth_status cuda_attention(const cuda_attention_args *a, hearth_error *err);

#ifdef __cplusplus
}
#endif
#endif
