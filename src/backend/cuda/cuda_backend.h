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

typedef struct op_weight op_weight;
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
/* Device memory bandwidth in GB/s, counting bytes read plus bytes written, of a
 * device-to-device copy of `bytes` (the best of reps, timed with events): the decode
 * roofline's ceiling on the GPU. 0 when it cannot be measured (no memory, no device). */
double cuda_copy_bandwidth_gbs(size_t bytes, int reps);
/* Waits for all queued kernels; reports any asynchronous kernel fault. */
hearth_status cuda_sync(hearth_error *err);
/* Stream-ordered copies on the backend's stream (host memory pinned for a truly
 * asynchronous copy; pageable works too) and a wait for that stream alone. */
hearth_status cuda_upload_async(void *dev, const void *host, size_t bytes, hearth_error *err);
hearth_status cuda_download_async(void *host, const void *dev, size_t bytes, hearth_error *err);
/* rows rows of width bytes from src (rows src_pitch bytes apart) to dst (dst_pitch apart),
 * device to device, on the stream (an MTP head's joined input halves). */
hearth_status cuda_copy_rows_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                                size_t rows, hearth_error *err);
hearth_status cuda_stream_sync(hearth_error *err);

/* CUDA graphs: everything launched between cuda_capture_begin and cuda_capture_end is
 * recorded (not run) and replayed by cuda_graph_launch with the same pointers and launch
 * shapes; values behind the pointers (positions, block tables) may change between
 * replays. cuda_capture_end with keep = 0 drops the capture (after a failed step). */
typedef struct cuda_graph cuda_graph;
hearth_status cuda_capture_begin(hearth_error *err);
hearth_status cuda_capture_end(int keep, cuda_graph **out, hearth_error *err);
hearth_status cuda_graph_launch(cuda_graph *g, hearth_error *err);
void cuda_graph_free(cuda_graph *g);

/* A weight matrix resident on the device. F16/BF16 rows are stored as on the host;
 * Q8_0 is split into an int8 plane [n][k] and an f16 scale plane [n][k/32] so every
 * quant load is a 16-byte aligned vector (the GGUF 34-byte block defeats that); Q4_K
 * keeps its 144-byte super-blocks, which are already 16-byte aligned; the 12 packed 6-bit
 * scale/min bytes of each block (q4k_packed = 1) are rearranged in place at upload (cuda_q4k_scale_min; same 144 bytes, so the byte count
 * in cuda_plan.c is unchanged) for the decode GEMV's cheaper unpacking. MLX affine 4-bit
 * (dtype U32) keeps its packed words [n][k/8] and pairs each group's 16-bit scale (low
 * half) and bias (high half) into one 32-bit word [n][k/group_size]: one load per group. */
typedef struct cuda_weight {
    tensor_dtype dtype;
    int64_t n, k;
    void *data;     /* rows (F16/BF16/Q4_K/MLX words) or int8 quants (Q8_0) */
    void *scales;   /* Q8_0: f16 scales; MLX: (scale, bias) pairs */
    int group_size; /* MLX and affine only */
    int sb_bf16;    /* MLX only: the pairs are bf16 (else f16) */
    int mlx_tiled;  /* MLX only: the nibble layout, 0 / 1 tiled / 2 chunked (cuda_mlx4_nibble) */
    int q4k_packed; /* Q4_K only: scale/min bytes rearranged (cuda_q4k_scale_min) */
    int aff_bits;   /* DT_AFFINE only: bits per code (cuda_affine.h) */
    tensor_dtype aff_from; /* DT_AFFINE only: the file's format */
    int aff_f32act;        /* DT_AFFINE only: float activations, not int8 (the exact tier, --cuda-exact) */
    size_t bytes;   /* device bytes read by one GEMV (data + scales) */
} cuda_weight;

/* Q4_K sub-block j < 8 scale s and min m (6 bits each) from the 12 bytes at offset 4 of a
 * super-block. GGUF order (packed = 0): j < 4 in the low 6 bits of bytes j / j + 4, j >= 4
 * split over byte j + 4 and the top 2 bits of bytes j - 4 / j. Packed order (the device
 * layout with q4k_packed): the 24 bits G_c = s_2c | s_2c+1 << 6 | m_2c << 12 | m_2c+1 << 18
 * of chunk c (sub-blocks 2c, 2c + 1) are bytes c, 4 + c and 8 + c, i.e. byte c of each
 * little-endian word w0, w1, w2: a lane working on chunk c gathers its G with two byte
 * permutes (cuda_q4k_group_dev) and takes each field with a shift and a mask. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline void cuda_q4k_scale_min(const uint8_t *sc, int j, int packed, int *s, int *m) {
    if (packed) {
        int c = j / 2, sh = 6 * (j % 2);
        uint32_t g = (uint32_t)sc[c] | (uint32_t)sc[4 + c] << 8 | (uint32_t)sc[8 + c] << 16;
        *s = (int)((g >> sh) & 63);
        *m = (int)((g >> (12 + sh)) & 63);
    } else if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

#ifdef __CUDACC__
/* G_c of a packed-order header loaded as a uint4 (x: d and dmin; y, z, w: w0, w1, w2). */
static __device__ __forceinline__ uint32_t cuda_q4k_group_dev(uint4 hdr, int c) {
    uint32_t t = __byte_perm(hdr.y, hdr.z, (unsigned)(c | (4 + c) << 4));
    return __byte_perm(t, hdr.w, (unsigned)(0x10 | (4 + c) << 8));
}
#endif

