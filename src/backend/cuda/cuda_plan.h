/* cuda_plan.h: the CUDA backend's sizing: every device buffer cuda_model_create allocates
 * (weights in their device layout, the KV pool, scratch) and the device sampler the engine
 * makes beside it, computed from the model's shapes alone. The allocating code allocates
 * exactly these sizes and hearth fit --device cuda predicts from them, so the two cannot
 * drift apart. Plain C, built with or without nvcc; allocates nothing. */
#ifndef HEARTH_BACKEND_CUDA_PLAN_H
#define HEARTH_BACKEND_CUDA_PLAN_H
#include "ops/ops.h"
#include <stddef.h>

/* Decode steps of at most this many tokens use the GEMV kernels and CUDA graphs
 * (cuda_matmul sends T <= 8 rows to the GEMVs: no cuBLAS, fixed launch shapes). */
#define CUDA_GRAPH_MAX_T 8
/* The grouped prefill form's pairs per run (cuda_plan.h moe_group_pairs): 4,096 tokens of a
 * top-8 model in two runs, its rows within a few hundred MB at the largest hidden sizes */
#define CUDA_MOE_GROUP_PAIRS 16384
/* cuda_matmul may send up to this many rows of a quantized weight to the chunked GEMV
 * (its byte model, cuda_gemm.cu): the GEMV's int8-activation scratch is sized for it. */
#define CUDA_MATMUL_GEMV_MAX_T 64
/* cuBLAS workspace (cuda_gemm.cu, cublasSetWorkspace): NVIDIA recommends 32 MiB on Hopper
 * (the default is smaller and keeps some of the faster GEMM kernels from being chosen). */
#define CUDA_GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
/* Most split-K partials per (head, token) of decode attention (cuda_ops.cu DA_SPLITS_MAX). */
#define CUDA_ATT_SPLITS_MAX 32
/* The MMQ kernel's split-k scratch (cuda_mmq.cu): partial sums of up to 64 rows x 20480
 * outputs, and one arrival count per 64-row tile of a weight up to 65536 rows. */
#define CUDA_MMQ_PART_FLOATS ((size_t)64 * 20480)
#define CUDA_MMQ_TILES_MAX 1024

/* How the device KV pool stores keys and values. Today cuda_kv_alloc keeps float32
 * whatever --kv-quant says; int8/fp8 (one byte per element plus one float scale per
 * position and KV head, the host int8 layout) are the device formats being added. */
typedef enum cuda_kv_dtype { CUDA_KV_F32 = 0, CUDA_KV_INT8 = 1, CUDA_KV_FP8 = 2, CUDA_KV_F16 = 3 } cuda_kv_dtype;
/* The device dtype the engine uses for a --kv-quant setting (hearth_kv_quant). */
int cuda_kv_device_dtype(int kv_quant);
const char *cuda_kv_dtype_name(int dtype);
/* Bytes of one of the K or V planes of the device pool (per element plus per-row scales). */
size_t cuda_kv_plane_bytes(int n_layers, int n_blocks, int n_kv_heads, int head_dim, int dtype);
/* Device bytes of the key and value storage (elements and scales, no tables) of a pool of
 * n_blocks blocks in this quant: what cuda_kv_alloc allocates besides the block tables. The
 * one definition of device KV bytes (fit, --kv-budget and the pool's allocation use it);
 * 0 for an unknown quant. Pure arithmetic: needs no device. */
size_t cuda_kv_bytes(int n_layers, int n_kv_heads, int head_dim, int n_blocks, int quant);
/* The two allocations of one plane (keys or values): the elements, and (int8 / fp8) the
 * float scale per row; cuda_kv.cu allocates by these, the plan counts them. */
void cuda_kv_plane_parts(int n_layers, int n_blocks, int n_kv_heads, int head_dim, int dtype, size_t *data,
                         size_t *scales);
