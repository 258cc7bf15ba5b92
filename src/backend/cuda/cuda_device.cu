/* cuda_device.cu: device discovery, device buffers and the one-time upload of weights
 * into their device layout (see cuda_weight in cuda_backend.h). Run time only: a machine
 * without a driver or GPU gets a "no CUDA device" status, never a crash. No kernels here. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_affine.h"
#include "backend/cuda/cuda_plan.h"
#include "base/half.h"
#include "base/threadpool.h"
#include "ops/op_weight.h"
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

cudaStream_t cuda_stream(void) {
    /* Created on first use, after cuda_device_open selected the device; the engine thread
     * is the only caller while serving. Blocking (default flags) so the legacy stream's
     * cudaMemcpy/cudaMemset order with it. */
    static cudaStream_t stream;
    static int made;
    if (!made) {
        if (cudaStreamCreate(&stream) != cudaSuccess) {
            cudaGetLastError();
            stream = 0; /* falls back to the legacy stream: correct, only graphs fail */
        }
        made = 1;
    }
    return stream;
}

hearth_status cuda_upload_async(void *dev, const void *host, size_t bytes, hearth_error *err) {
    return cuda_status(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cuda_stream()), "upload", err);
}

hearth_status cuda_download_async(void *host, const void *dev, size_t bytes, hearth_error *err) {
    return cuda_status(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, cuda_stream()), "download", err);
}

hearth_status cuda_copy_rows_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                                size_t rows, hearth_error *err) {
    return cuda_status(
        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, cuda_stream()),
        "row copy", err);
}

hearth_status cuda_stream_sync(hearth_error *err) {
    return cuda_status(cudaStreamSynchronize(cuda_stream()), "kernel execution", err);
}

struct cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

hearth_status cuda_capture_begin(hearth_error *err) {
    if (!cuda_stream())
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: no stream of its own: cannot capture a graph");
    return cuda_status(cudaStreamBeginCapture(cuda_stream(), cudaStreamCaptureModeThreadLocal), "begin capture",
                       err);
}

hearth_status cuda_capture_end(int keep, cuda_graph **out, hearth_error *err) {
    *out = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cuda_stream(), &graph);
    if (e != cudaSuccess || !keep) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        return keep ? cuda_status(e, "end capture", err) : HEARTH_OK;
    }
    cuda_graph *g = (cuda_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphDestroy(graph);
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: out of memory for a graph");
    }
    g->graph = graph;
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(graph);
        free(g);
        return cuda_status(e, "graph instantiate", err);
    }
    *out = g;
    return HEARTH_OK;
}

hearth_status cuda_graph_launch(cuda_graph *g, hearth_error *err) {
    return cuda_status(cudaGraphLaunch(g->exec, cuda_stream()), "graph launch", err);
}