/* The 12 scale/min bytes of one super-block, GGUF order -> packed order (in may be out). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline void cuda_q4k_pack12(const uint8_t *in, uint8_t *out) {
    uint32_t g[4];
    for (int c = 0; c < 4; c++) {
        int s0, m0, s1, m1;
        cuda_q4k_scale_min(in, 2 * c, 0, &s0, &m0);
        cuda_q4k_scale_min(in, 2 * c + 1, 0, &s1, &m1);
        g[c] = (uint32_t)s0 | (uint32_t)s1 << 6 | (uint32_t)m0 << 12 | (uint32_t)m1 << 18;
    }
    for (int c = 0; c < 4; c++) {
        out[c] = (uint8_t)g[c];
        out[4 + c] = (uint8_t)(g[c] >> 8);
        out[8 + c] = (uint8_t)(g[c] >> 16);
    }
}

/* Q4_K weights get the packed scale order at upload, which the int8 decode GEMVs and MMQ
 * read (gemv_v2_q4_k, gemv_q4_k_i8p, mmq_q4_k; bench/results/kernel_choices.md, "CUDA Q4_K
 * packed scales"). */
/* Rearranges the scale bytes of w's super-blocks on the device (GGUF -> packed order). */
hearth_status cuda_q4k_pack(cuda_weight *w, hearth_error *err);

/* The v2 int8-activation GEMVs (cuda_gemv_v2.cu: one warp per row, a whole 4096-weight
 * step of loads in flight per lane) for packed-scale Q4_K and Q6_K with n >= 2k (the shapes
 * where they beat the one-warp-per-1-4-rows kernels of cuda_gemv.cu on the H200:
 * bench/results/kernel_choices.md, "CUDA v2 GEMV"). Same numerical contract as cuda_gemv_int8_act;
 * batch-invariant like the others. cuda_gemv_v2_takes: whether w's GEMV is a v2 kernel. */
int cuda_gemv_v2_takes(const cuda_weight *w);
/* bench/cuda/gemv_bench only: w's v2 GEMV at T rows, Q6_K included at T = 1 (where decode
 * takes gemv_q6_k_i8); xq / xs as cuda_add_rmsnorm_q8 writes them. 1: launched. */
int cuda_gemv_v2_bench(const cuda_weight *w, float *y, const int8_t *xq, const float *xs, int T);

/* MLX 4-bit weights with k % 64 == 0, k >= 512 and power-of-two groups >= 32 (MLX's 32, 64,
 * 128) are uploaded in the chunked layout (cuda_mlx4_nibble) and take int8 activations
 * (cuda_gemv_int8_act's contract) and gemv_v3_mlx4 (cuda_gemv_mlx4.cu); the others keep the
 * float kernels (the tiled layout where k % 1024 == 0). Rows under 512 weights (the tiny
 * test models') stay on float activations: a warp per row leaves most of its lanes idle
 * there, and the exact tier's greedy parity with the CPU reference holds on them.
 * cuda_mlx4_int8_shape: the shapes the int8 GEMV takes; cuda_mlx4_layout: the layout a
 * weight is uploaded in (cuda_weight.mlx_tiled); cuda_mlx4_int8_takes: whether w goes to the
 * int8 GEMV (a chunked weight: no float kernel reads that layout); cuda_mlx4_prepare: asks
 * the device whether it launches as a programmatic dependent (at upload, outside any graph
 * capture). */
static inline int cuda_mlx4_int8_shape(int64_t k, int gs) {
    return k % 64 == 0 && k >= 512 && gs >= 32 && (gs & (gs - 1)) == 0 && k % gs == 0;
}
static inline int cuda_mlx4_layout(int64_t k, int gs) { return cuda_mlx4_int8_shape(k, gs) ? 2 : k % 1024 == 0; }
int cuda_mlx4_int8_takes(const cuda_weight *w);
void cuda_mlx4_prepare(void);

/* The device layouts of MLX 4-bit rows (cuda_weight.mlx_tiled):
 * 1, tiled (k % 1024 == 0): in each tile of 1024 weights, lane L of a warp reads one 16-byte vector holding
 *    weights 128m + 4L + j (m < 8, j < 4), so its eight float4 activation loads are
 *    coalesced across the warp (the plain layout makes each lane read 32 consecutive
 *    floats: 32 cache lines per warp-wide load);
 * 2, chunked (GGUF Q4_K's nibble order; k % 64 == 0): in each chunk of 64 weights (32 bytes), byte i
 *    holds weight i in its low nibble and weight 32 + i in its high nibble, so a 16-byte
 *    vector is two runs of 16 consecutive weights, unpacked by one mask each.
 * 0: MLX's own order (weight c is nibble c % 8 of word c / 8). Returns the word (within the
 * row) and bit shift of weight c. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline void cuda_mlx4_nibble(int64_t c, int tiled, int64_t *word, int *shift) {
    if (tiled == 2) {
        int64_t byte = c / 64 * 32 + c % 32;
        *word = byte / 4;
        *shift = (int)(byte % 4) * 8 + (c % 64 >= 32 ? 4 : 0);
        return;
    }
    if (!tiled) {
        *word = c / 8;
        *shift = (int)(c % 8) * 4;
        return;
    }
    int64_t t = c / 1024;
    int rem = (int)(c % 1024), m = rem / 128, lane = (rem % 128) / 4, j = rem % 4;
    *word = t * 128 + lane * 4 + m / 2;
    *shift = 16 * (m % 2) + 4 * j;
}

/* Whether the device keeps this host weight in a format its kernels read (F32, F16, BF16,
 * Q8_0, Q4_K, Q6_K, Q4_0/Q4_1 as MLX 4-bit, MLX affine 4-bit with f16/bf16 scales and groups
 * of a multiple of 32, and in the generic affine layout (cuda_affine.h) MLX 2/3/5/6/8-bit,
 * Q5_0, Q5_1, Q2_K, Q3_K and Q5_K). */
