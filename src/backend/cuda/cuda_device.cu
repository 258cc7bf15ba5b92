/* cuda_device.cu: device discovery, device buffers and the one-time upload of weights
 * into their device layout (see cuda_weight in cuda_backend.h). Run time only: a machine
 * without a driver or GPU gets a "no CUDA device" status, never a crash. No kernels here. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cpu/matmul.h"
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" error for later calls */
        return 0;
    }
    return n;
}

hearth_status cuda_device_open(int index, cuda_device_info *info, hearth_error *err) {
    int n = cuda_device_count();
    if (n == 0) return err_set(err, HEARTH_ERR_UNSUPPORTED, "no CUDA device: cudaGetDeviceCount found none");
    if (index < 0 || index >= n)
        return err_set(err, HEARTH_ERR_INVALID, "cuda: device %d does not exist (%d found)", index, n);
    if (cuda_status(cudaSetDevice(index), "cudaSetDevice", err)) return HEARTH_ERR_IO;
    cudaDeviceProp p;
    if (cuda_status(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties", err)) return HEARTH_ERR_IO;
    if (info) {
        memset(info, 0, sizeof *info);
        info->index = index;
        snprintf(info->name, sizeof info->name, "%s", p.name);
        info->cc_major = p.major;
        info->cc_minor = p.minor;
        info->n_sms = p.multiProcessorCount;
        info->l2_bytes = p.l2CacheSize;
        info->total_mem = p.totalGlobalMem;
    }
    return HEARTH_OK;
}

hearth_status cuda_alloc(void **dev, size_t bytes, const char *what, hearth_error *err) {
    *dev = NULL;
    cudaError_t e = cudaMalloc(dev, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *dev = NULL;
        cudaGetLastError();
        return err_set(err, e == cudaErrorMemoryAllocation ? HEARTH_ERR_NOMEM : HEARTH_ERR_IO,
                       "cuda: allocating %zu bytes for %s: %s", bytes, what, cudaGetErrorString(e));
    }
    return HEARTH_OK;
}

void cuda_free(void *dev) {
    if (dev) cudaFree(dev);
}

hearth_status cuda_upload(void *dev, const void *host, size_t bytes, hearth_error *err) {
    return cuda_status(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "upload", err);
}

hearth_status cuda_download(void *host, const void *dev, size_t bytes, hearth_error *err) {
    return cuda_status(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "download", err);
}

hearth_status cuda_sync(hearth_error *err) {
    return cuda_status(cudaDeviceSynchronize(), "kernel execution", err);
}

int cuda_weight_supported(const cpu_weight *w) {
    if (!w || w->n <= 0 || w->k <= 0) return 0;
    switch (w->dtype) {
    case DT_F16:
    case DT_BF16: return 1;
    case DT_Q8_0: return w->k % 32 == 0;
    case DT_Q4_K: return w->k % 256 == 0;
    default: return 0;
    }
}

/* Q8_0 blocks are 34 bytes (f16 scale + 32 int8); split them into the two planes. */
static hearth_status upload_q8_0(cuda_weight *dw, const cpu_weight *w, const char *what, hearth_error *err) {
    size_t nq = (size_t)w->n * (size_t)w->k, nb = nq / 32;
    int8_t *q = (int8_t *)malloc(nq);
    uint16_t *d = (uint16_t *)malloc(nb * 2);
    hearth_status s = HEARTH_OK;
    if (!q || !d) s = err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory to repack Q8_0", what);
    if (!s) {
        const uint8_t *src = (const uint8_t *)w->data;
        for (size_t b = 0; b < nb; b++) {
            memcpy(&d[b], src + b * 34, 2);
            memcpy(q + b * 32, src + b * 34 + 2, 32);
        }
        s = cuda_alloc(&dw->data, nq, what, err);
    }
    if (!s) s = cuda_alloc(&dw->scales, nb * 2, what, err);
    if (!s) s = cuda_upload(dw->data, q, nq, err);
    if (!s) s = cuda_upload(dw->scales, d, nb * 2, err);
    dw->bytes = nq + nb * 2;
    free(q);
    free(d);
    return s;
}

hearth_status cuda_weight_upload(cuda_weight *dw, const cpu_weight *w, const char *what, hearth_error *err) {
    memset(dw, 0, sizeof *dw);
    if (!cuda_weight_supported(w))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: %s: weight format %s [%lld, %lld] has no CUDA kernel yet",
                       what, w ? tensor_dtype_name(w->dtype) : "?", w ? (long long)w->n : 0LL,
                       w ? (long long)w->k : 0LL);
    dw->dtype = w->dtype;
    dw->n = w->n;
    dw->k = w->k;
    hearth_status s;
    if (w->dtype == DT_Q8_0) {
        s = upload_q8_0(dw, w, what, err);
    } else {
        size_t bytes = w->dtype == DT_Q4_K ? (size_t)w->n * (size_t)(w->k / 256) * 144
                                           : (size_t)w->n * (size_t)w->k * 2;
        dw->bytes = bytes;
        s = cuda_alloc(&dw->data, bytes, what, err);
        if (!s) s = cuda_upload(dw->data, w->data, bytes, err);
    }
    if (s) cuda_weight_free(dw);
    return s;
}

void cuda_weight_free(cuda_weight *dw) {
    cuda_free(dw->data);
    cuda_free(dw->scales);
    memset(dw, 0, sizeof *dw);
}
