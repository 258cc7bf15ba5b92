/* cuda_sample.cu: sampling for every logits row of a step in one kernel launch, one block
 * per row, with sampler.c's semantics: a constraint's token mask (forbidden tokens -inf, as
 * generate.c's constrained_logits on the host), logit bias, then repetition / presence / frequency
 * penalties, then (temperature > 0) candidates within 40 temperatures of the best, top-k,
 * top-p over the top-k mass, min-p relative to the best, a draw; greedy at temperature 0;
 * logprobs of the processed logits. The sorted order (value desc, id asc) is never
 * materialized: each filter's boundary is found by radix descent over the float bits (then
 * the ids, for ties), counting tokens or their probability mass. Masses are 64-bit fixed
 * point so every sum is exact and order-free: a row's result depends on its row alone.
 * Draws use Philox keyed by (seed, position). Must not allocate or sync except in
 * cuda_sampler_create / cuda_sampler_run's final wait. */
#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/cuda/cuda_sample.h"
#include "backend/cuda/cuda_sample_rows.h"
}
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_MAX_TOP HEARTH_MAX_TOP_LOGPROBS
#define ROW_ENTRIES CUDA_SAMPLE_ROW_ENTRIES

/* A row's parameters and its results (cuda_sample_rows.h) */
typedef cuda_sample_row_params row_params;
typedef cuda_sample_row_out row_out;

struct cuda_sampler {
    int max_rows, vocab;
    row_params *d_params, *h_params; /* h_: pinned staging */
    int32_t *d_eid, *h_eid;          /* [max_rows * ROW_ENTRIES] entry ids */
    float *d_eval, *h_eval;          /* their bias values / penalty counts */
    row_out *d_out, *h_out;
    uint32_t *d_allow, *h_allow; /* [max_rows * words] constraint masks, words = vocab / 32 rounded up */
    int words;
    int32_t *counts; /* host [vocab]: ids' counts in a penalty window */
    int32_t *order;  /* host [CUDA_SAMPLE_MAX_BIAS]: bias entries sorted */
    size_t bytes;
};

/* ---------- Philox4x32-10 ---------- */

__host__ __device__ static inline void philox(const uint32_t c_in[4], uint32_t k0, uint32_t k1, uint32_t out[4]) {
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3];
    for (int r = 0; r < 10; r++) {
        if (r) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u; /* the Weyl key schedule */
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0, c1 = (uint32_t)p1, c2 = n2, c3 = (uint32_t)p0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

extern "C" void cuda_sample_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    philox(ctr, key[0], key[1], out);
}

/* ---------- keys and bounds ---------- */

/* An unsigned key whose ascending order is the sampler's order: value descending (-0 is 0). */
__device__ __forceinline__ uint32_t desc_key(float x) {
    uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (b & 0x80000000u) ? b : ~(b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? k : (~k & 0x7fffffffu));
}

/* A prefix of the sorted order: the tokens (key, id) at or before (key, id) of the bound. */
struct bound_t {
    uint32_t key, id;
};
__device__ __forceinline__ bool within(uint32_t k, uint32_t i, bound_t b) {
    return k < b.key || (k == b.key && i <= b.id);
}
#define BOUND_ALL (bound_t{0xffffffffu, 0xffffffffu})

/* Which tokens a selection counts: value >= floor and inside pre. */
struct pred_t {
    float floor;
    bound_t pre;
};

struct row_ctx {
    const float *x;
    int V;
    float mx, inv_t;
    double scale; /* fixed-point unit of probability mass (relative to the best token's) */
};

/* The token's unnormalized probability exp((x - mx) / T) as sampler.c forms it, in fixed
 * point: every mass sum below is then exact, whatever the order of the additions. */
__device__ __forceinline__ unsigned long long wfix(const row_ctx &c, float v) {
    double w = exp(__dmul_rn((double)__fsub_rn(v, c.mx), (double)c.inv_t));
    return __double2ull_rn(w * c.scale);
}

struct smem_t {
    unsigned int cnt[256];
    unsigned long long mass[256];
    unsigned long long redu[SAMPLE_WARPS];
    double redd[SAMPLE_WARPS];
    float redf[SAMPLE_WARPS];
    int redi[SAMPLE_WARPS];
    int found, bucket, chosen, n_col, bad;
    unsigned int group;
    unsigned long long before, total;
    int col[SAMPLE_MAX_TOP];
};

