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
/* Warps per block of the norm and decode delta kernels: one head (or row) each. */
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

/* Tokens walked in chunks of up to GDN_CH: a sequence's tokens are consecutive in the step
 * (the scheduler's ragged steps) or not (then chunks of one). */
#define GDN_CH 16

/* The chunk of t's sequence that starts at u0: the longest run u0, u0 + 1, ... (at most
 * GDN_CH) that run_next links one to the next; returns (its length, the token after it or
 * -1 after the sequence's last). Every run_next load is independent (no pointer chase). */
static __device__ __forceinline__ int2 gdn_chunk(const cuda_gdn_args &a, int u0) {
    int2 r = make_int2(GDN_CH, -1);
    int prev_ok = 1;
#pragma unroll
    for (int j = 0; j < GDN_CH; j++) {
        int nx = u0 + j < a.T ? a.run_next[u0 + j] : -1;
        if (prev_ok && nx != u0 + j + 1) r = make_int2(j + 1, nx), prev_ok = 0;
        else if (prev_ok && j == GDN_CH - 1) r.y = nx;
    }
    return r;
}

/* Channel c of the consecutive tokens u0 .. u0 + len - 1 (len <= GDN_CH) of one sequence: their
 * inputs loaded together, then each output silu(w . [hist, x]) written in place, the history
 * (the last conv_k - 1 inputs, oldest first) moved along; a token at position 0 starts from
 * zeros. */
static __device__ __forceinline__ void gdn_conv_tokens(const cuda_gdn_args &a, int C, int c, const float *w,
                                                       float *hist, int u0, int len) {
    const int K = a.conv_k;
    float in[GDN_CH];
    int fresh[GDN_CH];
#pragma unroll
    for (int j = 0; j < GDN_CH; j++)
        if (j < len) in[j] = a.qkv[(size_t)(u0 + j) * C + c], fresh[j] = a.pos[u0 + j] == 0;
#pragma unroll
    for (int j = 0; j < GDN_CH; j++) {
        if (j >= len) continue;
        if (fresh[j])
            for (int k = 0; k < K - 1; k++) hist[k] = 0.0f;
        float sum = 0.0f;
        for (int k = 0; k < K - 1; k++) sum += w[k] * hist[k];
        sum += w[K - 1] * in[j];
        for (int k = 0; k + 1 < K - 1; k++) hist[k] = hist[k + 1];
        if (K > 1) hist[K - 2] = in[j];
        a.qkv[(size_t)(u0 + j) * C + c] = sum * gdn_sigmoid(sum);
    }
}

/* Thread (channel c, token t) with run_first[t]: the causal conv of channel c over the
 * tokens of t's sequence in this step (t, run_next[t], ...), its kept inputs in registers
 * from the record, written back at the end; x = silu(conv) in place. A chunk's inputs are
 * loaded together before its outputs are written. A token at position 0 starts from zero
 * inputs. */
__global__ void gdn_conv_kernel(cuda_gdn_args a, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (c >= C || !a.run_first[t]) return;
    int K = a.conv_k;
    float *rec = gdn_record(a, a.slot[t]), hist[GDN_MAX_CONV], w[GDN_MAX_CONV];
    for (int k = 0; k < K; k++) w[k] = a.conv[(size_t)c * K + k];
    for (int k = 0; k < K - 1; k++) hist[k] = rec[(size_t)k * C + c];
    for (int u0 = t; u0 >= 0;) {
        int2 ch = gdn_chunk(a, u0);
        int len = ch.x;
        gdn_conv_tokens(a, C, c, w, hist, u0, len);
        u0 = ch.y;
    }
    for (int k = 0; k < K - 1; k++) rec[(size_t)k * C + c] = hist[k];
}

/* Prefill steps of one sequence (single_run: every token in slot[0], the run in batch order):
 * the same conv with the tokens cut into chunks of L walked in parallel, one warp per chunk
 * and 32 channels, instead of one thread per channel walking them all. A block holds every
 * chunk of its 32 channels, so it first reads each chunk's K - 1 inputs before it (the record's
 * before token 0; zero before a token at position 0) into shared memory, and only after its
 * barrier writes outputs in place and the record (the last chunk's history). */
#define GDN_PC_WARPS 16
__global__ void __launch_bounds__(32 * GDN_PC_WARPS) gdn_conv_run_kernel(cuda_gdn_args a, int C, int L) {
    extern __shared__ float gdn_halo[]; /* [chunk][K - 1][32] */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c = blockIdx.x * 32 + lane, K = a.conv_k, T = a.T;
    const int nch = (T + L - 1) / L;
    const bool on = c < C;
    float *rec = gdn_record(a, a.slot[0]), w[GDN_MAX_CONV], hist[GDN_MAX_CONV];
    for (int ci = warp; ci < nch; ci += GDN_PC_WARPS)
        for (int k = 0; k < K - 1; k++) {
            int u = ci * L - (K - 1) + k; /* the token of history slot k (< 0: the record's) */
            float v = 0.0f;
            if (on) v = u >= 0 ? a.qkv[(size_t)u * C + c] : rec[(size_t)(K - 1 + u) * C + c];
            for (int u2 = u + 1 > 0 ? u + 1 : 0; u2 < ci * L; u2++)
                if (a.pos[u2] == 0) v = 0.0f; /* a later token of the window restarted the sequence */
            gdn_halo[(ci * (K - 1) + k) * 32 + lane] = v;
        }
    __syncthreads();
    if (!on) return;
    for (int k = 0; k < K; k++) w[k] = a.conv[(size_t)c * K + k];
    for (int ci = warp; ci < nch; ci += GDN_PC_WARPS) {
        for (int k = 0; k < K - 1; k++) hist[k] = gdn_halo[(ci * (K - 1) + k) * 32 + lane];
        int end = ci * L + L < T ? ci * L + L : T;
        for (int u0 = ci * L; u0 < end; u0 += GDN_CH) {
            int len = end - u0 < GDN_CH ? end - u0 : GDN_CH;
            gdn_conv_tokens(a, C, c, w, hist, u0, len);
        }
        if (ci == nch - 1)
            for (int k = 0; k < K - 1; k++) rec[(size_t)k * C + c] = hist[k];
    }
}