int cuda_weight_supported(const op_weight *w);
/* Uploads a host weight (any pointer alignment) once; fails for unsupported formats. */
hearth_status cuda_weight_upload(cuda_weight *dw, const op_weight *w, const char *what, hearth_error *err);
/* Any format cpu_matmul handles: supported ones as cuda_weight_upload; the rest (shapes
 * the kernels do not take: k % 32 != 0, K-quants with k % 256 != 0, MLX groups other than
 * 16/32/64/128) dequantized on the host with the CPU reference (bit-exact) and kept as F32
 * on the device: correct, but 32/bits times the memory and the decode bytes. *expanded is
 * set to 1 when that happened. */
hearth_status cuda_weight_upload_any(cuda_weight *dw, const op_weight *w, const char *what, int *expanded,
                                     hearth_error *err);
/* The same, the host repacks (the formats' device layouts, the f32 expansion) spread over
 * tp's threads (NULL: this thread); the bytes uploaded do not depend on tp. */
typedef struct threadpool threadpool;
hearth_status cuda_weight_upload_mt(cuda_weight *dw, const op_weight *w, const char *what, threadpool *tp,
                                    hearth_error *err);
hearth_status cuda_weight_upload_any_mt(cuda_weight *dw, const op_weight *w, const char *what, int *expanded,
                                        threadpool *tp, hearth_error *err);
void cuda_weight_free(cuda_weight *dw);

/* y[T, n] = x[T, k] · W^T, all pointers device memory, float32 activations. Meant for
 * decode (T small); any T works, in chunks of 8 rows. Launches on the default stream. */
hearth_status cuda_gemv(const cuda_weight *w, const float *x, int T, float *y, hearth_error *err);

/* Whether cuda_gemv quantizes x to int8 blocks of 32 for this weight (Q8_0, Q4_K, Q6_K,
 * and MLX 4-bit where cuda_mlx4_int8_takes it): then y
 * is W · x̂ with x̂ = d·q per block, d = max|x|/127, q = round-half-even(x/d) clamped to
 * ±127 (cpu_quantize_row_ref's rule, as the CPU fast path does), summed in exact int32 per
 * block. */
int cuda_gemv_int8_act(const cuda_weight *w);
/* Device scratch for the int8 activations of up to `floats` = T·k inputs (model creation:
 * max decode tokens times the widest k). cuda_gemv grows it itself when it is too small,
 * except during a graph capture, where it falls back to the float kernels. */
hearth_status cuda_gemv_reserve(size_t floats, hearth_error *err);
/* cuda_gemv_multi for int8-activation weights (cuda_gemv_int8_act, all of one k) whose
 * activations are already quantized: xq int8 [T][k], xs (d, d * sum q) float pairs per
 * block of 32 [T][k / 32], as cuda_add_rmsnorm_q8 / cuda_gated_q8 write them. */
hearth_status cuda_gemv_multi_q8(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq,
                                 const float *xs, int T, hearth_error *err);
/* The batched int8 tensor-core matmul ("MMQ", cuda_mmq.cu) for packed-scale Q4_K weights
 * (k % 256 == 0) at 5..64 rows: it reads the weight once for all rows
 * (the GEMVs re-read it per chunk of 8); same int8-activation semantics as
 * cuda_gemv_int8_act, but NOT batch-invariant: never for deterministic steps.
 * cuda_mmq_takes: whether it takes w at T now. cuda_mmq_force(1 / 0 / 2) forces 2..64 rows /
 * off / the default 5..64 (tests, benches), -1 the default. cuda_gemv_mmq: cuda_gemv, with MMQ for a
 * weight it takes. cuda_matmul_q8: cuda_gemv_multi_q8, with MMQ for the weights it takes. */
int cuda_mmq_takes(const cuda_weight *w, int T);
void cuda_mmq_force(int mode);
/* MMQ kernel launches so far (host count; tests check the routing with it). */
unsigned long cuda_mmq_launch_count(void);
hearth_status cuda_gemv_mmq(const cuda_weight *w, const float *x, int T, float *y, hearth_error *err);
hearth_status cuda_matmul_q8(const cuda_weight *const *ws, float *const *ys, int nw, const int8_t *xq, const float *xs,
                             int T, hearth_error *err);
/* Tests: -1 leaves the GEMVs' Programmatic Dependent Launch as the device says (on for
 * sm_90+), 0 / 1 force it off / on. */
void cuda_gemv_force_pdl(int mode);

/* A stacked-experts weight for the grouped GEMV: E slices of one format and shape, each
 * its own device allocation, found through device tables of their planes' addresses. */
typedef struct cuda_expert_table {
    const cuda_weight *proto;  /* slice 0: the format and shape every slice shares */
    const void *const *data;   /* device [E]: each slice's data plane */
    const void *const *scales; /* device [E]: each slice's scale plane (NULL: the format has none) */
} cuda_expert_table;
/* Whether the grouped GEMV takes slices of w's format and shape: int8-activation formats with
 * a kernel that reads its weight through a table (Q8_0, packed Q4_K and Q6_K with k % 256 ==
 * 0, MLX 4-bit that cuda_mlx4_int8_takes, the generic affine layout on int8 activations). */