/* One histogram pass over the row: bucket_of(i, v) gives the 8-bit digit of token i or -1.
 * Runs of one digit within a thread are added at once (a flat row puts most tokens in a
 * few digits, and each atomic on one address serializes). */
template <class F> __device__ void histogram(const row_ctx &c, smem_t &sm, bool mass_mode, F bucket_of) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sm.cnt[b] = 0, sm.mass[b] = 0;
    __syncthreads();
    int last = -1;
    unsigned int n = 0;
    unsigned long long m = 0;
    for (int i = threadIdx.x; i < c.V; i += blockDim.x) {
        float v = c.x[i];
        int b = bucket_of(i, v);
        if (b < 0) continue;
        if (b != last) {
            if (last >= 0) {
                atomicAdd(&sm.cnt[last], n);
                if (mass_mode) atomicAdd(&sm.mass[last], m);
            }
            last = b, n = 0, m = 0;
        }
        n++;
        if (mass_mode) m += wfix(c, v);
    }
    if (last >= 0) {
        atomicAdd(&sm.cnt[last], n);
        if (mass_mode) atomicAdd(&sm.mass[last], m);
    }
    __syncthreads();
}

/* Warp 0 after a histogram: the first digit at which base + the running sum of the counts
 * (or masses) reaches goal; in mass mode with frac >= 0 the goal is frac times this pass's
 * total (the first pass of a top-p search). Leaves found/bucket/before/group/total in sm. */
__device__ void find_digit(smem_t &sm, bool mass_mode, unsigned long long base, double goal, double frac) {
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        unsigned long long own = 0;
        for (int j = 0; j < 8; j++) own += mass_mode ? sm.mass[lane * 8 + j] : sm.cnt[lane * 8 + j];
        unsigned long long incl = own;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        unsigned long long total = __shfl_sync(0xffffffffu, incl, 31);
        if (frac >= 0) goal = frac * (double)total;
        unsigned int hit = __ballot_sync(0xffffffffu, (double)(base + incl) >= goal);
        if (lane == 0) sm.found = hit != 0, sm.total = total;
        if (hit && lane == __ffs(hit) - 1) {
            unsigned long long run = incl - own;
            int b = lane * 8;
            for (;; b++) {
                unsigned long long v = mass_mode ? sm.mass[b] : sm.cnt[b];
                if ((double)(base + run + v) >= goal || b == lane * 8 + 7) break;
                run += v;
            }
            sm.bucket = b, sm.before = run, sm.group = sm.cnt[b];
        }
    }
    __syncthreads();
}

/* The bound of a prefix of the sorted order among the tokens pr admits: in count mode the
 * first `rank` of them (BOUND_ALL when there are fewer), in mass mode the shortest prefix
 * whose mass reaches frac of their total (top-p's "acc >= top_p": the boundary token is
 * kept). Four passes over the value bits, then, only when the boundary falls inside a run
 * of equal values, passes over the id bits (lower ids first, as the host's sort). */