/* Prefill: each (token, value head)'s decay g and beta, once, in place of a and b (the delta
 * kernel's every thread would compute them per token otherwise). */
template <bool LOG> __global__ void gdn_gate_kernel(cuda_gdn_args a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, Hv = a.v_heads;
    if (i >= a.T * Hv) return;
    int h = i % Hv;
    float A = expf(a.A_log[h]), lg = -A * gdn_softplus(a.a[i] + a.dt_bias[h]);
    a.a[i] = LOG ? lg : expf(lg); /* the chunked form takes the log of the decay */
    a.b[i] = gdn_sigmoid(a.b[i]);
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

/* One token of cpu_gdn.c's row_update on a state row spread over LANES lanes (element
 * d0 + LANES m in s[m]): S_i *= g (0: a token at position 0 starts from a zero row);
 * delta = (v_i - S_i . k) beta; S_i += k delta; returns y_i = S_i . q in every lane. */
template <int NV, int LANES>
static __device__ __forceinline__ float gdn_row_step(float (&s)[NV], const float *k, const float *q, int d0, int Dk,
                                                     float g, float beta, float v, int fresh) {
    float kk[NV], mem = 0.0f, out = 0.0f;
#pragma unroll
    for (int m = 0; m < NV; m++) {
        int d = d0 + LANES * m;
        kk[m] = d < Dk ? k[d] : 0.0f;
        s[m] = fresh ? 0.0f : s[m] * g;
        mem += s[m] * kk[m];
    }
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) mem += __shfl_xor_sync(0xffffffffu, mem, o);
    float delta = (v - mem) * beta;
#pragma unroll
    for (int m = 0; m < NV; m++) {
        int d = d0 + LANES * m;
        s[m] += kk[m] * delta;
        out += d < Dk ? s[m] * q[d] : 0.0f;
    }
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) out += __shfl_xor_sync(0xffffffffu, out, o);
    return out;
}

/* Decode steps (at most GDN_DECODE_T tokens, a sequence's one or few): one warp per (value head
 * h, value row i, token t with run_first[t]), row i of head h's state in registers (lane
 * holds elements lane + 32 j), loads straight from global memory (the chunked kernel below
 * stages through shared memory, a round trip and two barriers that a step of one token per
 * sequence does not repay), walked over t's tokens as cpu_gdn.c's row_update (see below). */
#define GDN_DECODE_T 8
#define GDN_LANE_VALS (GDN_MAX_DIM / 32)
__global__ void gdn_delta_decode_kernel(cuda_gdn_args a, int C) {
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
        float out = gdn_row_step<GDN_LANE_VALS, 32>(s, k, q, lane, Dk, g, beta, v, a.pos[u] == 0);
        if (lane == 0) a.y[(size_t)u * Hv * Dv + (size_t)h * Dv + i] = out;
    }
#pragma unroll
    for (int j = 0; j < GDN_LANE_VALS; j++)
        if (lane + 32 * j < Dk) S[lane + 32 * j] = s[j];
}

/* 16-byte and 4-byte copies global -> shared without registers (cp.async, sm_80+). */
static __device__ __forceinline__ void gdn_cp16(void *smem, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}
static __device__ __forceinline__ void gdn_cp4(void *smem, const void *gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}

/* The delta rule for longer steps (prefill): GDN_DW warps per block, each 4 value rows of head h (8 lanes a row, lane
 * l of a row holding its state elements l + 8 m), for t's sequence when run_first[t]. The
 * block walks the sequence's tokens of this step in chunks of GDN_CH (gdn_chunk): the
 * chunk's q and k (shared by every row of the head), its rows' values, g and beta (a and b
 * after gdn_gate_kernel) and positions
 * are copied into shared memory with cp.async while the previous chunk is computed. Per token,
 * as cpu_gdn.c's row_update: S_i *= g; delta = (v_i - S_i . k) beta; S_i += k delta;
 * y_i = S_i . q. A token at position 0 starts from a zero row. NE: state elements per lane
 * (k_dim <= 8 NE). */
#define GDN_DW 8
#define GDN_ROWS (GDN_DW * 4) /* value rows per block */
static size_t gdn_delta_smem(int Dk) { return 2 * (size_t)GDN_CH * (2 * Dk + GDN_ROWS + 3) * sizeof(float); }

