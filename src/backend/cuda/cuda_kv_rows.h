/* cuda_kv_rows.h: a sequence's rows of the device KV pool to and from host memory, in the
 * host pool's form (saved KV files). Host-side entry points; never inside a step. */
#ifndef HEARTH_BACKEND_CUDA_KV_ROWS_H
#define HEARTH_BACKEND_CUDA_KV_ROWS_H
#include "backend/cuda/cuda_backend.h"

/* Pinned host memory mapped into the device's address space, which the copy kernel reads
 * and writes directly (no device buffer: the pool and scratch hold all device memory). Owned
 * by the caller (a cuda_model), grown on demand, freed by cuda_rows_stage_free. */
typedef struct cuda_rows_stage {
    void *host, *dev; /* the same memory: the host's pointer and the device's */
    size_t bytes;
} cuda_rows_stage;
void cuda_rows_stage_free(cuda_rows_stage *s);

/* Positions [0, n) of slot's (layer, KV head) rows, through the host block tables `tables`
 * (kv_cache.tables), to the host (to_host) or from it: keys and values [n][head_dim of the
 * layer] in the pool's element type, and for int8 / fp8 their scales [n] (else NULL):
 * kv_slot_rows_read / write for the device pool. One kernel launch through `stage`; done
 * when it returns. */
hearth_status cuda_kv_rows(const cuda_kv *dkv, cuda_rows_stage *stage, const int32_t *tables, int layer, int slot,
                           int head, int n, void *keys, void *values, float *k_scale, float *v_scale, int to_host,
                           hearth_error *err);
#endif