__device__ bound_t select_prefix(const row_ctx &c, smem_t &sm, pred_t pr, bool mass_mode, unsigned long long rank,
                                 double frac) {
    uint32_t prefix = 0;
    unsigned long long need = rank, cum = 0;
    double goal = (double)rank;
    for (int d = 0; d < 4; d++) {
        int shift = 24 - 8 * d;
        histogram(c, sm, mass_mode, [&](int i, float v) -> int {
            if (!(v >= pr.floor)) return -1;
            uint32_t k = desc_key(v);
            if (!within(k, (uint32_t)i, pr.pre) || (d > 0 && (k >> (shift + 8)) != prefix)) return -1;
            return (int)((k >> shift) & 255u);
        });
        find_digit(sm, mass_mode, mass_mode ? cum : 0, mass_mode ? goal : (double)need,
                   mass_mode && d == 0 ? frac : -1.0);
        if (!sm.found) return BOUND_ALL;
        if (mass_mode && d == 0) goal = frac * (double)sm.total;
        prefix = (prefix << 8) | (uint32_t)sm.bucket;
        if (mass_mode)
            cum += sm.before;
        else
            need -= sm.before;
        __syncthreads(); /* sm is rewritten by the next pass */
    }
    unsigned int group = sm.group;
    if (mass_mode) { /* equal values, equal masses: how many of the run the goal needs */
        unsigned long long w = wfix(c, key_value(prefix));
        double j = w ? ceil((goal - (double)cum) / (double)w) : (double)group;
        need = j < 1 ? 1 : j > (double)group ? group : (unsigned long long)j;
    }
    if (need >= group) return bound_t{prefix, 0xffffffffu};
    int id_bits = 32 - __clz(c.V - 1);
    uint32_t idp = 0;
    for (int shift = ((id_bits + 7) / 8 - 1) * 8; shift >= 0; shift -= 8) {
        int top = shift + 8 < id_bits;
        histogram(c, sm, false, [&](int i, float v) -> int {
            if (!(v >= pr.floor) || desc_key(v) != prefix || !within(prefix, (uint32_t)i, pr.pre)) return -1;
            if (top && ((uint32_t)i >> (shift + 8)) != idp) return -1;
            return (int)(((uint32_t)i >> shift) & 255u);
        });
        find_digit(sm, false, 0, (double)need, -1.0);
        idp = (idp << 8) | (uint32_t)sm.bucket;
        need -= sm.before;
        __syncthreads();
    }
    return bound_t{prefix, idp};
}

/* ---------- block reductions (fixed trees: the same row gives the same bits) ---------- */

__device__ double block_sum_d(smem_t &sm, double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) sm.redd[threadIdx.x / 32] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < (int)blockDim.x / 32; w++) t += sm.redd[w];
    __syncthreads();
    return t;
}

/* Exclusive prefix of v over threads (thread order), and the block total. */
__device__ unsigned long long block_scan_u(smem_t &sm, unsigned long long v, unsigned long long *total) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned long long incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) sm.redu[warp] = incl;
    __syncthreads();
    unsigned long long off = 0, t = 0;
    for (int w = 0; w < (int)blockDim.x / 32; w++) {
        if (w < warp) off += sm.redu[w];
        t += sm.redu[w];
    }
    __syncthreads();
    *total = t;
    return off + incl - v;
}

/* ---------- the kernel ---------- */

/* The row's bias entries (sorted by id, so a repeated id adds its values in request order,
 * one thread per id), then its penalties (one thread per distinct id), with sampler.c's
 * float operations one by one (no FMA contraction). */