template <int NE> __global__ void __launch_bounds__(GDN_DW * 32) gdn_delta_kernel(cuda_gdn_args a, int C, int vec16) {
    extern __shared__ __align__(16) float gdn_sm[];
    __shared__ int s_u0[2], s_len[2], s_next;
    const int Dk = a.k_dim, Dv = a.v_dim, Hv = a.v_heads, t = blockIdx.y;
    if (!a.run_first[t]) return; /* uniform over the block */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 8, l = lane % 8;
    const int rblocks = (Dv + GDN_ROWS - 1) / GDN_ROWS, h = blockIdx.x / rblocks;
    const int i0 = (blockIdx.x % rblocks) * GDN_ROWS, rloc = warp * 4 + r, i = i0 + rloc;
    const int hk = a.v_tiled ? h % a.k_heads : h / (Hv / a.k_heads);
    const int per = GDN_CH * (2 * Dk + GDN_ROWS + 3); /* floats of one buffer */
    /* warp 0: the next chunk's start and length into buffer b */
    auto walk = [&](int b, int u0) {
        int2 ch = u0 >= 0 ? gdn_chunk(a, u0) : make_int2(0, -1);
        if (lane == 0) s_u0[b] = u0, s_len[b] = ch.x, s_next = ch.y;
    };
    /* every thread: buffer b's copies (then one commit) */
    auto issue = [&](int b) {
        int u0 = s_u0[b], len = s_len[b];
        float *B = gdn_sm + b * per, *sq = B, *sk = B + GDN_CH * Dk, *sv = B + 2 * GDN_CH * Dk;
        float *sa = sv + GDN_CH * GDN_ROWS, *sb = sa + GDN_CH;
        int *sp = (int *)(sb + GDN_CH);
        const float *q0 = a.qkv + (size_t)hk * Dk, *k0 = a.qkv + (size_t)(a.k_heads + hk) * Dk;
        if (vec16) {
            int n4 = Dk / 4;
            for (int idx = threadIdx.x; idx < 2 * len * n4; idx += blockDim.x) {
                int which = idx / (len * n4), rem = idx % (len * n4), j = rem / n4, d = (rem % n4) * 4;
                gdn_cp16((which ? sk : sq) + j * Dk + d, (which ? k0 : q0) + (size_t)(u0 + j) * C + d);
            }
        } else {
            for (int idx = threadIdx.x; idx < 2 * len * Dk; idx += blockDim.x) {
                int which = idx / (len * Dk), rem = idx % (len * Dk), j = rem / Dk, d = rem % Dk;
                gdn_cp4((which ? sk : sq) + j * Dk + d, (which ? k0 : q0) + (size_t)(u0 + j) * C + d);
            }
        }
        const float *v0 = a.qkv + (size_t)2 * a.k_heads * Dk + (size_t)h * Dv;
        for (int idx = threadIdx.x; idx < len * GDN_ROWS; idx += blockDim.x) {
            int j = idx / GDN_ROWS, row = idx % GDN_ROWS;
            if (i0 + row < Dv) gdn_cp4(sv + idx, v0 + (size_t)(u0 + j) * C + i0 + row);
        }
        for (int j = threadIdx.x; j < len; j += blockDim.x) {
            gdn_cp4(sa + j, a.a + (size_t)(u0 + j) * Hv + h);
            gdn_cp4(sb + j, a.b + (size_t)(u0 + j) * Hv + h);
            gdn_cp4(sp + j, a.pos + u0 + j);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    size_t conv_floats = (size_t)(a.conv_k - 1) * C;
    float *S = gdn_record(a, a.slot[t]) + conv_floats + ((size_t)h * Dv + (i < Dv ? i : 0)) * Dk, s[NE];
#pragma unroll
    for (int m = 0; m < NE; m++) s[m] = i < Dv && l + 8 * m < Dk ? S[l + 8 * m] : 0.0f;
    if (warp == 0) walk(0, t);
    __syncthreads();
    issue(0);
    for (int c = 0;; c++) {
        const int b = c & 1, u0 = s_u0[b], len = s_len[b];
        if (len == 0) break; /* uniform: s_len[b] was written before the last barrier */
        if (warp == 0) walk(b ^ 1, s_next);
        __syncthreads(); /* the next chunk's range is known; every warp is done with buffer b ^ 1 */
        issue(b ^ 1);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); /* chunk c's copies (this thread's) */
        __syncthreads();                                       /* ... and every thread's */
        const float *B = gdn_sm + b * per, *sq = B, *sk = B + GDN_CH * Dk, *sv = B + 2 * GDN_CH * Dk;
        const float *sa = sv + GDN_CH * GDN_ROWS, *sb = sa + GDN_CH;
        const int *sp = (const int *)(sb + GDN_CH);
        for (int j = 0; j < len; j++) {
            float out = gdn_row_step<NE, 8>(s, sk + j * Dk, sq + j * Dk, l, Dk, sa[j], sb[j], sv[j * GDN_ROWS + rloc],
                                            sp[j] == 0);
            if (l == 0 && i < Dv) a.y[(size_t)(u0 + j) * Hv * Dv + (size_t)h * Dv + i] = out;
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    if (i < Dv)
#pragma unroll
        for (int m = 0; m < NE; m++)
            if (l + 8 * m < Dk) S[l + 8 * m] = s[m];
}

template <int NE> static hearth_status launch_delta(const cuda_gdn_args *a, int C, hearth_error *err) {
    static int raised; /* > 48 KB of dynamic shared memory (k_dim over 176) needs an opt-in, once per variant */
    size_t smem = gdn_delta_smem(8 * NE);
    if (!raised && gdn_delta_smem(a->k_dim) > 48 * 1024) {
        if (cuda_status(cudaFuncSetAttribute(gdn_delta_kernel<NE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                        "cudaFuncSetAttribute(gdn_delta)", err))
            return HEARTH_ERR_IO;
        raised = 1;
    }
    /* 16-byte copies of q and k where every row starts 16-byte aligned */
    int vec16 = a->k_dim % 4 == 0 && C % 4 == 0 && (uintptr_t)a->qkv % 16 == 0;
    unsigned rblocks = (unsigned)((a->v_dim + GDN_ROWS - 1) / GDN_ROWS);
    gdn_delta_kernel<NE><<<dim3((unsigned)a->v_heads * rblocks, (unsigned)a->T), GDN_DW * 32,
                           gdn_delta_smem(a->k_dim), cuda_stream()>>>(*a, C, vec16);
    return cuda_launched("gdn_delta", err);
}

/* ---- The chunked form of the delta rule (the fast tier's prefill of one sequence) ----
 *
 * Within a chunk of BT tokens starting from state S0 ([Dv][Dk]), with gamma_t the product
 * of the chunk's decays up to t (G_t = log gamma_t, a running sum of the log decays), the
 * token walk's updates delta_t = beta_t (v_t - g_t S_{t-1} k_t) solve the lower-triangular
 * system (I + A) Delta = diag(beta) (V - diag(gamma) K S0^T), A[t][s] = beta_t
 * (gamma_t / gamma_s) (k_t . k_s) for s < t. With W = (I + A)^-1 diag(beta), U = W V and
 * Wk = W diag(gamma) K: Delta = U - Wk S0^T; the outputs are Y = diag(gamma) Q S0^T + P Delta
 * with P[t][s] = (gamma_t / gamma_s) (q_t . k_s) for s <= t; the next chunk starts from
 * gamma_last S0 + Delta^T diag(gamma_last / gamma) K. gdn_chunk_prep_kernel computes W, U (in
 * place of v), Wk and P of every (chunk, value head) in parallel; gdn_chunk_walk_kernel walks
 * the chunks of each (value head, tile of GDN_DVT value rows) with the state in shared
 * memory. Everything in float32; a row of a partial chunk past the step is zero (beta 0,
 * log decay 0), so it changes nothing. */
#define GDN_BT CUDA_GDN_CHUNK
#define GDN_DVT 32
#define GDN_CK_THREADS 256

/* G[0 .. BT) = running sums of the log decays in G (one warp; two tokens a lane), then
 * gam[t] = exp(G[t]) and E[t] = exp(G[BT - 1] - G[t]). Both kernels call it on the same
 * inputs, so they get the same bits. */
static __device__ __forceinline__ void gdn_chunk_scan(float *G, float *gam, float *E, int lane) {
    float x0 = G[2 * lane], x1 = G[2 * lane + 1], pair = x0 + x1, run = pair;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        float y = __shfl_up_sync(0xffffffffu, run, o);
        if (lane >= o) run += y;
    }
    float before = __shfl_up_sync(0xffffffffu, run, 1);
    if (lane == 0) before = 0.0f;
    float g0 = before + x0, g1 = before + pair, last = __shfl_sync(0xffffffffu, g1, 31);
    G[2 * lane] = g0, G[2 * lane + 1] = g1;
    gam[2 * lane] = expf(g0), gam[2 * lane + 1] = expf(g1);
    E[2 * lane] = expf(last - g0), E[2 * lane + 1] = expf(last - g1);
}

/* A 4-byte copy global -> shared that writes zero instead when !on (cp.async's source size
 * 0: nothing is read; src must still be an address). */
static __device__ __forceinline__ void gdn_cp4z(float *smem, const float *gmem, bool on) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem), "r"(on ? 4 : 0));
}
static __device__ __forceinline__ void gdn_commit() { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void gdn_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* 16-byte copies global -> shared, zero-filled when !on (both addresses 16-byte aligned). */
static __device__ __forceinline__ void gdn_cp16z(float *smem, const float *gmem, bool on) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem), "r"(on ? 16 : 0));
}