/* cuda_kv_plane_parts of a whole pool: its layers' own shapes summed where they differ
 * (kv->layer_heads: varied layers), else n_layers of n_kv_heads x head_dim. */
void cuda_kv_pool_parts(const kv_cache *kv, int dtype, size_t *data, size_t *scales);
/* Bytes of K and V read per cached position and layer in a decode step. */
double cuda_kv_position_bytes(int n_kv_heads, int head_dim, int dtype);

/* Whether the GEMV kernels handle this format natively, from its dtype and shape alone
 * (cuda_weight_supported also wants the MLX scale/bias pointers). */
int cuda_weight_format_native(const op_weight *w);
/* Whether it is kept in the generic affine layout (DT_AFFINE, cuda_affine.h). */
int cuda_weight_goes_affine(const op_weight *w);
/* A weight's device layout (cuda_weight): bytes of its data plane and of its scales plane
 * (0: none). Formats without a kernel are expanded to F32 (returns 1), else returns 0. */
int cuda_weight_layout(const op_weight *w, size_t *data_bytes, size_t *scale_bytes);

/* Floats of split_scratch that let decode attention of up to max_T tokens use every split
 * (declared in cuda_backend.h). */
/* The int8-activation scratch of cuda_gemv_reserve for `floats` inputs: the quant plane
 * (floats rounded up to a block of 32) and the (d, d * sum q) float2 per block. */
void cuda_gemv_act_layout(size_t floats, size_t *quant_bytes, size_t *scale_bytes);

/* The device allocator's footprint: cudaMalloc hands out memory in pages of
 * CUDA_ALLOC_PAGE; allocations below CUDA_ALLOC_SMALL share pages (aligned to
 * CUDA_ALLOC_ALIGN), larger ones take whole pages. A tally of allocations, in the order
 * cuda_model_create makes them. */
typedef struct cuda_alloc_tally {
    size_t requested; /* sum of the sizes asked for */
    size_t large;     /* pages taken by large allocations */
    size_t small;     /* bytes of small allocations, aligned */
    int count;
} cuda_alloc_tally;
void cuda_tally_add(cuda_alloc_tally *t, size_t bytes);
/* Device bytes the allocations take (pages), >= requested. */
size_t cuda_tally_bytes(const cuda_alloc_tally *t);

/* The activation buffers of cuda_model (x, xn, q, k, v, att, tmp, gate, up, rows, logits),
 * in floats, in this order. */
enum { CUDA_PLAN_N_ACT = 11 };