int cuda_gemv_experts_takes(const cuda_weight *w);
/* The experts' GEMVs of a decode step without the host: for each of P (expert, row) pairs,
 * ys[i][p, :] = slice sel[p] of tabs[i] · x[p / xdiv, :] (nw = 1 or 2 tables of one format
 * and k, e.g. gate and up, in one launch; x float [P / xdiv][k], quantized to int8 blocks as
 * cuda_gemv_int8_act says). sel is device memory (the routing kernel's output), read by the
 * kernels, so the launch shapes depend on P alone: capturable into a graph. A pair's row
 * has the bits cuda_gemv gives that slice at one row on the v2 / MLX 4-bit / affine / Q8_0
 * kernel. */
hearth_status cuda_gemv_experts(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *sel, int P,
                                int xdiv, const float *x, hearth_error *err);

/* The grouped expert GEMM of a prefill step (cuda_moe_gemm.cu): pairs (token, expert) are
 * ordered by expert and cut into nseg segments, segs[3 s .. 3 s + 2] = (expert e, first
 * pair p0, count c <= CUDA_MOE_GEMM_TOKENS) in device memory; with nseg_dev, *nseg_dev of
 * them are real and nseg is their bound (the launch's size). For every segment and table i
 * < nw (one launch for all): row p of ys[i] (row yrow[p] where yrow is set), p0 <= p < p0 +
 * c, = slice e of tabs[i] · x_p, where x_p is row xrow[p] of the bf16 rows x (row p without
 * xrow; k wide). The weight is dequantized tile by tile as the dequantize + cuBLAS prefill
 * path dequantizes it, then rounded to bf16; f32 sums on the tensor cores; not
 * batch-invariant. cuda_moe_gemm_takes: the formats and shapes it reads (k % 32 == 0; Q4_K /
 * Q6_K k % 256). cuda_to_bf16 / cuda_gated_bf16 (cuda_gemm.cu) make its inputs: x, and
 * act(gate) * up (gelu: GeGLU, else SwiGLU), each rounded once to bf16 (n elements). */
#define CUDA_MOE_GEMM_TOKENS 128
int cuda_moe_gemm_takes(const cuda_weight *w);
hearth_status cuda_moe_gemm(const cuda_expert_table *tabs, int nw, float *const *ys, const int32_t *yrow,
                            const int32_t *segs, int nseg, const int32_t *nseg_dev, const void *x, const int32_t *xrow,
                            hearth_error *err);
hearth_status cuda_to_bf16(const float *x, size_t n, void *out, hearth_error *err);
hearth_status cuda_gated_bf16(const float *gate, const float *up, size_t n, int gelu, void *out, hearth_error *err);
/* The grouped GEMM's tables from a routing (cuda_moe_route's sel [T][K]), on the device: the
 * T K pairs ordered by expert, rows[c] = pair c's token, dst[c] = its slot t K + k (where its
 * down row goes for cuda_moe_combine), segs / *nseg its segments of at most tok pairs
 * (at most T K / tok + E of them). */
hearth_status cuda_moe_sort(const int32_t *sel, int T, int K, int E, int tok, int32_t *rows, int32_t *dst,
                            int32_t *segs, int32_t *nseg, hearth_error *err);

/* ys[i][T, n_i] = x[T, k] · ws[i]^T for nw <= 3 weights of one input (a layer's q, k, v):
 * one launch when they are all F16 or all BF16 with the same k (16-byte aligned rows),
 * else one cuda_gemv each (int8-activation weights: x quantized once for all). Same
 * arithmetic as cuda_gemv per row. */
hearth_status cuda_gemv_multi(const cuda_weight *const *ws, float *const *ys, int nw, const float *x, int T,
                              hearth_error *err);

/* Element-wise ops: same semantics as ops.h, device pointers. */
hearth_status cuda_rmsnorm(float *out, const float *x, const float *w, float shift, int T, int n, float eps,
                           hearth_error *err);
/* cuda_rmsnorm for many short rows (n <= 256: the per-head q / k norms), one warp per row;
 * the same for every T, but not the same rounding as cuda_rmsnorm (longer rows go there). */
hearth_status cuda_rmsnorm_heads(float *out, const float *x, const float *w, float shift, int rows, int n, float eps,
                                 hearth_error *err);
hearth_status cuda_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                        int adjacent, hearth_error *err);
/* RoPE of q [T][n_heads][head_dim] and k [T][n_kv_heads][head_dim] in one launch, each
 * value exactly as cuda_rope computes it (cuda_fused.cu). */
hearth_status cuda_rope_qk(float *q, float *k, int T, int n_heads, int n_kv_heads, int head_dim, const int32_t *pos,
                           const float *inv_freq, int adjacent, hearth_error *err);
/* op_residual over T rows of n: d = delta (NULL: none), rmsnorm'd with delta_norm when given
 * and times delta_scale; x = (x + d) * x_scale; then, when w is given, out = rmsnorm(x) * (w
 * + shift) and, when xq is given, out quantized to int8 blocks of 32 into xq / xs (layout:
 * cuda_gemv_multi_q8; n % 32 == 0); without w, xq gets the new x's int8 copy. One launch, bit-identical to cuda_rmsnorm, cuda_scale,
 * cuda_add, cuda_scale and cuda_rmsnorm run in turn (cuda_fused.cu). */