/* Rows [0, GDN_BT) of the first W floats of each row into shared rows of stride ds: row t from
 * src + t * sstride where t < len, zero past it, 16 bytes a copy (W, ds, sstride and both bases
 * multiples of 4 floats; asynchronous: the caller commits and waits). Each thread keeps one
 * column and walks the rows. */
static __device__ __forceinline__ void gdn_load_rows(float *dst, int ds, const float *src, size_t sstride, int len,
                                                     int W) {
    const int units = W / 4, per = GDN_CK_THREADS / units, tid = threadIdx.x;
    if (tid >= per * units) return;
    const int c = (tid % units) * 4;
    for (int t = tid / units; t < GDN_BT; t += per) {
        bool on = t < len;
        gdn_cp16z(dst + t * ds + c, src + (on ? (size_t)t * sstride + c : 0), on);
    }
}

/* Shared rows of both kernels: strides of 4 floats past the width, so that rows stay 16-byte
 * aligned (float4 reads and 16-byte copies) and the float4 reads of a quarter warp fall on
 * distinct banks. */
#define GDN_WPAD 4
static __device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
static __device__ __forceinline__ void st4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
static __device__ __forceinline__ float f4at(const float4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

static size_t gdn_prep_smem(int Dk, int Dv) {
    size_t ks = (size_t)Dk + GDN_WPAD, qv = (size_t)(Dk > Dv ? Dk : Dv) + GDN_WPAD, as = GDN_BT + GDN_WPAD;
    return sizeof(float) * (GDN_BT * (ks + qv + 2 * as) + 4 * GDN_BT);
}

/* Block (chunk, value head h): K and Q of the chunk into shared memory, the running log
 * decays, A (strictly lower, beta-scaled) and P (lower with the diagonal) as 4 x 4 tiles per
 * thread, P's rows to the scratch; W column by column (forward substitution, one thread a
 * column) while V is copied into Q's place; then U = W V over v in qkv and Wk = W diag(gamma)
 * K to the scratch. The products read float4s (four steps of the inner dimension, or four
 * columns): Dk and Dv multiples of 4, rows 16-byte aligned (gdn_chunked checks). */
__global__ void __launch_bounds__(GDN_CK_THREADS) gdn_chunk_prep_kernel(cuda_gdn_args a, int C) {
    extern __shared__ __align__(16) float gdn_ck[];
    const int Dk = a.k_dim, Dv = a.v_dim, Hv = a.v_heads, h = blockIdx.y, u0 = blockIdx.x * GDN_BT, T = a.T;
    const int len = T - u0 < GDN_BT ? T - u0 : GDN_BT, tid = threadIdx.x;
    const int hk = a.v_tiled ? h % a.k_heads : h / (Hv / a.k_heads);
    const int ks = Dk + GDN_WPAD, qv = (Dk > Dv ? Dk : Dv) + GDN_WPAD, as = GDN_BT + GDN_WPAD;
    float *Ks = gdn_ck, *Qs = Ks + GDN_BT * ks, *As = Qs + GDN_BT * qv, *Ws = As + GDN_BT * as;
    float *G = Ws + GDN_BT * as, *bt = G + GDN_BT, *gam = bt + GDN_BT, *E = gam + GDN_BT;
    float *Wk = a.scratch, *P = a.scratch + (size_t)T * Hv * Dk;
    const float *row0 = a.qkv + (size_t)u0 * C;
    gdn_load_rows(Ks, ks, row0 + (size_t)(a.k_heads + hk) * Dk, C, len, Dk);
    gdn_load_rows(Qs, qv, row0 + (size_t)hk * Dk, C, len, Dk);
    if (tid < GDN_BT) {
        bool on = tid < len;
        size_t i = on ? (size_t)(u0 + tid) * Hv + h : 0;
        gdn_cp4z(bt + tid, a.b + i, on);
        gdn_cp4z(G + tid, a.a + i, on);
    }
    gdn_commit();
    gdn_wait_all();
    __syncthreads();
    if (tid < 32) gdn_chunk_scan(G, gam, E, tid);
    __syncthreads();
    const int tx = tid % 16, ty = tid / 16; /* rows ty + 16 r; A / P columns tx + 16 j, U / Wk 4 tx (+ 64) */
    {
        float ak[4][4] = {}, aq[4][4] = {};
#pragma unroll 2
        for (int d = 0; d < Dk; d += 4) {
            float4 kt[4], qt[4], kr[4];
#pragma unroll
            for (int r = 0; r < 4; r++)
                kt[r] = ld4(Ks + (ty + 16 * r) * ks + d), qt[r] = ld4(Qs + (ty + 16 * r) * qv + d);
#pragma unroll
            for (int j = 0; j < 4; j++) kr[j] = ld4(Ks + (tx + 16 * j) * ks + d);
#pragma unroll
            for (int e = 0; e < 4; e++)
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        ak[r][j] += f4at(kt[r], e) * f4at(kr[j], e);
                        aq[r][j] += f4at(qt[r], e) * f4at(kr[j], e);
                    }
        }
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int t = ty + 16 * r, sj = tx + 16 * j;
                float e = sj <= t ? expf(G[t] - G[sj]) : 0.0f;
                As[t * as + sj] = sj < t ? bt[t] * e * ak[r][j] : 0.0f;
                if (t < len) P[((size_t)(u0 + t) * Hv + h) * GDN_BT + sj] = e * aq[r][j];
            }
    }
    __syncthreads();
    const size_t v_off = (size_t)2 * a.k_heads * Dk + (size_t)h * Dv;
    gdn_load_rows(Qs, qv, row0 + v_off, C, len, Dv); /* Q is done with: V in its place, during the solve */
    gdn_commit();
    if (tid < GDN_BT) { /* column j of W: W[t][j] = beta_t [t == j] - sum_{j <= s < t} A[t][s] W[s][j] */
        const int j = tid;
        for (int t = 0; t < j; t++) Ws[t * as + j] = 0.0f;
        for (int t = j; t < GDN_BT; t++) {
            const float *At = As + t * as;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            int sj = j;
            for (; sj + 3 < t; sj += 4) {
                s0 += At[sj] * Ws[sj * as + j];
                s1 += At[sj + 1] * Ws[(sj + 1) * as + j];
                s2 += At[sj + 2] * Ws[(sj + 2) * as + j];
                s3 += At[sj + 3] * Ws[(sj + 3) * as + j];
            }
            for (; sj < t; sj++) s0 += At[sj] * Ws[sj * as + j];
            Ws[t * as + j] = (t == j ? bt[t] : 0.0f) - ((s0 + s1) + (s2 + s3));
        }
    }
    gdn_wait_all();
    __syncthreads();
    for (int pass = 0; pass < 2; pass++) { /* U = W V, then Wk = W diag(gamma) K */
        const int D = pass ? Dk : Dv, stride = pass ? ks : qv;
        const float *X = pass ? Ks : Qs;
        const bool on0 = 4 * tx < D, on1 = 64 + 4 * tx < D; /* D <= 128 */
        float acc[4][8] = {};
#pragma unroll 2
        for (int sj = 0; sj < GDN_BT; sj += 4) {
            float4 w[4];
#pragma unroll
            for (int r = 0; r < 4; r++) w[r] = ld4(Ws + (ty + 16 * r) * as + sj);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float sc = pass ? gam[sj + e] : 1.0f, *xr = X + (sj + e) * stride + 4 * tx;
                const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x0 = on0 ? ld4(xr) : z,
                             x1 = on1 ? ld4(xr + 64) : z;
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const float we = f4at(w[r], e) * sc;
#pragma unroll
                    for (int m = 0; m < 4; m++) acc[r][m] += we * f4at(x0, m), acc[r][4 + m] += we * f4at(x1, m);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int t = ty + 16 * r;
            if (t >= len) continue;
            float *out = pass ? Wk + ((size_t)(u0 + t) * Hv + h) * Dk : a.qkv + (size_t)(u0 + t) * C + v_off;
            if (on0) st4(out + 4 * tx, make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
            if (on1) st4(out + 64 + 4 * tx, make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]));
        }
    }
}