typedef struct cuda_plan {
    /* what cuda_model_create allocates, in its units */
    size_t act_floats[CUDA_PLAN_N_ACT];
    size_t ints;             /* step indices: pos | slot | out_rows (| run_first | run_next: hybrids), int32 */
    size_t qgate_floats;     /* gated attention's doubled q projection (0: none) */
    size_t gdn_floats[5];    /* Gated DeltaNet scratch: qkv, z, b, a, y (0: not a hybrid) */
    size_t state_floats;     /* the recurrent-state pool: every slot's records, then the snapshots' */
    int state_snaps;         /* snapshot records in it (kv_state_default_snaps) */
    size_t att_split_floats; /* decode attention split-K partials */
    size_t att_stage_bytes;  /* prefill attention's bf16 copy of a sequence's keys and values (0: none) */
    size_t ids;              /* greedy ids, int32 */
    size_t gemv_floats;      /* cuda_gemv_reserve's argument */
    size_t decode_q8_bytes, decode_q8_scale_bytes; /* the fused norm / gate's int8 activations */
    size_t per_layer_floats; /* per-layer inputs [T, n_layers * per_layer_dim], twice (input, work); 0: none */
    size_t mtp_floats; /* an MTP head's (dims.mtp) hidden rows in [T, hidden] and its input [T, 2 hidden]; 0: none */
    size_t gemm_max_w, gemm_max_x;
    /* mixture of experts (all 0 without): router logits [T, experts], the step's T * top_k
     * (token, expert) pairs, an expert's gate / up rows [T, the widest expert MLP], its input
     * and output rows [T, hidden], and the normed form's expert sum (moe_acc_floats, 0 elsewhere) */
    size_t moe_logits, moe_pairs, moe_ffn_floats, moe_hidden_floats, moe_acc_floats;
    /* the grouped prefill form (cuda_model.c moe_grouped; 0 without: the exact tier, steps of at
     * most CUDA_GRAPH_MAX_T): pairs per run (gate / up rows moe_ffn_floats and output rows
     * moe_out_floats hold a run's), and a run's device tables (rows, slots, segments, count) */
    size_t moe_group_pairs, moe_out_floats, moe_idx_ints;
    size_t moe_xb_elems, moe_actb_elems; /* its bf16 inputs: the step's [T, hidden], a run's [pairs, expert width] */
    /* LoRA adapters (cuda_lora_cache.c): each step row's adapter tables and counts (also
     * pinned on the host), the fast tier's rank values (cuda_lora_apply_fast's scratch); the
     * adapters' own device copies are made when a step first uses them, outside the plan */
    size_t lora_sets_bytes, lora_counts_bytes, lora_fast_bytes; /* cuda_lora_cache_sizes_make's */
    /* --expert-offload N (hearth_engine_options.expert_offload; 0: off): the experts' slices
     * live in pinned host memory in their device layout and a device pool of expert_slots
     * slots, each of the largest slice's data and scales planes, holds the ones a step uses
     * (cuda_model.c moe_experts) */
    int expert_slots;
    size_t slot_data_bytes, slot_scale_bytes;
    size_t expert_bytes; /* every expert slice in its device layout: on the device, or pinned on the host (offload) */
    int gemm_exact; /* hearth_engine_options.cuda_exact (--cuda-exact) */
    int kv_dtype;   /* cuda_kv_dtype */
    int n_expanded; /* weights expanded to F32 (no kernel for their format) */
    tensor_dtype expanded_from;
    /* device bytes, each part with the allocator's page rounding */
    size_t weights;      /* every matrix in its device layout, norms, RoPE frequencies */
    size_t kv;           /* K and V planes, the block tables and the recurrent-state pool */
    size_t scratch;      /* activations, indices, attention split, int8 activations, GEMM, LoRA rows */
    size_t sampler;      /* the device sampler the engine makes beside the model (cuda_sampler_sizes_make
                          * for max_out rows of the vocabulary) */
    size_t requested;    /* the same allocations without rounding */
    int n_allocs;        /* cudaMalloc calls */
    size_t weights_read; /* device bytes one decode step reads from the weights (GEMV bytes) */
    /* host memory the GPU path adds */
    size_t pinned_host; /* cudaMallocHost staging buffers (and the offloaded experts: expert_bytes) */
    size_t upload_host; /* the largest temporary host buffer of an upload (repack, f32 expansion) */
    size_t sampler_host; /* the device sampler's host buffers (penalty counts, bias order); its pinned
                          * copies are in pinned_host */
} cuda_plan;

/* Sizes cuda_model_create's buffers for om (a loaded or only planned model), a KV pool
 * of kv's shape stored as kv_dtype, max_tokens per step and max_out logits rows;
 * expert_slots > 0: the experts offloaded to the host with a device pool of that many
 * slots (cuda_plan.expert_slots; ignored for a model without experts). */
void cuda_plan_make(const op_model *om, const kv_cache *kv, int max_tokens, int max_out, int kv_dtype, int gemm_exact,
                    int expert_slots, cuda_plan *p);
/* Device bytes of the plan (weights + kv + scratch + sampler), without the runtime (context, cuBLAS). */
size_t cuda_plan_bytes(const cuda_plan *p);
/* Device bytes one decode step reads with `context` positions cached per layer (sliding
 * layers read at most their window): the GPU's decode roofline denominator. */
double cuda_plan_decode_bytes(const cuda_plan *p, const op_model *om, int context);
#endif
