/* cuda_gdn.cu: the middle of a Gated DeltaNet layer on the GPU (op_gdn in ops/ops.h; the
 * CPU's is cpu_gdn.c, whose order of operations these kernels follow in float32): the causal
 * conv1d + SiLU, the L2 norm of q and k, the gated delta rule on each sequence's state and
 * the gated RMSNorm, then the state-record copies of prefix-cache snapshots. Only
 * stream-ordered launches of fixed shape per T (a decode step is captured into a graph);
 * no allocation, no host sync. */
#include "backend/cuda/cuda_internal.h"

/* The widest key / value head and the longest conv a warp keeps in registers (128 in the hybrid models run so far:
 * and 4; cuda_gdn_supported refuses more). */
#define GDN_MAX_DIM 256
#define GDN_MAX_CONV 8
#define GDN_LANE_VALS (GDN_MAX_DIM / 32)
/* Warps per block of the delta-rule and norm kernels: one value row (or one head) each. */
#define GDN_WARPS 4

static __device__ __forceinline__ float gdn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* mlx's softplus, as cpu_gdn.c: max(x, 0) + log1p(exp(-|x|)) */
static __device__ __forceinline__ float gdn_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The (layer, slot) record of the state pool: the conv's last conv_k - 1 inputs [conv_k - 1][C],
 * then every value head's [v_dim][k_dim] matrix (kv_state.h's layout). */
static __device__ __forceinline__ float *gdn_record(const cuda_gdn_args &a, int slot) {
    return a.state + ((size_t)slot * a.n_layers + a.layer) * a.layer_floats;
}

/* Thread (channel c, token t) with run_first[t]: the causal conv of channel c over the
 * tokens of t's sequence in this step (t, run_next[t], ...), its kept inputs in registers
 * from the record, written back at the end; x = silu(conv) in place. A token at position 0
 * starts from zero inputs. */
__global__ void gdn_conv_kernel(cuda_gdn_args a, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (c >= C || !a.run_first[t]) return;
    int K = a.conv_k;
    float *rec = gdn_record(a, a.slot[t]), hist[GDN_MAX_CONV], w[GDN_MAX_CONV];
    for (int k = 0; k < K; k++) w[k] = a.conv[(size_t)c * K + k];
    for (int k = 0; k < K - 1; k++) hist[k] = rec[(size_t)k * C + c];
    for (int u = t; u >= 0; u = a.run_next[u]) {
        if (a.pos[u] == 0)
            for (int k = 0; k < K - 1; k++) hist[k] = 0.0f;
        float *x = a.qkv + (size_t)u * C;
        float in = x[c], sum = 0.0f;
        for (int k = 0; k < K - 1; k++) sum += w[k] * hist[k];
        sum += w[K - 1] * in;
        for (int k = 0; k + 1 < K - 1; k++) hist[k] = hist[k + 1];
        if (K > 1) hist[K - 2] = in;
        x[c] = sum * gdn_sigmoid(sum);
    }
    for (int k = 0; k < K - 1; k++) rec[(size_t)k * C + c] = hist[k];
}

/* One warp per (token, q or k head): mlx-lm's normalize_qk, as cpu_gdn.c's l2norm:
 * x * (1 / sqrt(mean(x^2) + 1e-6 / dim)) times dim^-1 (q) or dim^-1/2 (k). */
__global__ void gdn_l2norm_kernel(cuda_gdn_args a, int C) {
    int row = blockIdx.x * GDN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, n = a.k_dim;
    if (row >= a.T * 2 * a.k_heads) return;
    int t = row / (2 * a.k_heads), head = row % (2 * a.k_heads); /* heads [0, k_heads) are q, then k */
    float *x = a.qkv + (size_t)t * C + (size_t)head * n, ss = 0.0f;
    for (int i = lane; i < n; i += 32) ss += x[i] * x[i];
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf((float)n), factor = head < a.k_heads ? inv * inv : inv;
    float r = 1.0f / sqrtf(ss / (float)n + 1e-6f * inv * inv);
    for (int i = lane; i < n; i += 32) x[i] = factor * (x[i] * r);
}

/* One warp per (value head h, value row i, token t with run_first[t]): row i of head h's
 * state in registers (lane holds elements lane + 32 j), walked over t's sequence's tokens of
 * this step as cpu_gdn.c's row_update: S_i *= g; delta = (v_i - S_i . k) beta; S_i += k delta;
 * y_i = S_i . q. A token at position 0 starts from a zero row. */