__device__ void apply_entries(float *x, const row_params &p, const int32_t *eid, const float *ev) {
    for (int j = threadIdx.x; j < p.n_bias; j += blockDim.x) {
        const int32_t *id = eid + p.bias_off;
        if (j > 0 && id[j - 1] == id[j]) continue;
        float v = x[id[j]];
        for (int k = j; k < p.n_bias && id[k] == id[j]; k++) v = __fadd_rn(v, ev[p.bias_off + k]);
        x[id[j]] = v;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < p.n_pen; j += blockDim.x) {
        int id = eid[p.pen_off + j];
        float v = x[id];
        if (p.rep_on) v = v < 0 ? __fmul_rn(v, p.rep) : __fdiv_rn(v, p.rep);
        x[id] = __fsub_rn(v, __fadd_rn(p.presence, __fmul_rn(p.frequency, ev[p.pen_off + j])));
    }
    __syncthreads();
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows_kernel(float *logits, int V, const row_params *params, const int32_t *eid, const float *ev,
                       row_out *outs, uint8_t *mask, const uint32_t *allow, int words, double scale) {
    __shared__ smem_t sm;
    const row_params p = params[blockIdx.x];
    float *x = logits + (size_t)blockIdx.x * V;
    row_out *out = outs + blockIdx.x;
    int bad = 0;
    if (p.has_allow) { /* the model's own values are checked before the mask writes -inf */
        const uint32_t *a = allow + (size_t)blockIdx.x * words;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            bad |= !isfinite(x[i]);
            if (i >= p.allow_n || !(a[i >> 5] >> (i & 31) & 1u)) x[i] = -INFINITY;
        }
        __syncthreads();
    }
    apply_entries(x, p, eid, ev);

    /* the best token (first index of the largest value) and the non-finite check */
    float best_v = -INFINITY;
    int best_i = INT_MAX;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = x[i];
        if (!p.has_allow) bad |= !isfinite(v);
        if (v > best_v || (best_i == INT_MAX && v == best_v)) best_v = v, best_i = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, best_v, o);
        int j = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (v > best_v || (v == best_v && j < best_i)) best_v = v, best_i = j;
    }
    bad = __syncthreads_or(bad);
    if (threadIdx.x % 32 == 0) sm.redf[threadIdx.x / 32] = best_v, sm.redi[threadIdx.x / 32] = best_i;
    __syncthreads();
    float mx = sm.redf[0];
    int best = sm.redi[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++)
        if (sm.redf[w] > mx || (sm.redf[w] == mx && sm.redi[w] < best)) mx = sm.redf[w], best = sm.redi[w];
    __syncthreads();
    if (bad) {
        if (threadIdx.x == 0) out->token = -1;
        return;
    }
    row_ctx c = {x, V, mx, p.inv_t, scale};
    int chosen = best;
    if (p.temp > 0) {
        pred_t c0 = {__fsub_rn(mx, p.temp40), BOUND_ALL}; /* sampler.c's candidates */
        bound_t b1 = p.top_k > 0 ? select_prefix(c, sm, c0, false, (unsigned long long)p.top_k, 0) : BOUND_ALL;
        pred_t c1 = {c0.floor, b1};
        bound_t b2 = p.top_p_on ? select_prefix(c, sm, c1, true, 0, (double)p.top_p) : BOUND_ALL;
        /* the survivors: top-k, top-p, then min-p (always keeping the best) */
        auto keep = [&](int i, float v) -> bool {
            if (!(v >= c0.floor)) return false;
            uint32_t k = desc_key(v);
            if (!within(k, (uint32_t)i, b1) || !within(k, (uint32_t)i, b2)) return false;
            return !p.min_p_on || i == best || (double)__fsub_rn(v, mx) >= p.min_p_lim;
        };
        unsigned long long own = 0, total;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            if (keep(i, x[i])) own += wfix(c, x[i]);
        unsigned long long before = block_scan_u(sm, own, &total);
        /* u in [0, 1) from 53 bits; the draw walks the survivors in thread-major order */
        uint32_t ctr[4] = {p.pos0, p.pos1, 0x53414d50u /* "SAMP" */, 0}, r4[4];
        philox(ctr, p.key0, p.key1, r4);
        double u = (double)(((uint64_t)(r4[0] >> 5) << 26) | (r4[1] >> 6)) * (1.0 / 9007199254740992.0);
        unsigned long long r = (unsigned long long)(u * (double)total);
        if (r >= total) r = total - 1;
        if (threadIdx.x == 0) sm.chosen = best;
        __syncthreads();
        if (own && before <= r && r < before + own) {
            unsigned long long acc = before;
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (keep(i, x[i]) && (acc += wfix(c, x[i])) > r) {
                    sm.chosen = i;
                    break;
                }
        }
        __syncthreads();
        chosen = sm.chosen;
        if (mask)
            for (int i = threadIdx.x; i < V; i += blockDim.x) mask[(size_t)blockIdx.x * V + i] = keep(i, x[i]);
    } else if (mask) {
        for (int i = threadIdx.x; i < V; i += blockDim.x) mask[(size_t)blockIdx.x * V + i] = i == best;
    }
    if (threadIdx.x == 0) out->token = chosen;
    if (!p.want_lp) return;
    /* log-softmax of the processed logits (no temperature), as sampler.c */
    double s = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += exp((double)__fsub_rn(x[i], mx));
    s = block_sum_d(sm, s);
    float lse = __fadd_rn(mx, (float)log(s));
    if (threadIdx.x == 0) out->logprob = __fsub_rn(x[chosen], lse);
    if (p.n_top <= 0) return;
    bound_t bt = select_prefix(c, sm, pred_t{-INFINITY, BOUND_ALL}, false, (unsigned long long)p.n_top, 0);
    if (threadIdx.x == 0) sm.n_col = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (within(desc_key(x[i]), (uint32_t)i, bt)) {
            int at = atomicAdd(&sm.n_col, 1);
            if (at < SAMPLE_MAX_TOP) sm.col[at] = i;
        }
    __syncthreads();
    if (threadIdx.x == 0) { /* n_top <= 20 tokens: insertion sort by (value desc, id asc) */
        int n = sm.n_col < p.n_top ? sm.n_col : p.n_top;
        for (int a = 1; a < n; a++) {
            int id = sm.col[a], b = a;
            while (b > 0 && (x[sm.col[b - 1]] < x[id] || (x[sm.col[b - 1]] == x[id] && sm.col[b - 1] > id))) {
                sm.col[b] = sm.col[b - 1];
                b--;
            }
            sm.col[b] = id;
        }
        for (int a = 0; a < n; a++) out->top_ids[a] = sm.col[a], out->top_lp[a] = __fsub_rn(x[sm.col[a]], lse);
    }
}