static size_t gdn_walk_smem(int Dk) {
    size_t ks = (size_t)Dk + GDN_WPAD, ps = GDN_BT + GDN_WPAD, ds = GDN_DVT + GDN_WPAD;
    return sizeof(float) * (4 * GDN_BT * ks + 2 * GDN_BT * ps + 3 * GDN_BT * ds + (size_t)Dk * ds + 4 * GDN_BT);
}

/* Block (value head h, value rows i0 .. i0 + GDN_DVT): the state's rows S[i][.] as S^T in
 * shared memory (zero for a sequence starting at position 0), then chunk by chunk: Delta =
 * U - Wk S^T and Q S^T; Y = diag(gamma) Q S^T + P Delta out; S^T = gamma_last S^T + K^T
 * diag(E) Delta. Thread (tx, ty) owns value columns 4 tx .. 4 tx + 3 throughout: rows ty and
 * ty + 32 of Delta and Y, key rows 4 ty .. 4 ty + 3 of S^T; every shared read is a float4
 * (four steps of the inner dimension, or four columns). The next chunk's P, K, U and log
 * decays are copied into a second set of buffers while this one is computed, its Wk and Q
 * into the only set once the first product is done with them. The record gets the last
 * state. Needs Dk and Dv multiples of 4 and 16-byte aligned rows (gdn_chunked checks). */