typedef struct cuda_residual_args {
    float *x;
    const float *delta, *delta_norm;
    float delta_scale, x_scale;
    const float *w;
    float shift;
    float *out;
    int8_t *xq;
    float *xs;
    int T, n;
    float eps;
} cuda_residual_args;
hearth_status cuda_residual(const cuda_residual_args *a, hearth_error *err);
/* cuda_residual's plain add (delta NULL: none) and norm, with (q8) and without the int8 copy. */
hearth_status cuda_add_rmsnorm_q8(float *out, float *x, const float *delta, const float *w, float shift, int T, int n,
                                  float eps, int8_t *xq, float *xs, hearth_error *err);
/* cuda_silu_mul (gelu: cuda_gelu_tanh_mul) that also writes the product quantized like
 * cuda_add_rmsnorm_q8 (n values in rows whose length is a multiple of 32). */
hearth_status cuda_gated_q8(float *gate, const float *up, size_t n, int gelu, int8_t *xq, float *xs,
                            hearth_error *err);
/* cuda_gelu_tanh_mul_rows that also writes the product's int8 copy like cuda_gated_q8 (n % 32
 * == 0); the same float bits. */
hearth_status cuda_gelu_tanh_mul_rows_q8(float *gate, const float *up, int T, int n, size_t up_stride, int8_t *xq,
                                         float *xs, hearth_error *err);
hearth_status cuda_silu_mul(float *gate, const float *up, size_t n, hearth_error *err);
hearth_status cuda_gelu_tanh_mul(float *gate, const float *up, size_t n, hearth_error *err);

hearth_status cuda_add_rmsnorm(float *out, float *x, const float *delta, const float *w, float shift, int T, int n,
                               float eps, hearth_error *err);
/* out[r] = the first index of the largest value of logits row r (the sampler's greedy
 * rule, NaN never chosen): only token ids need to leave the device. */
hearth_status cuda_argmax(const float *logits, int rows, int vocab, int32_t *out, hearth_error *err);
/* cuda_argmax, but a row holding any NaN or infinity gets -1 (the engine's non-finite
 * logits error, which the host checks when the logits come back). */
hearth_status cuda_argmax_checked(const float *logits, int rows, int vocab, int32_t *out, hearth_error *err);

/* y[i] += x[i]; y[t, :] += bias for T rows of n; dst[i, :] = src[rows[i], :] (rows on the device). */
hearth_status cuda_add(float *y, const float *x, size_t n, hearth_error *err);
/* x[i] *= s, or (divide) x[i] /= s: one IEEE rounding per element, as the host's loop. */
hearth_status cuda_scale(float *x, float s, int divide, size_t n, hearth_error *err);
hearth_status cuda_add_bias(float *y, const float *bias, int T, int n, hearth_error *err);
hearth_status cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n_rows, int width,
                               hearth_error *err);
/* x[i] = 0; dst[rows[i], :] += src[i, :] * w[i] for n_rows distinct rows (the experts of
 * the mixture-of-experts op, cuda_moe.cu; rows and w on the device). */
hearth_status cuda_zero(float *x, size_t n, hearth_error *err);
hearth_status cuda_scatter_add_rows(float *dst, const float *src, const int32_t *rows, const float *w, int n_rows,
                                    int width, hearth_error *err);
/* y[t, :] += sigmoid(g[t]) * o[t, :] for T rows of width (a shared expert's gated output). */
hearth_status cuda_add_sigmoid_scaled(float *y, const float *o, const float *g, int T, int width, hearth_error *err);

/* Each of T tokens' K experts from its router logits [T][E] on the device, by op_moe_route's
 * rule to the bit (its op_expf, its sums in its order, its ties): topk_softmax 0 is the
 * softmax-then-top-K form (norm_topk: renormalised), 1 the top-K-then-softmax form
 * (op_moe.router_norm set) times expert_scale[e] (device [E]). sel / w [T][K]: each token's
 * experts in ascending expert order with their weights (the order the experts' outputs are
 * summed in). E <= 4096, K <= 16. */
hearth_status cuda_moe_route(const float *logits, int T, int E, int K, int topk_softmax, int norm_topk,
                             const float *expert_scale, int32_t *sel, float *w, hearth_error *err);
/* out[t, :] = the sum over k of o[t K + k, :] * w[t K + k] in k order, from 0, one rounding
 * for each product and each sum (cuda_scatter_add_rows' arithmetic in the same order). */
hearth_status cuda_moe_combine(float *out, const float *o, const float *w, int T, int K, int width, hearth_error *err);

/* Device copy of the paged KV pool: same block layout and tables as kv_cache; the element
 * type is the pool's quant (hearth_kv_quant): float32, or int8 / fp8 e4m3 bytes with one
 * float scale per (layer, block, KV head, position) row. Kernels read and write elements only
 * through cuda_kv_access.cuh. */
typedef struct cuda_kv {
    int n_layers, n_kv_heads, head_dim;
    int n_blocks, max_slots, max_blocks_per_slot;
    int quant;                /* hearth_kv_quant */
    void *k, *v;              /* [n_layers][n_blocks][n_kv_heads][KV_BLOCK_SIZE][head_dim] elements */
    float *k_scale, *v_scale; /* int8 / fp8: [n_layers][n_blocks][n_kv_heads][KV_BLOCK_SIZE]; else NULL */
    int32_t *tables;
    /* Layers of their own shape (kv_cache.layer_heads / layer_dims, host copies; NULL when
     * every layer is n_kv_heads x head_dim, else those are the maxima): layer l's rows and
     * elements follow layer l - 1's, as on the host; kernels see one layer through
     * cuda_kv_layer_view. Kernels never read these arrays. */
    int *layer_heads, *layer_dims;
} cuda_kv;
/* A pool of one layer's shape whose layer 0 is layer `layer` of kv (the same tables, the
 * storage pointers moved to that layer): kv_layer_view for the device pool. Returns the
 * layer index to use with view (0, or `layer` where kv's layers share one shape and view
 * is a copy of kv). */