/* ---------- host side ---------- */

static int penalties_on(const hearth_sampling *p) {
    int rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
    return rep || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

static int window_of(const hearth_sampling *p) {
    return p->repetition_context_size > 0 ? p->repetition_context_size : 20; /* sampler.c's default */
}

/* The device packs one window for all three penalties: a presence or frequency window of
 * its own (0 follows the repetition window) is sampled on the host. */
static int one_window(const hearth_sampling *p) {
    int w = window_of(p);
    return (p->presence_context_size <= 0 || p->presence_context_size == w) &&
           (p->frequency_context_size <= 0 || p->frequency_context_size == w);
}

extern "C" int cuda_sample_supported(const hearth_sampling *p) {
    return p->n_bias <= CUDA_SAMPLE_MAX_BIAS &&
           (!penalties_on(p) || (window_of(p) <= CUDA_SAMPLE_MAX_WINDOW && one_window(p)));
}

extern "C" hearth_status cuda_sampler_create(int max_rows, int vocab, cuda_sampler **out, hearth_error *err) {
    *out = NULL;
    if (max_rows <= 0 || vocab <= 1 || vocab > (1 << 24))
        return err_set(err, HEARTH_ERR_INVALID, "cuda sampler: %d rows of vocabulary %d", max_rows, vocab);
    cuda_sampler *s = (cuda_sampler *)calloc(1, sizeof *s);
    if (!s) return err_set(err, HEARTH_ERR_NOMEM, "cuda sampler: out of memory");
    s->max_rows = max_rows, s->vocab = vocab;
    cuda_sampler_sizes z; /* the sizes cuda_plan counts */
    cuda_sampler_sizes_make(max_rows, vocab, &z);
    s->counts = (int32_t *)calloc(1, z.counts);
    s->order = (int32_t *)malloc(z.order);
    hearth_status st =
        s->counts && s->order ? HEARTH_OK : err_set(err, HEARTH_ERR_NOMEM, "cuda sampler: out of memory");
    if (!st) st = cuda_alloc((void **)&s->d_params, z.params, "sampler parameters", err);
    if (!st) st = cuda_alloc((void **)&s->d_eid, z.entry_ids, "sampler entries", err);
    if (!st) st = cuda_alloc((void **)&s->d_eval, z.entry_values, "sampler entries", err);
    if (!st) st = cuda_alloc((void **)&s->d_out, z.results, "sampler results", err);
    s->words = (vocab + 31) / 32;
    if (!st) st = cuda_alloc((void **)&s->d_allow, z.masks, "sampler constraint masks", err);
    if (!st && (cudaMallocHost((void **)&s->h_params, z.params) != cudaSuccess ||
                cudaMallocHost((void **)&s->h_eid, z.entry_ids) != cudaSuccess ||
                cudaMallocHost((void **)&s->h_eval, z.entry_values) != cudaSuccess ||
                cudaMallocHost((void **)&s->h_out, z.results) != cudaSuccess ||
                cudaMallocHost((void **)&s->h_allow, z.masks) != cudaSuccess)) {
        cudaGetLastError();
        st = err_set(err, HEARTH_ERR_NOMEM, "cuda sampler: cannot allocate pinned buffers for %d rows", max_rows);
    }
    if (st) {
        cuda_sampler_free(s);
        return st;
    }
    s->bytes = cuda_sampler_sizes_device(&z);
    *out = s;
    return HEARTH_OK;
}

extern "C" void cuda_sampler_free(cuda_sampler *s) {
    if (!s) return;
    cuda_free(s->d_params);
    cuda_free(s->d_eid);
    cuda_free(s->d_eval);
    cuda_free(s->d_out);
    cuda_free(s->d_allow);
    void *pinned[] = {s->h_params, s->h_eid, s->h_eval, s->h_out, s->h_allow};
    for (int i = 0; i < 5; i++)
        if (pinned[i]) cudaFreeHost(pinned[i]);
    free(s->counts);
    free(s->order);
    free(s);
}

extern "C" size_t cuda_sampler_device_bytes(const cuda_sampler *s) { return s ? s->bytes : 0; }

static int cmp_bias(const void *a, const void *b, void *ctx) {
    const int32_t *ids = (const int32_t *)ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b, x = ids[i], y = ids[j];
    return x != y ? (x < y ? -1 : 1) : i - j; /* by id, then request order */
}

/* Fills row r's parameters and entries (bias sorted by id; the window's distinct ids with
 * their counts, sampler.c's apply_penalties) at *n_entries. */
static hearth_status pack_row(cuda_sampler *s, int r, const cuda_sample_req *q, size_t *n_entries, hearth_error *err) {
    const hearth_sampling *p = q->p;
    row_params *rp = &s->h_params[r];
    memset(rp, 0, sizeof *rp);
    int V = s->vocab;
    if (!cuda_sample_supported(p))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "cuda sampler: %zu logit-bias entries / penalty window %d "
                       "exceed the device path's %d / %d",
                       p->n_bias, window_of(p), CUDA_SAMPLE_MAX_BIAS, CUDA_SAMPLE_MAX_WINDOW);
    rp->temp = p->temperature;
    if (p->temperature > 0) {
        rp->inv_t = 1.0f / p->temperature;
        rp->temp40 = 40.0f * p->temperature;
        rp->top_k = p->top_k > 0 ? p->top_k : 0;
        rp->top_p_on = p->top_p > 0 && p->top_p < 1;
        rp->top_p = p->top_p;
        rp->min_p_on = p->min_p > 0;
        if (rp->min_p_on) rp->min_p_lim = log((double)p->min_p) / rp->inv_t;
    }
    if (q->lp) {
        int n = q->lp->n < 0 ? 0 : q->lp->n > SAMPLE_MAX_TOP ? SAMPLE_MAX_TOP : q->lp->n;
        rp->want_lp = 1, rp->n_top = n > V ? V : n;
    }
    if (q->allow) {
        rp->has_allow = 1;
        rp->allow_n = q->allow_n < 0 ? 0 : q->allow_n > V ? V : q->allow_n;
        memcpy(s->h_allow + (size_t)r * s->words, q->allow, (size_t)(rp->allow_n + 31) / 32 * sizeof(uint32_t));
    }
    rp->key0 = (uint32_t)q->seed, rp->key1 = (uint32_t)(q->seed >> 32);
    rp->pos0 = (uint32_t)q->n_history, rp->pos1 = (uint32_t)((uint64_t)q->n_history >> 32);
    size_t at = *n_entries;
    int nb = 0;
    for (size_t i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] >= 0 && p->bias_ids[i] < V) s->order[nb++] = (int32_t)i;
    qsort_r(s->order, (size_t)nb, sizeof *s->order, cmp_bias, (void *)p->bias_ids);
    rp->bias_off = (int)at, rp->n_bias = nb;
    for (int i = 0; i < nb; i++, at++)
        s->h_eid[at] = p->bias_ids[s->order[i]], s->h_eval[at] = p->bias_values[s->order[i]];
    if (penalties_on(p)) {
        size_t n = q->n_history, w = (size_t)window_of(p), start = n > w ? n - w : 0;
        const int32_t *h = q->history;
        rp->rep_on = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
        rp->rep = p->repetition_penalty, rp->presence = p->presence_penalty, rp->frequency = p->frequency_penalty;
        rp->pen_off = (int)at;
        for (size_t i = start; i < n; i++)
            if (h[i] >= 0 && h[i] < V) s->counts[h[i]]++;
        for (size_t i = start; i < n; i++) {
            int32_t id = h[i];
            if (id < 0 || id >= V || s->counts[id] == 0) continue; /* each id once */
            s->h_eid[at] = id, s->h_eval[at++] = (float)s->counts[id];
            s->counts[id] = 0;
        }
        rp->n_pen = (int)(at - (size_t)rp->pen_off);
    }
    *n_entries = at;
    return HEARTH_OK;
}