__global__ void __launch_bounds__(GDN_CK_THREADS, 1) gdn_chunk_walk_kernel(cuda_gdn_args a, int C) {
    extern __shared__ __align__(16) float gdn_ck[];
    const int Dk = a.k_dim, Dv = a.v_dim, Hv = a.v_heads, T = a.T, tid = threadIdx.x;
    const int tiles = (Dv + GDN_DVT - 1) / GDN_DVT, h = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * GDN_DVT;
    const int hk = a.v_tiled ? h % a.k_heads : h / (Hv / a.k_heads);
    const int ks = Dk + GDN_WPAD, ps = GDN_BT + GDN_WPAD, ds = GDN_DVT + GDN_WPAD;
    float *Wks = gdn_ck, *Qs = Wks + GDN_BT * ks, *Kb = Qs + GDN_BT * ks, *Pb = Kb + 2 * GDN_BT * ks;
    float *Db = Pb + 2 * GDN_BT * ps, *DE = Db + 2 * GDN_BT * ds, *Ss = DE + GDN_BT * ds, *Gb = Ss + Dk * ds;
    float *gam = Gb + 2 * GDN_BT, *E = gam + GDN_BT;
    const float *Wk = a.scratch, *P = a.scratch + (size_t)T * Hv * Dk;
    const size_t q_off = (size_t)hk * Dk, k_off = (size_t)(a.k_heads + hk) * Dk;
    const size_t v_off = (size_t)2 * a.k_heads * Dk + (size_t)h * Dv + i0;
    float *S = gdn_record(a, a.slot[0]) + (size_t)(a.conv_k - 1) * C + ((size_t)h * Dv + i0) * Dk;
    const int fresh = a.pos[0] == 0, rows = Dv - i0 < GDN_DVT ? Dv - i0 : GDN_DVT;
    auto load_wq = [&](int u0, int len) {
        gdn_load_rows(Wks, ks, Wk + ((size_t)u0 * Hv + h) * Dk, (size_t)Hv * Dk, len, Dk);
        gdn_load_rows(Qs, ks, a.qkv + (size_t)u0 * C + q_off, C, len, Dk);
    };
    auto load_pku = [&](int b, int u0, int len) {
        float *Ds = Db + b * GDN_BT * ds;
        gdn_load_rows(Pb + b * GDN_BT * ps, ps, P + ((size_t)u0 * Hv + h) * GDN_BT, (size_t)Hv * GDN_BT, len, GDN_BT);
        gdn_load_rows(Kb + b * GDN_BT * ks, ks, a.qkv + (size_t)u0 * C + k_off, C, len, Dk);
        gdn_load_rows(Ds, ds, a.qkv + (size_t)u0 * C + v_off, C, len, rows);
        if (rows < GDN_DVT) /* a last tile's columns past Dv (the step before wrote into them) */
            for (int idx = tid; idx < GDN_BT * GDN_DVT; idx += blockDim.x)
                if (idx % GDN_DVT >= rows) Ds[idx / GDN_DVT * ds + idx % GDN_DVT] = 0.0f;
        if (tid < GDN_BT) {
            bool on = tid < len;
            gdn_cp4z(Gb + b * GDN_BT + tid, a.a + (on ? (size_t)(u0 + tid) * Hv + h : 0), on);
        }
    };
    for (int idx = tid; idx < GDN_DVT * Dk; idx += blockDim.x) {
        int i = idx / Dk, d = idx % Dk;
        Ss[d * ds + i] = i < rows && !fresh ? S[(size_t)i * Dk + d] : 0.0f;
    }
    {
        int len0 = T < GDN_BT ? T : GDN_BT;
        load_wq(0, len0), load_pku(0, 0, len0);
        gdn_commit();
    }
    const int tx = tid % 8, ty = tid / 8, c0 = 4 * tx;
    for (int u0 = 0, b = 0; u0 < T; u0 += GDN_BT, b ^= 1) {
        const int len = T - u0 < GDN_BT ? T - u0 : GDN_BT, n0 = u0 + GDN_BT;
        const int nlen = T - n0 < GDN_BT ? T - n0 : GDN_BT; /* the next chunk's (<= 0: none) */
        float *Ks = Kb + b * GDN_BT * ks, *Ps = Pb + b * GDN_BT * ps, *Ds = Db + b * GDN_BT * ds, *G = Gb + b * GDN_BT;
        gdn_wait_all();
        __syncthreads(); /* this chunk's rows are in; the other set is free */
        if (nlen > 0) load_pku(b ^ 1, n0, nlen), gdn_commit();
        if (tid < 32) gdn_chunk_scan(G, gam, E, tid);
        float dl[2][4] = {}, yq[2][4] = {};
#pragma unroll 2
        for (int d = 0; d < Dk; d += 4) {
            float4 w[2], q[2], sv[4];
#pragma unroll
            for (int r = 0; r < 2; r++)
                w[r] = ld4(Wks + (ty + 32 * r) * ks + d), q[r] = ld4(Qs + (ty + 32 * r) * ks + d);
#pragma unroll
            for (int e = 0; e < 4; e++) sv[e] = ld4(Ss + (d + e) * ds + c0);
#pragma unroll
            for (int e = 0; e < 4; e++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float we = f4at(w[r], e), qe = f4at(q[r], e);
#pragma unroll
                    for (int j = 0; j < 4; j++) dl[r][j] += we * f4at(sv[e], j), yq[r][j] += qe * f4at(sv[e], j);
                }
        }
        __syncthreads(); /* the scan's gam and E are written; Wk and Q are free */
        if (nlen > 0) load_wq(n0, nlen), gdn_commit();
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = ty + 32 * r;
            float4 u = ld4(Ds + t * ds + c0);
            float4 dv = make_float4(u.x - dl[r][0], u.y - dl[r][1], u.z - dl[r][2], u.w - dl[r][3]);
            const float e = E[t];
            st4(Ds + t * ds + c0, dv);
            st4(DE + t * ds + c0, make_float4(e * dv.x, e * dv.y, e * dv.z, e * dv.w));
#pragma unroll
            for (int j = 0; j < 4; j++) yq[r][j] *= gam[t];
        }
        __syncthreads(); /* Delta is whole */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = ty + 32 * r;
            float acc[4] = {yq[r][0], yq[r][1], yq[r][2], yq[r][3]};
            for (int sj = 0; sj <= t; sj += 4) { /* P[t][s] is 0 past s = t */
                const float4 p = ld4(Ps + t * ps + sj);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float4 dv = ld4(Ds + (sj + e) * ds + c0);
                    const float pe = f4at(p, e);
                    acc[0] += pe * dv.x, acc[1] += pe * dv.y, acc[2] += pe * dv.z, acc[3] += pe * dv.w;
                }
            }
            if (t < len && c0 < rows)
                st4(a.y + (size_t)(u0 + t) * Hv * Dv + (size_t)h * Dv + i0 + c0,
                    make_float4(acc[0], acc[1], acc[2], acc[3]));
        }
        float su[4][4] = {};
        if (4 * ty < Dk) {
#pragma unroll 4
            for (int sj = 0; sj < GDN_BT; sj++) {
                const float4 kv = ld4(Ks + sj * ks + 4 * ty), dd = ld4(DE + sj * ds + c0);
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const float km = f4at(kv, m);
                    su[m][0] += km * dd.x, su[m][1] += km * dd.y, su[m][2] += km * dd.z, su[m][3] += km * dd.w;
                }
            }
            const float last = gam[GDN_BT - 1];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                float *sp = Ss + (4 * ty + m) * ds + c0;
                float4 s = ld4(sp);
                st4(sp, make_float4(last * s.x + su[m][0], last * s.y + su[m][1], last * s.z + su[m][2],
                                    last * s.w + su[m][3]));
            }
        }
    }
    __syncthreads(); /* every thread's last update of S^T */
    for (int idx = tid; idx < GDN_DVT * Dk; idx += blockDim.x) {
        int i = idx / Dk, d = idx % Dk;
        if (i < rows) S[(size_t)i * Dk + d] = Ss[d * ds + i];
    }
}