int cuda_kv_layer_view(const cuda_kv *kv, int layer, cuda_kv *view);
/* Allocates the device pool for kv's sizes and quant and copies keys, values (float or
 * int8 with their scales) and tables. */
hearth_status cuda_kv_upload(cuda_kv *dkv, const kv_cache *kv, hearth_error *err);
/* Allocates a zeroed device pool of kv's sizes in `quant` (whatever kv stores on the host)
 * and copies only its block tables. */
hearth_status cuda_kv_alloc(cuda_kv *dkv, const kv_cache *kv, int quant, hearth_error *err);
void cuda_kv_free(cuda_kv *dkv);
/* Writes T tokens' keys and values ([T, n_kv_heads * head_dim] each) into the pool at
 * (slot[t], pos[t]) of `layer` through the device block tables, quantizing each row for an
 * int8 / fp8 pool (rules in cuda_kv_access.cuh; int8 equals kv_store's bytes and scales). */
hearth_status cuda_kv_write(const cuda_kv *dkv, int layer, const float *k, const float *v, int T,
                            const int32_t *pos, const int32_t *slot, hearth_error *err);
/* Copies positions [0, rows) of block src into block dst, every layer and KV head (keys,
 * values, scales), on the backend's stream: kv_copy_rows for the device pool. */
hearth_status cuda_kv_copy_rows(const cuda_kv *dkv, int32_t src, int32_t dst, int rows, hearth_error *err);
/* cuda_rope_qk of q [T][n_heads][head_dim] and k, then cuda_kv_write of the rotated k and v,
 * in one launch: the same q, k and pool bytes, bit for bit (head_dim even). rot_dims: RoPE
 * on the first rot_dims of each head only (pairs i, i + rot_dims / 2, as ops_rope_part; even;
 * 0: all). */
hearth_status cuda_rope_kv_write(const cuda_kv *dkv, int layer, float *q, float *k, const float *v, int T, int n_heads,
                                 const int32_t *pos, const int32_t *slot, const float *inv_freq, int adjacent,
                                 int rot_dims, hearth_error *err);
/* Each head's own norm before it: q and k (non-NULL weights: cuda_rmsnorm_heads's rows with
 * shift and eps; head_dim <= 256) and, with v set, the values' plain norm (cuda_rmsnorm_plain).
 * hn NULL: none. */
typedef struct cuda_head_norms {
    const float *q, *k;
    float shift, eps;
    int v;
} cuda_head_norms;
/* cuda_rope_kv_write after the heads' norms (hn), in one launch, the same bits as
 * cuda_rmsnorm_heads, cuda_rmsnorm_plain and cuda_rope_kv_write in turn; q_only: the queries
 * only (normed and rotated as cuda_rope does; k and v untouched, nothing stored: a layer that
 * reads another layer's KV). */
hearth_status cuda_norm_rope_kv_write(const cuda_kv *dkv, int layer, float *q, float *k, float *v, int T, int n_heads,
                                      const int32_t *pos, const int32_t *slot, const float *inv_freq, int adjacent,
                                      int rot_dims, const cuda_head_norms *hn, int q_only, hearth_error *err);

/* Gated attention (op_attn.gated): q [T][n_heads][head_dim] = the queries of qg, the doubled
 * projection [T][n_heads][2 head_dim] (per head: queries, then gates); and
 * att[t][h][i] *= sigmoid(gate[t][h][i]) from the same qg. */
hearth_status cuda_attn_gate_split(const float *qg, float *q, int T, int n_heads, int head_dim, hearth_error *err);
hearth_status cuda_attn_gate_apply(float *att, const float *qg, int T, int n_heads, int head_dim, hearth_error *err);

/* The middle of a Gated DeltaNet layer (op_gdn; cpu_gdn.c's ops_gated_delta on the device):
 * qkv [T][conv_dim] (the in_proj_qkv rows, overwritten: conv, SiLU, q / k L2-normed), z
 * [T][v_heads v_dim], a and b [T][v_heads] in; y [T][v_heads v_dim] out; each token on the
 * record (layer, slot[t]) of the device state pool state [max_slots][n_layers][layer_floats]
 * (kv_state.h's layout), a token at position 0 from a zero state. run_first[t] / run_next[t]
 * (cuda_gdn_runs): whether t is its sequence's first token in the step, and the index of
 * its next one (-1: none): a sequence's tokens run in batch order, sequences in parallel.
 * Every pointer is device memory. */
typedef struct cuda_gdn_args {
    float *state;
    int n_layers, layer;
    size_t layer_floats;
    int T;
    const int32_t *pos, *slot, *run_first, *run_next;
    int k_heads, v_heads, k_dim, v_dim, conv_k, v_tiled;
    int single_run; /* every token is slot[0]'s, in order (a prefill chunk): the conv runs in parallel chunks */
    /* single_run with consecutive positions and the fast tier: a step of at least
     * CUDA_GDN_CHUNK_MIN_T tokens with heads cuda_gdn_chunk_takes takes the chunked
     * form of the delta rule (its sums in another order than cpu_gdn.c's token walk), in
     * scratch of cuda_gdn_chunk_floats(T, v_heads, k_dim) floats */
    int chunked;
    float *scratch;
    const float *conv, *A_log, *dt_bias, *norm;
    float norm_eps;
    float *qkv;
    const float *z;
    float *a, *b; /* a prefill step (T > 8) overwrites them with each token's g and beta */
    float *y;
} cuda_gdn_args;
hearth_status cuda_gated_delta(const cuda_gdn_args *a, hearth_error *err);
/* Whether cuda_gated_delta takes heads of these sizes and a conv this long. */
int cuda_gdn_supported(int k_dim, int v_dim, int conv_k);
/* The chunked delta rule (cuda_gdn_args.chunked): tokens per chunk, the widest key and value
 * head, the shortest step that takes it, and its scratch: each (token, value head)'s
 * W diag(gamma) K row [k_dim] and masked q.k row [CUDA_GDN_CHUNK] (cuda_plan.c). */