__global__ void gdn_delta_kernel(cuda_gdn_args a, int C) {
    int Dk = a.k_dim, Dv = a.v_dim, Hv = a.v_heads, lane = threadIdx.x % 32;
    int row_blocks = (Dv + GDN_WARPS - 1) / GDN_WARPS, t = blockIdx.y;
    int h = blockIdx.x / row_blocks, i = (blockIdx.x % row_blocks) * GDN_WARPS + threadIdx.x / 32;
    if (i >= Dv || !a.run_first[t]) return;
    int hk = a.v_tiled ? h % a.k_heads : h / (Hv / a.k_heads);
    size_t conv_floats = (size_t)(a.conv_k - 1) * C;
    float *S = gdn_record(a, a.slot[t]) + conv_floats + ((size_t)h * Dv + i) * Dk, s[GDN_LANE_VALS];
#pragma unroll
    for (int j = 0; j < GDN_LANE_VALS; j++) s[j] = lane + 32 * j < Dk ? S[lane + 32 * j] : 0.0f;
    float A = expf(a.A_log[h]), dt_bias = a.dt_bias[h];
    for (int u = t; u >= 0; u = a.run_next[u]) {
        const float *x = a.qkv + (size_t)u * C, *q = x + (size_t)hk * Dk, *k = x + (size_t)(a.k_heads + hk) * Dk;
        float v = x[(size_t)2 * a.k_heads * Dk + (size_t)h * Dv + i];
        float g = expf(-A * gdn_softplus(a.a[(size_t)u * Hv + h] + dt_bias));
        float beta = gdn_sigmoid(a.b[(size_t)u * Hv + h]);
        int fresh = a.pos[u] == 0;
        float kk[GDN_LANE_VALS], mem = 0.0f, out = 0.0f;
#pragma unroll
        for (int j = 0; j < GDN_LANE_VALS; j++) {
            int d = lane + 32 * j;
            kk[j] = d < Dk ? k[d] : 0.0f;
            s[j] = fresh ? 0.0f : s[j] * g;
            mem += s[j] * kk[j];
        }
        float delta = (v - warp_sum(mem)) * beta;
#pragma unroll
        for (int j = 0; j < GDN_LANE_VALS; j++) {
            int d = lane + 32 * j;
            s[j] += kk[j] * delta;
            out += d < Dk ? s[j] * q[d] : 0.0f;
        }
        out = warp_sum(out);
        if (lane == 0) a.y[(size_t)u * Hv * Dv + (size_t)h * Dv + i] = out;
    }
#pragma unroll
    for (int j = 0; j < GDN_LANE_VALS; j++)
        if (lane + 32 * j < Dk) S[lane + 32 * j] = s[j];
}

/* One warp per (token, value head): y = silu(z) * (rmsnorm(y) * norm), as cpu_gdn.c. */
__global__ void gdn_gated_norm_kernel(cuda_gdn_args a) {
    int row = blockIdx.x * GDN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, Dv = a.v_dim;
    if (row >= a.T * a.v_heads) return;
    float *y = a.y + (size_t)row * Dv, ss = 0.0f;
    const float *z = a.z + (size_t)row * Dv;
    for (int i = lane; i < Dv; i += 32) ss += y[i] * y[i];
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)Dv + a.norm_eps);
    for (int i = lane; i < Dv; i += 32) y[i] = z[i] * gdn_sigmoid(z[i]) * (y[i] * r * a.norm[i]);
}

extern "C" int cuda_gdn_supported(int k_dim, int v_dim, int conv_k) {
    return k_dim > 0 && k_dim <= GDN_MAX_DIM && v_dim > 0 && v_dim <= GDN_MAX_DIM && conv_k >= 1 &&
           conv_k <= GDN_MAX_CONV;
}

extern "C" void cuda_gdn_runs(const int32_t *slot, int T, int max_slots, int32_t *last, int32_t *first, int32_t *next) {
    for (int s = 0; s < max_slots; s++) last[s] = -1;
    for (int t = 0; t < T; t++) {
        int s = slot[t];
        first[t] = last[s] < 0;
        next[t] = -1;
        if (last[s] >= 0) next[last[s]] = t;
        last[s] = t;
    }
}

extern "C" hearth_status cuda_gated_delta(const cuda_gdn_args *a, hearth_error *err) {
    if (a->T <= 0) return HEARTH_OK;
    if (!cuda_gdn_supported(a->k_dim, a->v_dim, a->conv_k) || a->k_heads <= 0 || a->v_heads % a->k_heads)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "cuda_gated_delta: key dim %d, value dim %d (at most %d), conv %d (at most %d), %d value heads "
                       "over %d key heads",
                       a->k_dim, a->v_dim, GDN_MAX_DIM, a->conv_k, GDN_MAX_CONV, a->v_heads, a->k_heads);
    if (a->T > 65535) /* tokens are the grids' y dimension */
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "cuda_gated_delta: %d tokens in one step (at most 65535)", a->T);
    if (a->layer < 0 || a->layer >= a->n_layers)
        return err_set(err, HEARTH_ERR_INVALID, "cuda_gated_delta: state layer %d of %d", a->layer, a->n_layers);
    int C = 2 * a->k_heads * a->k_dim + a->v_heads * a->v_dim, T = a->T;
    cudaStream_t st = cuda_stream();
    gdn_conv_kernel<<<dim3((unsigned)((C + 127) / 128), (unsigned)T), 128, 0, st>>>(*a, C);
    hearth_status s = cuda_launched("gdn_conv", err);
    if (s) return s;
    unsigned qk_rows = (unsigned)T * 2 * a->k_heads, row_blocks = (unsigned)((a->v_dim + GDN_WARPS - 1) / GDN_WARPS);
    gdn_l2norm_kernel<<<(qk_rows + GDN_WARPS - 1) / GDN_WARPS, 32 * GDN_WARPS, 0, st>>>(*a, C);
    if ((s = cuda_launched("gdn_l2norm", err))) return s;
    gdn_delta_kernel<<<dim3((unsigned)a->v_heads * row_blocks, (unsigned)T), 32 * GDN_WARPS, 0, st>>>(*a, C);
    if ((s = cuda_launched("gdn_delta", err))) return s;
    unsigned y_rows = (unsigned)T * a->v_heads;
    gdn_gated_norm_kernel<<<(y_rows + GDN_WARPS - 1) / GDN_WARPS, 32 * GDN_WARPS, 0, st>>>(*a);
    return cuda_launched("gdn_gated_norm", err);
}

extern "C" hearth_status cuda_state_copy(float *dst, const float *src, size_t floats, hearth_error *err) {
    if (dst == src || !floats) return HEARTH_OK;
    return cuda_status(cudaMemcpyAsync(dst, src, floats * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream()),
                       "state copy", err);
}