void cuda_graph_free(cuda_graph *g) {
    if (!g) return;
    cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
    free(g);
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

int cuda_weight_supported(const op_weight *w) {
    /* the format check is the plan's (cuda_plan.c); MLX also needs its scale/bias data */
    return cuda_weight_format_native(w) && (w->dtype != DT_U32 || (w->scales && w->biases));
}

/* The host repacks below run f(lo, hi, thread) over items [0, n) in tasks of `per` items,
 * spread over the engine's threads (tp; NULL or a small weight: this thread alone). A 26B
 * mixture of experts repacks ~8 billion weights at load: one thread took over a minute. */
template <class F> static void for_spans(threadpool *tp, size_t n, size_t per, F &&f) {
    if (n == 0) return;
    if (!tp || tp_threads(tp) < 2 || n <= per) {
        f((size_t)0, n, 0);
        return;
    }
    struct job {
        F *f;
        size_t n, per;
    } j = {&f, n, per};
    tp_run(
        tp, (int)((n + per - 1) / per),
        [](void *c, int task, int thread) {
            job *jb = (job *)c;
            size_t lo = (size_t)task * jb->per, hi = lo + jb->per < jb->n ? lo + jb->per : jb->n;
            (*jb->f)(lo, hi, thread);
        },
        &j);
}

/* Items of about 256 K weights a task (at least one). */
static size_t span_items(size_t weights_per_item) {
    size_t per = ((size_t)1 << 18) / (weights_per_item ? weights_per_item : 1);
    return per ? per : 1;
}

/* Q8_0 blocks are 34 bytes (f16 scale + 32 int8); split them into the two planes. */
static hearth_status upload_q8_0(cuda_weight *dw, const op_weight *w, const char *what, threadpool *tp,
                                 hearth_error *err) {
    size_t nq, scale_bytes; /* the device layout's sizes (cuda_plan.c) */
    cuda_weight_layout(w, &nq, &scale_bytes);
    size_t nb = scale_bytes / 2;
    int8_t *q = (int8_t *)malloc(nq);
    uint16_t *d = (uint16_t *)malloc(nb * 2);
    hearth_status s = HEARTH_OK;
    if (!q || !d) s = err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory to repack Q8_0", what);
    if (!s) {
        const uint8_t *src = (const uint8_t *)w->data;
        for_spans(tp, nb, span_items(32), [&](size_t lo, size_t hi, int) {
            for (size_t b = lo; b < hi; b++) {
                memcpy(&d[b], src + b * 34, 2);
                memcpy(q + b * 32, src + b * 34 + 2, 32);
            }
        });
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

/* Q6_K blocks are 210 bytes (ql[128], qh[64], int8 scales[16], f16 d): split into the
 * four planes of cuda_weight so every quant load is a 16-byte aligned vector. */
static hearth_status upload_q6_k(cuda_weight *dw, const op_weight *w, const char *what, threadpool *tp,
                                 hearth_error *err) {
    size_t nk = (size_t)w->n * (size_t)w->k, nb = nk / 256, data_bytes, scale_bytes;
    cuda_weight_layout(w, &data_bytes, &scale_bytes); /* the device layout's sizes (cuda_plan.c) */
    uint8_t *q = (uint8_t *)malloc(data_bytes), *s8 = (uint8_t *)malloc(scale_bytes);
    hearth_status s = HEARTH_OK;
    if (!q || !s8) s = err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory to repack Q6_K", what);
    if (!s) {
        const uint8_t *src = (const uint8_t *)w->data;
        uint8_t *ql = q, *qh = q + nk / 2, *sc = s8, *d = s8 + nk / 16;
        for_spans(tp, nb, span_items(256), [&](size_t lo, size_t hi, int) {
            for (size_t b = lo; b < hi; b++) {
                const uint8_t *blk = src + b * 210;
                memcpy(ql + b * 128, blk, 128);
                memcpy(qh + b * 64, blk + 128, 64);
                memcpy(sc + b * 16, blk + 192, 16);
                memcpy(d + b * 2, blk + 208, 2);
            }
        });
        s = cuda_alloc(&dw->data, data_bytes, what, err);
    }
    if (!s) s = cuda_alloc(&dw->scales, scale_bytes, what, err);
    if (!s) s = cuda_upload(dw->data, q, data_bytes, err);
    if (!s) s = cuda_upload(dw->scales, s8, scale_bytes, err);
    dw->bytes = data_bytes + scale_bytes;
    free(q);
    free(s8);
    return s;
}

/* MLX 4-bit: the words as they are; each group's scale and bias paired into one word. */
static hearth_status upload_mlx4(cuda_weight *dw, const op_weight *w, const char *what, threadpool *tp,
                                 hearth_error *err) {
    size_t word_bytes, pair_bytes; /* the device layout's sizes (cuda_plan.c) */
    cuda_weight_layout(w, &word_bytes, &pair_bytes);
    size_t words = word_bytes / 4, groups = pair_bytes / 4;
    uint32_t *sb = (uint32_t *)malloc(groups * 4);
    if (!sb) return err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory to pair MLX scales", what);
    for_spans(tp, groups, span_items((size_t)w->group_size), [&](size_t lo, size_t hi, int) {
        for (size_t g = lo; g < hi; g++) { /* any alignment of the host pointers */
            uint16_t s, b;
            memcpy(&s, (const uint8_t *)w->scales + 2 * g, 2);
            memcpy(&b, (const uint8_t *)w->biases + 2 * g, 2);
            sb[g] = (uint32_t)s | (uint32_t)b << 16;
        }
    });
    dw->group_size = w->group_size;
    dw->sb_bf16 = w->sb_dtype == DT_BF16;
    /* the layout its GEMV reads (cuda_mlx4_nibble): chunked only where the int8 GEMV takes
     * the shape, since no float kernel reads that layout */
    dw->mlx_tiled = cuda_mlx4_layout(w->k, (int)w->group_size);
    if (dw->mlx_tiled == 2) cuda_mlx4_prepare();
    dw->bytes = words * 4 + groups * 4;
    uint32_t *tiled = dw->mlx_tiled ? (uint32_t *)calloc(words, 4) : NULL;
    hearth_status s = dw->mlx_tiled && !tiled ? err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory", what)
                                              : HEARTH_OK;
    if (tiled) {
        const uint8_t *src = (const uint8_t *)w->data;
        int64_t row_words = w->k / 8;
        int layout = dw->mlx_tiled;
        for_spans(tp, (size_t)w->n, span_items((size_t)w->k), [&](size_t lo, size_t hi, int) {
            for (int64_t r = (int64_t)lo; r < (int64_t)hi; r++) {
                const uint8_t *in = src + (size_t)(r * row_words) * 4; /* weight c: nibble c % 2 of byte c / 2 */
                if (layout == 2) { /* chunks of 64: byte i = weight i | weight 32 + i << 4 (cuda_mlx4_nibble) */
                    uint8_t *out = (uint8_t *)(tiled + r * row_words);
                    for (int64_t c0 = 0; c0 < w->k; c0 += 64, in += 32, out += 32)
                        for (int i = 0; i < 32; i++) {
                            uint8_t a = (uint8_t)((in[i / 2] >> (4 * (i % 2))) & 0xF);
                            uint8_t b = (uint8_t)((in[16 + i / 2] >> (4 * (i % 2))) & 0xF);
                            out[i] = (uint8_t)(a | b << 4);
                        }
                    continue;
                }
                for (int64_t c = 0; c < w->k; c++) {
                    uint32_t q = (in[c / 2] >> (4 * (c % 2))) & 0xF; /* little-end nibble first */
                    int64_t wi;
                    int shift;
                    cuda_mlx4_nibble(c, layout, &wi, &shift);
                    tiled[r * row_words + wi] |= q << shift;
                }
            }
        });
    }
    if (!s) s = cuda_alloc(&dw->data, words * 4, what, err);
    if (!s) s = cuda_alloc(&dw->scales, groups * 4, what, err);
    if (!s) s = cuda_upload(dw->data, tiled ? (const void *)tiled : w->data, words * 4, err);
    if (!s) s = cuda_upload(dw->scales, sb, groups * 4, err);
    free(tiled);
    free(sb);
    return s;
}

/* GGUF Q4_0 / Q4_1 as MLX affine 4-bit with groups of 32 and f16 (scale, bias): Q4_0's
 * d (q - 8) is d q + (-8 d), Q4_1's d q + m is itself; -8 d is exact in f16 and every product
 * and sum is exact in f32, so the device dequantizes to the same values as the CPU reference,
 * and the MLX kernels (the v3 GEMV, the dequantizer) serve these files too. A block's 16 bytes
 * hold element i in the low nibble of byte i and element 16 + i in its high nibble; MLX wants
 * element j at nibble j % 8 of word j / 8. */
static hearth_status upload_q4_as_mlx4(cuda_weight *dw, const op_weight *w, const char *what, threadpool *tp,
                                       hearth_error *err) {
    int one = w->dtype == DT_Q4_1, bb = one ? 20 : 18;
    size_t nb = (size_t)w->n * (size_t)(w->k / 32);
    uint8_t *words = (uint8_t *)malloc(nb * 16);
    uint16_t *sc = (uint16_t *)malloc(nb * 2), *bi = (uint16_t *)malloc(nb * 2);
    if (!words || !sc || !bi) {
        free(words), free(sc), free(bi);
        return err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory to repack %s", what, tensor_dtype_name(w->dtype));
    }
    const uint8_t *src = (const uint8_t *)w->data;
    size_t bad = SIZE_MAX; /* the first block whose -8 d overflows f16 (|d| > 8188) */
    for_spans(tp, nb, span_items(32), [&](size_t lo, size_t hi, int) {
        for (size_t b = lo; b < hi; b++) {
            const uint8_t *blk = src + b * bb, *qs = blk + (one ? 4 : 2);
            uint16_t d, m;
            memcpy(&d, blk, 2);
            if (one)
                memcpy(&m, blk + 2, 2);
            else
                m = f32_to_f16(-8.0f * f16_to_f32(d));
            if (!one && !(f16_to_f32(m) == -8.0f * f16_to_f32(d))) {
                size_t seen = __atomic_load_n(&bad, __ATOMIC_RELAXED);
                while (b < seen &&
                       !__atomic_compare_exchange_n(&bad, &seen, b, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                }
                return;
            }
            sc[b] = d, bi[b] = m;
            uint8_t *o = words + b * 16;
            for (int i = 0; i < 16; i++) { /* elements 2i, 2i + 1 of the block into byte i */
                int e0 = 2 * i, e1 = 2 * i + 1;
                uint8_t q0 = e0 < 16 ? qs[e0] & 0xF : qs[e0 - 16] >> 4, q1 = e1 < 16 ? qs[e1] & 0xF : qs[e1 - 16] >> 4;
                o[i] = (uint8_t)(q0 | q1 << 4);
            }
        }
    });
    if (bad != SIZE_MAX) {
        uint16_t d;
        memcpy(&d, src + bad * bb, 2);
        free(words), free(sc), free(bi);
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "cuda: %s: Q4_0 block %zu has scale %g, too large for the device layout", what, bad,
                       (double)f16_to_f32(d));
    }
    op_weight m = {.dtype = DT_U32, .data = words, .n = w->n, .k = w->k, .bits = 4, .group_size = 32,
                    .sb_dtype = DT_F16, .scales = sc, .biases = bi};
    hearth_status s = upload_mlx4(dw, &m, what, tp, err);
    dw->dtype = DT_U32;
    free(words), free(sc), free(bi);
    return s;
}

/* The generic affine layout (cuda_affine.h): each row's codes and (scale, bias) pairs from
 * the file's format, packed into the planes on the host, uploaded in one copy each. */
static hearth_status upload_affine(cuda_weight *dw, const op_weight *w, const char *what, threadpool *tp,
                                   hearth_error *err) {
    int bits, group;
    cuda_affine_takes(w, &bits, &group);
    size_t code_bytes, pair_bytes, threads = tp ? (size_t)tp_threads(tp) : 1;
    cuda_weight_layout(w, &code_bytes, &pair_bytes); /* the device layout's sizes (cuda_plan.c) */
    uint8_t *planes = (uint8_t *)malloc(code_bytes), *codes = (uint8_t *)malloc((size_t)w->k * threads);
    float *sb = (float *)malloc(pair_bytes);
    hearth_status s = HEARTH_OK;
    if (!planes || !codes || !sb)
        s = err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory to repack %s", what, tensor_dtype_name(w->dtype));
    int64_t groups = w->k / group;
    if (!s)
        for_spans(tp, (size_t)w->n, span_items((size_t)w->k), [&](size_t lo, size_t hi, int thread) {
            uint8_t *mine = codes + (size_t)thread * (size_t)w->k; /* this thread's row of codes */
            for (int64_t r = (int64_t)lo; r < (int64_t)hi; r++) {
                cuda_affine_row(w, r, bits, group, mine, sb + (size_t)r * (size_t)groups * 2);
                cuda_affine_pack_row(mine, w->n, w->k, bits, r, planes);
            }
        });
    dw->dtype = DT_AFFINE;
    dw->aff_bits = bits;
    dw->aff_from = w->dtype;
    dw->group_size = group;
    dw->bytes = code_bytes + pair_bytes;
    if (!s) s = cuda_alloc(&dw->data, code_bytes, what, err);
    if (!s) s = cuda_alloc(&dw->scales, pair_bytes, what, err);
    if (!s) s = cuda_upload(dw->data, planes, code_bytes, err);
    if (!s) s = cuda_upload(dw->scales, sb, pair_bytes, err);
    free(planes), free(codes), free(sb);
    return s;
}

hearth_status cuda_weight_upload(cuda_weight *dw, const op_weight *w, const char *what, hearth_error *err) {
    return cuda_weight_upload_mt(dw, w, what, NULL, err);
}

hearth_status cuda_weight_upload_mt(cuda_weight *dw, const op_weight *w, const char *what, threadpool *tp,
                                    hearth_error *err) {
    memset(dw, 0, sizeof *dw);
    if (!cuda_weight_supported(w))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda: %s: weight format %s [%lld, %lld] has no CUDA kernel yet",
                       what, w ? tensor_dtype_name(w->dtype) : "?", w ? (long long)w->n : 0LL,
                       w ? (long long)w->k : 0LL);
    dw->dtype = w->dtype;
    dw->n = w->n;
    dw->k = w->k;
    hearth_status s;
    if (cuda_weight_goes_affine(w)) {
        s = upload_affine(dw, w, what, tp, err);
    } else if (w->dtype == DT_Q8_0) {
        s = upload_q8_0(dw, w, what, tp, err);
    } else if (w->dtype == DT_Q6_K) {
        s = upload_q6_k(dw, w, what, tp, err);
    } else if (w->dtype == DT_U32) {
        s = upload_mlx4(dw, w, what, tp, err);
    } else if (w->dtype == DT_Q4_0 || w->dtype == DT_Q4_1) {
        s = upload_q4_as_mlx4(dw, w, what, tp, err);
    } else {
        size_t bytes, no_scales;
        cuda_weight_layout(w, &bytes, &no_scales); /* the device layout's size (cuda_plan.c) */
        dw->bytes = bytes;
        s = cuda_alloc(&dw->data, bytes, what, err);
        if (!s) s = cuda_upload(dw->data, w->data, bytes, err);
        if (!s && w->dtype == DT_Q4_K)
            s = cuda_q4k_pack(dw, err); /* in place, same bytes (the int8 GEMVs and MMQ read the packed order) */
    }
    if (s) cuda_weight_free(dw);
    return s;
}

void cuda_weight_free(cuda_weight *dw) {
    cuda_free(dw->data);
    cuda_free(dw->scales);
    memset(dw, 0, sizeof *dw);
}

/* Rows are dequantized in chunks of 256 columns (op_weight_dequant's limit, a multiple of
 * every GGUF block) or 32 for MLX (one call must stay inside one group), then uploaded. */
hearth_status cuda_weight_upload_any(cuda_weight *dw, const op_weight *w, const char *what, int *expanded,
                                     hearth_error *err) {
    return cuda_weight_upload_any_mt(dw, w, what, expanded, NULL, err);
}

hearth_status cuda_weight_upload_any_mt(cuda_weight *dw, const op_weight *w, const char *what, int *expanded,
                                        threadpool *tp, hearth_error *err) {
    if (expanded) *expanded = 0;
    if (cuda_weight_supported(w)) return cuda_weight_upload_mt(dw, w, what, tp, err);
    memset(dw, 0, sizeof *dw);
    hearth_status s = op_weight_check(w, what, err);
    if (s) return s;
    size_t elems = (size_t)w->n * (size_t)w->k;
    float *host = (float *)malloc(elems * sizeof(float));
    if (!host) return err_set(err, HEARTH_ERR_NOMEM, "cuda: %s: no host memory to expand %s to f32", what,
                              tensor_dtype_name(w->dtype));
    int step = w->dtype == DT_U32 ? 32 : 256;
    for_spans(tp, (size_t)w->n, span_items((size_t)w->k), [&](size_t lo, size_t hi, int) {
        for (int64_t r = (int64_t)lo; r < (int64_t)hi; r++)
            for (int64_t k0 = 0; k0 < w->k; k0 += step) {
                int count = (int)(w->k - k0 < step ? w->k - k0 : step);
                op_weight_dequant(w, r, k0, count, host + (size_t)r * w->k + k0);
            }
    });
    op_weight f = {.dtype = DT_F32, .data = host, .n = w->n, .k = w->k};
    s = cuda_weight_upload(dw, &f, what, err);
    free(host);
    if (!s && expanded) *expanded = 1;
    return s;
}

double cuda_copy_bandwidth_gbs(size_t bytes, int reps) {
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0.0;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
        cudaMemsetAsync(a, 1, bytes, cuda_stream()) == cudaSuccess) {
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cuda_stream()); /* warm-up */
        for (int r = 0; r < reps; r++) {
            cudaEventRecord(e0, cuda_stream());
            cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cuda_stream());
            cudaEventRecord(e1, cuda_stream());
            float ms = 0.0f;
            if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0) {
                double gbs = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
                if (gbs > best) best = gbs;
            }
        }
    }
    cudaGetLastError(); /* a failed measurement reports 0, it does not poison later calls */
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return best;
}