#define CUDA_GDN_CHUNK 64
#define CUDA_GDN_CHUNK_DIM 128
#define CUDA_GDN_CHUNK_MIN_T 32
size_t cuda_gdn_chunk_floats(int T, int v_heads, int k_dim);
/* Whether the chunked form takes heads of these sizes (at most CUDA_GDN_CHUNK_DIM). */
int cuda_gdn_chunk_takes(int k_dim, int v_dim);
/* Whether the current device gives the chunked kernels their shared memory (else the token
 * walk runs). */
int cuda_gdn_chunk_device(void);
/* Host side: run_first / run_next of T tokens' slots (each < max_slots; last: max_slots
 * ints of scratch). */
void cuda_gdn_runs(const int32_t *slot, int T, int max_slots, int32_t *last, int32_t *first, int32_t *next);
/* dst = src, floats of device memory, ordered on the backend's stream (a state record into
 * a snapshot record or back). */
hearth_status cuda_state_copy(float *dst, const float *src, size_t floats, hearth_error *err);

/* Decode attention over the device pool: ops_attention's contract (causal, window,
 * grouped KV heads), q/out/pos/slot in device memory. head_dim <= 256, or up to
 * CUDA_ATT_WIDE_DMAX through the simple wide kernel. */
typedef struct cuda_attention_args {
    const cuda_kv *kv;
    int layer;
    const float *q;
    float *out;
    int T, n_heads, n_kv_heads, head_dim;
    const int32_t *pos, *slot;
    int window;
    float scale;
    int single_slot; /* 1: every token is in slot[0]'s sequence (a prefill chunk): with more
                        than 8 tokens the tiled prefill kernel runs (K/V tiles shared by 8 tokens) */
    /* Decode (T <= 8): device scratch for the split-K partial results (may be NULL: one
     * split per (KV head, token)); cuda_attention_split_floats gives the size to allocate. */
    float *split_scratch;
    size_t split_scratch_floats;
    /* 1 (deterministic mode): every token's result is independent of the batch: the decode
     * kernels for any T (in launches of at most 8 tokens, so the split count is the pool's
     * fixed one), never the prefill tiles or the tensor-core prefill; costs prefill speed,
     * see docs/server.md. */
    int batch_invariant;
    int exact_f32; /* 1: f32 arithmetic only (--cuda-exact, the parity tier): no bf16 tensor-core prefill */
    /* Optional (NULL: unknown): slot[] on the host. With it, a ragged step (single_slot 0,
     * T > 8; a sequence's tokens consecutive) is split into runs: each run of more than 8
     * tokens of one slot goes to the prefill kernels, the rest (decode rows) to the GQA
     * split-K decode kernel in one launch per stretch. */
    const int32_t *host_slot;
    /* Optional (NULL: not wanted): where a decode launch whose splits are merged (see
     * cuda_attention_writes_q8) also writes out as int8 blocks of 32 with their (d, d * sum q)
     * pairs, bit for bit what quantize_x_q8 makes of out: the o projection's int8
     * activations without a quantizer launch. out_xq [T][n_heads * head_dim], out_xs
     * [T][n_heads * head_dim / 32] float pairs. */
    int8_t *out_xq;
    float *out_xs;
    /* Prefill (the tensor-core kernel, which needs it): device scratch of at least
     * cuda_attention_stage_bytes(kv) bytes for the bf16 copy of the sequence's keys and
     * values; NULL leaves single-sequence chunks to the f32 prefill kernel. */
    void *stage;
    size_t stage_bytes;
} cuda_attention_args;
/* Whether cuda_attention(a) writes a->out_xq / out_xs (a decode launch of at most 8 tokens
 * through the GQA split-K kernel with more than one split, head_dim % 32 == 0); when 0 they
 * are left untouched and out must be quantized by the caller. */
int cuda_attention_writes_q8(const cuda_attention_args *a);
/* Floats of split_scratch that let decode attention of up to max_T tokens use every split. */
size_t cuda_attention_split_floats(int max_T, int n_heads, int head_dim);
/* Bytes of the stage the tensor-core prefill attention copies a sequence's keys and values
 * into (bf16, rows of every position a slot can hold; 0 for a head_dim it has no kernel for).
 * A pool whose layers differ needs the largest of its layers' stages. */
size_t cuda_attention_stage_bytes(int max_blocks_per_slot, int n_kv_heads, int head_dim);
/* Its rows per KV head (positions). */
size_t cuda_attention_stage_rows(int max_blocks_per_slot);
hearth_status cuda_attention(const cuda_attention_args *a, hearth_error *err);
/* Prefill attention on the tensor cores (cuda_attn_prefill.cu): a single_slot chunk,
 * head_dim 16/32/64/128/256/512, up to 64 query heads per KV head; bf16 Q/K/V operands, f32
 * accumulation and softmax. cuda_attention takes it for single_slot chunks of more than
 * 8 tokens whenever _fits says so. */