static hearth_status run_queued(cuda_sampler *s, float *logits, int rows, const cuda_sample_req *req, int32_t *ids,
                                uint8_t *mask, hearth_error *err) {
    if (rows <= 0) return HEARTH_OK;
    if (rows > s->max_rows)
        return err_set(err, HEARTH_ERR_INVALID, "cuda sampler: %d rows, made for %d", rows, s->max_rows);
    size_t n_entries = 0;
    int allow_rows = 0; /* the masks go up as far as the last row that has one */
    for (int r = 0; r < rows; r++) {
        hearth_status st = pack_row(s, r, &req[r], &n_entries, err);
        if (st) return st;
        if (req[r].allow) allow_rows = r + 1;
    }
    /* 2^(63 - bits(V)) per unit of mass: V tokens of mass <= 1 never overflow 64 bits */
    int bits = 0;
    while ((1ll << bits) <= s->vocab) bits++;
    double scale = ldexp(1.0, 63 - bits);
    hearth_status st = cuda_upload_async(s->d_params, s->h_params, (size_t)rows * sizeof(row_params), err);
    if (!st && n_entries) st = cuda_upload_async(s->d_eid, s->h_eid, n_entries * sizeof(int32_t), err);
    if (!st && n_entries) st = cuda_upload_async(s->d_eval, s->h_eval, n_entries * sizeof(float), err);
    if (!st && allow_rows)
        st = cuda_upload_async(s->d_allow, s->h_allow, (size_t)allow_rows * s->words * sizeof(uint32_t), err);
    if (st) return st;
    sample_rows_kernel<<<rows, SAMPLE_THREADS, 0, cuda_stream()>>>(logits, s->vocab, s->d_params, s->d_eid, s->d_eval,
                                                                   s->d_out, mask, s->d_allow, s->words, scale);
    if ((st = cuda_launched("sample_rows", err))) return st;
    if ((st = cuda_download_async(s->h_out, s->d_out, (size_t)rows * sizeof(row_out), err))) return st;
    if ((st = cuda_stream_sync(err))) return st;
    for (int r = 0; r < rows; r++) {
        const row_out *o = &s->h_out[r];
        if (o->token < 0)
            return err_set(err, HEARTH_ERR_FORMAT,
                           "the model produced non-finite logits; its weights contain NaN or Inf values");
        ids[r] = o->token;
        hearth_logprobs *lp = req[r].lp;
        if (!lp) continue;
        lp->n = s->h_params[r].n_top;
        lp->logprob = o->logprob;
        for (int i = 0; i < lp->n; i++) lp->top_ids[i] = o->top_ids[i], lp->top_logprobs[i] = o->top_lp[i];
    }
    return HEARTH_OK;
}

/* Whatever fails, the stream is drained before returning: the caller's pinned step buffers
 * (the forward pass queued before this) may be rewritten as soon as it returns. */
static hearth_status run(cuda_sampler *s, float *logits, int rows, const cuda_sample_req *req, int32_t *ids,
                         uint8_t *mask, hearth_error *err) {
    hearth_status st = run_queued(s, logits, rows, req, ids, mask, err);
    if (st) cudaStreamSynchronize(cuda_stream());
    return st;
}

extern "C" hearth_status cuda_sampler_run(cuda_sampler *s, float *logits, int rows, const cuda_sample_req *req,
                                          int32_t *ids, hearth_error *err) {
    return run(s, logits, rows, req, ids, NULL, err);
}

extern "C" hearth_status cuda_sampler_run_masked(cuda_sampler *s, float *logits, int rows, const cuda_sample_req *req,
                                                 int32_t *ids, uint8_t *mask, hearth_error *err) {
    return run(s, logits, rows, req, ids, mask, err);
}