/* Whether this device gives the chunked kernels their shared memory (both need more than
 * 48 KB, the walk about 212 KB: Hopper's 227 KB, not Ampere's 163 KB or Ada's 99 KB, where
 * the token walk runs instead); opts them in the first time. */
static int gdn_chunk_ready(void) {
    static int ready = -1;
    if (ready >= 0) return ready;
    int dev = 0, optin = 0;
    size_t pre = gdn_prep_smem(CUDA_GDN_CHUNK_DIM, CUDA_GDN_CHUNK_DIM), walk = gdn_walk_smem(CUDA_GDN_CHUNK_DIM);
    ready = cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
            (size_t)optin >= pre && (size_t)optin >= walk &&
            cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pre) ==
                cudaSuccess &&
            cudaFuncSetAttribute(gdn_chunk_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)walk) ==
                cudaSuccess;
    if (!ready) cudaGetLastError(); /* clear what a refused attribute left */
    return ready;
}

extern "C" int cuda_gdn_chunk_device(void) { return gdn_chunk_ready(); }

static hearth_status gdn_chunked(const cuda_gdn_args *a, int C, hearth_error *err) {
    cudaStream_t st = cuda_stream();
    unsigned n = (unsigned)a->T * (unsigned)a->v_heads, nch = (unsigned)((a->T + GDN_BT - 1) / GDN_BT);
    gdn_gate_kernel<true><<<(n + 255) / 256, 256, 0, st>>>(*a);
    hearth_status s = cuda_launched("gdn_gate", err);
    if (s) return s;
    gdn_chunk_prep_kernel<<<dim3(nch, (unsigned)a->v_heads), GDN_CK_THREADS, gdn_prep_smem(a->k_dim, a->v_dim), st>>>(
        *a, C);
    if ((s = cuda_launched("gdn_chunk_prep", err))) return s;
    unsigned tiles = (unsigned)((a->v_dim + GDN_DVT - 1) / GDN_DVT);
    gdn_chunk_walk_kernel<<<(unsigned)a->v_heads * tiles, GDN_CK_THREADS, gdn_walk_smem(a->k_dim), st>>>(*a, C);
    return cuda_launched("gdn_chunk_walk", err);
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
    /* the conv: a prefill step of one sequence in parallel chunks (at most as many as the
     * shared memory holds the histories of, 64), else each channel's run walked whole */
    int hist = a->conv_k - 1, max_ch = hist > 0 ? (48 * 1024 / 4) / (hist * 32) : 64;
    if (max_ch > 64) max_ch = 64;
    if (a->single_run && T > GDN_DECODE_T) {
        int L = (T + max_ch - 1) / max_ch, nch = (T + L - 1) / L;
        gdn_conv_run_kernel<<<(unsigned)((C + 31) / 32), 32 * GDN_PC_WARPS, (size_t)nch * hist * 32 * sizeof(float),
                              st>>>(*a, C, L);
    } else {
        gdn_conv_kernel<<<dim3((unsigned)((C + 127) / 128), (unsigned)T), 128, 0, st>>>(*a, C);
    }
    hearth_status s = cuda_launched("gdn_conv", err);
    if (s) return s;
    unsigned qk_rows = (unsigned)T * 2 * a->k_heads;
    gdn_l2norm_kernel<<<(qk_rows + GDN_WARPS - 1) / GDN_WARPS, 32 * GDN_WARPS, 0, st>>>(*a, C);
    if ((s = cuda_launched("gdn_l2norm", err))) return s;
    if (a->chunked && a->single_run && a->scratch && T >= CUDA_GDN_CHUNK_MIN_T &&
        cuda_gdn_chunk_takes(a->k_dim, a->v_dim) && (uintptr_t)a->qkv % 16 == 0 && (uintptr_t)a->scratch % 16 == 0 &&
        (uintptr_t)a->y % 16 == 0 && gdn_chunk_ready()) {
        s = gdn_chunked(a, C, err);
    } else if (T <= GDN_DECODE_T) {
        unsigned row_blocks = (unsigned)((a->v_dim + GDN_WARPS - 1) / GDN_WARPS);
        gdn_delta_decode_kernel<<<dim3((unsigned)a->v_heads * row_blocks, (unsigned)T), 32 * GDN_WARPS, 0, st>>>(*a, C);
        s = cuda_launched("gdn_delta", err);
    } else { /* g and beta once, then the variant whose 8 lanes a row hold the key dim */
        unsigned n = (unsigned)T * (unsigned)a->v_heads;
        gdn_gate_kernel<false><<<(n + 255) / 256, 256, 0, st>>>(*a);
        if ((s = cuda_launched("gdn_gate", err))) return s;
        int k8 = (a->k_dim + 7) / 8;
        if (k8 <= 2) s = launch_delta<2>(a, C, err);
        else if (k8 <= 4) s = launch_delta<4>(a, C, err);
        else if (k8 <= 8) s = launch_delta<8>(a, C, err);
        else if (k8 <= 16) s = launch_delta<16>(a, C, err);
        else s = launch_delta<32>(a, C, err);
    }
    if (s) return s;
    unsigned y_rows = (unsigned)T * a->v_heads;
    gdn_gated_norm_kernel<<<(y_rows + GDN_WARPS - 1) / GDN_WARPS, 32 * GDN_WARPS, 0, st>>>(*a);
    return cuda_launched("gdn_gated_norm", err);
}

extern "C" hearth_status cuda_state_copy(float *dst, const float *src, size_t floats, hearth_error *err) {
    if (dst == src || !floats) return HEARTH_OK;
    return cuda_status(cudaMemcpyAsync(dst, src, floats * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream()),
                       "state copy", err);
}