int cuda_attention_prefill_tc_fits(const cuda_attention_args *a);
hearth_status cuda_attention_prefill_tc(const cuda_attention_args *a, hearth_error *err);

/* The widest head cuda_attention takes. head_dim > 256: prefill runs of more than 8 tokens of
 * one sequence take the tensor-core kernel (512 only, not in exact or deterministic mode);
 * everything else a simple kernel (one block of 8 warps per query head and token over the
 * token's own positions, f32 throughout, any T and any mix of sequences, batch-invariant;
 * no int8 output for o). */
#define CUDA_ATT_WIDE_DMAX 512

/* Ops of models whose layers differ (op_dims.varied_layers; cuda_varied.cu), each the CPU
 * op's float32 arithmetic: x[r] = x[r] / rms(x[r]) for rows of n (ops_rmsnorm without a
 * weight: values normed without a scale); dst = src (a stream-ordered device copy); in =
 * (proj + in) * s (the per-layer inputs' two halves); gate[t][i] = gelu_tanh(gate[t][i]) *
 * up[t * up_stride + i] for T rows of n (a layer's slice of the per-layer inputs); x =
 * tanh(x / cap) * cap (logit softcap). */
hearth_status cuda_rmsnorm_plain(float *x, int rows, int n, float eps, hearth_error *err);
hearth_status cuda_copy_f32(float *dst, const float *src, size_t n, hearth_error *err);
hearth_status cuda_per_layer_combine(float *in, const float *proj, float s, size_t n, hearth_error *err);
hearth_status cuda_gelu_tanh_mul_rows(float *gate, const float *up, int T, int n, size_t up_stride, hearth_error *err);
hearth_status cuda_softcap(float *x, float cap, size_t n, hearth_error *err);

/* Prefill matmul: y[T, n] = x[T, k] · W^T through cuBLAS. The weight is dequantized into
 * a device scratch (max_weight_elems, plus max_act_elems for x: 2 bytes each, 4 in exact
 * mode; cuda_plan.c sizes them) (unless already in the GEMM's input type) and x converted; bf16
 * operands with f32 accumulation by default, or f32 operands (exact_f32, no tensor-core
 * rounding) for parity checks. T <= 8 goes to cuda_gemv instead. */
typedef struct cuda_gemm cuda_gemm;
hearth_status cuda_gemm_create(cuda_gemm **out, size_t max_weight_elems, size_t max_act_elems, int exact_f32,
                               hearth_error *err);
void cuda_gemm_free(cuda_gemm *g);
hearth_status cuda_matmul(cuda_gemm *g, const cuda_weight *w, const float *x, int T, float *y, hearth_error *err);
/* cuda_matmul in two halves, so that weights reading one input convert it once (q, k, v;
 * gate, up) and the gated MLP product reaches the GEMM without an f32 pass: _act says the
 * type cuda_matmul converts x to for w at T rows (CUDA_ACT_BF16, CUDA_ACT_F16 for F16
 * weights), CUDA_ACT_NONE where it takes another path (GEMV, MMQ, exact f32); _load_x
 * converts x [T][k] into the GEMM's activation scratch, _load_gated writes act(gate) * up
 * there (cuda_act.cuh's value, rounded once: what cuda_silu_mul / cuda_gelu_tanh_mul then
 * _load_x give), and _loaded multiplies what is loaded by w (w's _act must be `act`).
 * The same bits as cuda_matmul. */
enum { CUDA_ACT_NONE = 0, CUDA_ACT_BF16 = 1, CUDA_ACT_F16 = 2 };
int cuda_matmul_act(const cuda_gemm *g, const cuda_weight *w, const float *x, int T);
hearth_status cuda_matmul_load_x(cuda_gemm *g, int act, const float *x, int T, int64_t k, hearth_error *err);
hearth_status cuda_matmul_load_gated(cuda_gemm *g, int act, const float *gate, const float *up, int T, int64_t k,
                                     int gelu, hearth_error *err);
hearth_status cuda_matmul_loaded(cuda_gemm *g, const cuda_weight *w, int act, int T, float *y, hearth_error *err);
/* Whether cuda_matmul sends this call to cuda_gemv: T <= 8, or a quantized weight at a T
 * where the GEMV reads fewer bytes than dequantize + GEMM (cuda_gemm.cu's byte model). F16
 * weights go to cuBLAS as stored with f16 activations. */
int cuda_matmul_uses_gemv(const cuda_gemm *g, const cuda_weight *w, int T);
/* Whether cuda_matmul sends this call to the MMQ kernel (cuda_mmq_takes; never in exact
 * mode); it is checked before cuda_matmul_uses_gemv. */
int cuda_matmul_uses_mmq(const cuda_gemm *g, const cuda_weight *w, int T);
/* Whether a call of T <= 8 rows on w goes to cuBLAS as stored (F16 / BF16 weights from
 * 2 rows; never in exact mode). */
int cuda_matmul_small_direct(const cuda_gemm *g, const cuda_weight *w, int T);
/* Dequantizes w (any device format) into out as bf16 [n][k], as the prefill GEMM does. */
hearth_status cuda_dequant_bf16(const cuda_weight *w, void *out, hearth_error *err);
/* Whether cuda_matmul hands this weight to cuBLAS as stored (no dequantized copy, so any
 * weight size fits the scratch, e.g. lm_head). */
int cuda_matmul_direct(const cuda_gemm *g, const cuda_weight *w);

#ifdef __cplusplus
}
#endif
#endif
