/* load.c: reads a model's configuration (config.json or GGUF metadata) into model_config
 * and copies the weights it needs into one resident, 64-byte aligned arena in their
 * native formats (norm vectors converted to float32). Every shape is checked against the
 * config; a mismatch names the tensor. No compute. */
#define _GNU_SOURCE
#include "model/model_handle.h"
#include "base/err.h"
#include "base/half.h"
#include "base/mem.h"
#include "model/decoder.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Tensor names per role: HF/MLX module path (without ".weight") and GGUF name. */
typedef enum role { R_Q, R_K, R_V, R_O, R_GATE, R_UP, R_DOWN, R_ATTN_NORM, R_FFN_NORM, R_POST_ATTN_NORM,
                    R_POST_FFN_NORM, R_Q_NORM, R_K_NORM, R_COUNT } role;
static const char *hf_names[R_COUNT] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
    "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm", NULL, NULL,
    "self_attn.q_norm", "self_attn.k_norm"};
static const char *gguf_names[R_COUNT] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                          "ffn_down", "attn_norm", "ffn_norm", "post_attention_norm",
                                          "post_ffw_norm", "attn_q_norm", "attn_k_norm"};

typedef struct loader {
    const hearth_model *hm;
    model *m;
    int gguf;
    uint8_t *arena;
    size_t used, cap; /* cap 0: sizing pass */
    size_t load_peak; /* max over tensors of arena bytes so far + the file pages of that tensor */
    int use_mmap;     /* matrices point into the file mapping instead of the arena */
    const char *prefix; /* "model." (HF causal LM), or "" where the checkpoint holds the bare
                           base model (Qwen3-Embedding: embed_tokens.weight, layers.N....) */
    const char *head;   /* the output projection's module: "lm_head" ("language_model.lm_head" in mlx-lm's Qwen3.5) */
    const model *target; /* loading the multi-token-prediction head of this model (model_load_mtp), else NULL */
    hearth_error *err;
} loader;

/* The whole pages [*a, *b) that [p, p + n) touches. */
static void page_range(const void *p, size_t n, uintptr_t *a, uintptr_t *b) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    *a = (uintptr_t)p & ~(page - 1);
    *b = ((uintptr_t)p + n + page - 1) & ~(page - 1);
}

static size_t page_span(const void *p, size_t n) {
    uintptr_t a, b;
    page_range(p, n, &a, &b);
    return n ? (size_t)(b - a) : 0;
}

/* The kernel maps a read fault's neighbours too (fault-around: the aligned 64 KiB window
 * around the faulting page, the default of /sys/kernel/debug/fault_around_bytes), so
 * reading a tensor maps back the tail of the tensors before it,
 * which were already dropped. Dropping that window with each tensor keeps those pages from
 * piling up over the load (SmolLM2's 270 tensors left 14 MiB mapped beside the arena). */
#define LOAD_FAULT_AROUND ((uintptr_t)64 << 10)

/* The mapping that holds p: the GGUF file, or the safetensors file it is in. */
static const file_map *map_of(const hearth_model *hm, const void *p) {
    const uint8_t *q = p;
    if (hm->entry.format == MODEL_FORMAT_GGUF) return &hm->gguf.map;
    for (size_t i = 0; i < hm->st.n_files; i++) {
        const file_map *fm = &hm->st.files[i].map;
        if (fm->data && q >= fm->data && q < fm->data + fm->size) return fm;
    }
    return NULL;
}

/* The pages reading [p, p + n) can map: its pages widened to the fault-around windows at
 * both ends, within its mapping. 0 (and its own pages) when p is in no file mapping (a GGUF
 * parsed from a caller's buffer, as the fuzz target does): those pages are not ours to drop. */
static int fault_range(const hearth_model *hm, const void *p, size_t n, uintptr_t *a, uintptr_t *b) {
    page_range(p, n, a, b);
    const file_map *fm = map_of(hm, p);
    if (!fm || !fm->data) return 0;
    uintptr_t lo = *a & ~(LOAD_FAULT_AROUND - 1), hi = (*b + LOAD_FAULT_AROUND - 1) & ~(LOAD_FAULT_AROUND - 1),
              start = (uintptr_t)fm->data, end = start + page_span(fm->data, fm->size);
    *a = lo > start ? lo : start;
    *b = hi < end ? hi : end;
    return 1;
}

/* [p, p + n)'s file pages with the fault-around windows, within its mapping, leave the
 * process (nothing where p is in no file mapping). */
static void drop_pages(const hearth_model *hm, const void *p, size_t n) {
    uintptr_t a, b;
    if (n && fault_range(hm, p, n, &a, &b) && b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Drops the pages of one tensor's file bytes from this process once they are copied (and,
 * in the sizing pass, once the NaN check has read them), with the fault-around windows
 * their reading mapped: MADV_DONTNEED on the private read-only mapping, the page cache
 * keeps them and a later read faults them back (a page shared with the next tensor simply
 * comes back when that one is read). So the load holds one tensor's file pages beside the
 * arena, not the whole file: the peak is the arena plus the largest tensor, not twice the
 * weights (model_load_peak_bytes). */
static void drop_span(const loader *L, const void *p, size_t n) {
    if (L->use_mmap || !n) return;
    drop_pages(L->hm, p, n);
}

/* After tensor t's bytes went into the arena (or were sized): the load's peak so far, then
 * (loading) its pages leave the process. */
static void tensor_copied(loader *L, const tensor_info *t) {
    uintptr_t a, b;
    fault_range(L->hm, t->data, t->nbytes, &a, &b);
    size_t at = L->used + (t->nbytes ? (size_t)(b - a) : 0);
    if (at > L->load_peak) L->load_peak = at;
    if (L->cap) drop_span(L, t->data, t->nbytes); /* the sizing pass drops after its NaN check */
}

static void *arena_take(loader *L, size_t bytes) {
    size_t at = (L->used + 63) & ~(size_t)63;
    L->used = at + bytes;
    return L->cap ? L->arena + at : NULL;
}

static const char *layer_name(loader *L, int layer, role r, const char *suffix, char *buf, size_t n) {
    const char *hf = hf_names[r];
    if (L->m->cfg.family == FAMILY_GEMMA3) { /* Gemma names its four norms differently */
        if (r == R_FFN_NORM) hf = "pre_feedforward_layernorm";
        if (r == R_POST_ATTN_NORM) hf = "post_attention_layernorm";
        if (r == R_POST_FFN_NORM) hf = "post_feedforward_layernorm";
    }
    const char *gg = gguf_names[r];
    if (L->m->cfg.family == FAMILY_QWEN3_5 && r == R_FFN_NORM) gg = "post_attention_norm"; /* llama.cpp's qwen35 */
    if (L->gguf) snprintf(buf, n, "blk.%d.%s.%s", layer, gg, suffix);
    else snprintf(buf, n, "%slayers.%d.%s.%s", L->prefix, layer, hf, suffix);
    return buf;
}

/* A float vector (norm weight, bias) of n elements, converted to float32. */
static hearth_status load_vector(loader *L, const char *name, int64_t n, int required, const float **out) {
    *out = NULL;
    const tensor_info *t = model_find_tensor(L->hm, name);
    if (!t) return required ? err_set(L->err, HEARTH_ERR_FORMAT, "%s: missing tensor '%s'", L->hm->entry.path, name)
                            : HEARTH_OK;
    if (tensor_elems(t) != (uint64_t)n || (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16))
        return err_set(L->err, HEARTH_ERR_FORMAT, "%s: tensor '%s' has %llu %s elements, expected %lld float values",
                       t->file ? t->file : L->hm->entry.path, name, (unsigned long long)tensor_elems(t),
                       tensor_dtype_name(t->dtype), (long long)n);
    float *dst = arena_take(L, (size_t)n * sizeof(float));
    if (dst) {
        for (int64_t i = 0; i < n; i++) {
            if (t->dtype == DT_F32) memcpy(&dst[i], t->data + 4 * i, 4);
            else {
                uint16_t h;
                memcpy(&h, t->data + 2 * i, 2);
                dst[i] = t->dtype == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
            }
            if (!isfinite(dst[i]))
                return err_set(L->err, HEARTH_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g) at index %lld",
                               t->file ? t->file : L->hm->entry.path, name, dst[i], (long long)i);
        }
        *out = dst;
    }
    tensor_copied(L, t);
    return HEARTH_OK;
}

static const void *copy_bytes(loader *L, const tensor_info *t) {
    if (L->use_mmap) return t->data;
    void *dst = arena_take(L, t->nbytes);
    if (dst) mem_copy_wide(dst, t->data, t->nbytes);
    tensor_copied(L, t);
    return dst;
}

/* Index of the first NaN/Inf in a float matrix (F32/F16/BF16), or -1. Quantized formats
 * are caught later: their non-finite scales show up as non-finite logits. Blocks of 1024
 * elements are tested with a branch-free OR the compiler vectorizes (a bf16 8B model is
 * 8 billion elements: about 1 ns each one at a time, 0.3 so), and only a block with a hit
 * is walked for its index. */
static int64_t first_in_block(const uint8_t *p, uint64_t n, int f32, uint16_t mask) {
    for (uint64_t i = 0; i < n; i++) {
        if (f32) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) return (int64_t)i;
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            if ((uint16_t)(h & mask) == mask) return (int64_t)i;
        }
    }
    return -1;
}

static int64_t first_non_finite(const tensor_info *t) {
    if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16) return -1; /* quantized: nothing read here */
    enum { BLOCK = 1024 };
    uint64_t n = tensor_elems(t);
    int f32 = t->dtype == DT_F32;
    uint16_t mask = t->dtype == DT_F16 ? 0x7c00u : 0x7f80u; /* the exponent bits: all set is Inf or NaN */
    size_t es = f32 ? 4 : 2;
    for (uint64_t b = 0; b < n; b += BLOCK) {
        uint64_t e = n - b < BLOCK ? n - b : BLOCK;
        const uint8_t *p = t->data + es * b;
        unsigned hit = 0;
        if (f32) {
            for (uint64_t i = 0; i < e; i++) {
                uint32_t u;
                memcpy(&u, p + 4 * i, 4);
                hit |= (u & 0x7f800000u) == 0x7f800000u;
            }
        } else {
            for (uint64_t i = 0; i < e; i++) {
                uint16_t h;
                memcpy(&h, p + 2 * i, 2);
                hit |= (uint16_t)(h & mask) == mask;
            }
        }
        if (hit) return (int64_t)b + first_in_block(p, e, f32, mask);
    }
    return -1;
}

/* Records which tensor a loaded matrix came from (model_set_weight finds it by that name). */
static hearth_status remember_name(loader *L, const char *name, op_weight *w) {
    model *m = L->m;
    model_named_weight *grown = realloc(m->named, ((size_t)m->n_named + 1) * sizeof *grown);
    char *copy = strdup(name);
    if (grown) m->named = grown;
    if (!grown || !copy) {
        free(copy);
        return err_set(L->err, HEARTH_ERR_NOMEM, "out of memory");
    }
    m->named[m->n_named++] = (model_named_weight){copy, w};
    return HEARTH_OK;
}

/* A matrix [n_out, n_in] in any format: plain, GGUF block-quantized, or MLX affine
 * (module.weight uint32 + module.scales + module.biases). */
static hearth_status load_tensor_matrix(loader *L, const char *module, const char *name, int64_t n_out, int64_t n_in,
                                        op_weight *w);
static hearth_status load_matrix(loader *L, const char *module, int64_t n_out, int64_t n_in, op_weight *w) {
    char name[520]; /* module names are at most 511 bytes (their buffers' size) */
    snprintf(name, sizeof name, "%.511s.weight", module);
    return load_tensor_matrix(L, module, name, n_out, n_in, w);
}

/* load_matrix of the tensor `name` (a checkpoint's bare parameter, e.g. Hugging Face's
 * experts.gate_up_proj, has no ".weight"); module names its MLX scales and biases. */
static hearth_status load_tensor_matrix(loader *L, const char *module, const char *name, int64_t n_out, int64_t n_in,
                                        op_weight *w) {
    hearth_status st;
    memset(w, 0, sizeof *w);
    const tensor_info *t = model_find_tensor(L->hm, name);
    const char *file = t && t->file ? t->file : L->hm->entry.path;
    if (!t) return err_set(L->err, HEARTH_ERR_FORMAT, "%s: missing tensor '%s'", L->hm->entry.path, name);
    int bits = 0, group = 0;
    /* stacked experts [experts, rows, cols] are one matrix of experts * rows rows */
    int64_t cols = t->ndim == 2 || t->ndim == 3 ? t->shape[t->ndim - 1] : -1;
    int64_t rows = t->ndim == 3 ? t->shape[0] * t->shape[1] : t->shape[0];
    if (t->ndim == 1 && n_out == 1) rows = 1, cols = t->shape[0]; /* GGUF's one-row gate vectors */
    int quant = !L->gguf && t->dtype == DT_U32 && mlxq_lookup(&L->hm->quant, module, &bits, &group);
    if (quant && bits > 0) cols = cols * 32 / bits;
    if ((t->ndim < 1 || t->ndim > 3 || (t->ndim == 1 && n_out != 1)) || rows != n_out || cols != n_in)
        return err_set(L->err, HEARTH_ERR_FORMAT, "%s: tensor '%s' has shape [%lld,%lld], expected [%lld,%lld]", file,
                       name, (long long)rows, (long long)cols, (long long)n_out, (long long)n_in);
    w->dtype = t->dtype;
    w->n = n_out;
    w->k = n_in;
    if (quant) {
        char sn[560], bn[560];
        snprintf(sn, sizeof sn, "%s.scales", module);
        snprintf(bn, sizeof bn, "%s.biases", module);
        const tensor_info *s = model_find_tensor(L->hm, sn), *b = model_find_tensor(L->hm, bn);
        if (!s || !b || s->dtype != b->dtype || tensor_elems(s) != (uint64_t)(n_out * (n_in / group)) ||
            tensor_elems(b) != tensor_elems(s))
            return err_set(L->err, HEARTH_ERR_FORMAT, "%s: '%s' needs %s and %s of %lld values each", file, name, sn,
                           bn, (long long)(n_out * (n_in / group)));
        w->bits = bits;
        w->group_size = group;
        w->sb_dtype = s->dtype;
        w->scales = copy_bytes(L, s);
        w->biases = copy_bytes(L, b);
    }
    w->data = copy_bytes(L, t);
    if (L->cap && (st = remember_name(L, name, w))) return st;
    if (!L->cap) {
        int64_t bad = first_non_finite(t);
        drop_pages(L->hm, t->data, t->nbytes); /* the check read them (mapped too: the forward pass faults them back) */
        if (bad >= 0)
            return err_set(L->err, HEARTH_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value at index %lld", file,
                           name, (long long)bad);
        return HEARTH_OK;
    }
    return op_weight_check(w, name, L->err);
    return HEARTH_OK;
}

/* The same from GGUF, llama.cpp's names: the router ffn_gate_inp [experts, hidden], the
 * experts ffn_{gate,up,down}_exps [experts, rows, cols], the shared expert *_shexp and its
 * gate ffn_gate_inp_shexp (one row). */
static hearth_status load_moe_gguf(loader *L, int i, layer_weights *lw) {
    const model_config *c = &L->m->cfg;
    char module[512];
    hearth_status st;
    int64_t E = c->n_experts, F = c->moe_ffn, S = c->shared_ffn, H = c->hidden;
    snprintf(module, sizeof module, "blk.%d.ffn_gate_up_exps.weight", i);
    if (model_find_tensor(L->hm, module))
        return err_set(L->err, HEARTH_ERR_UNSUPPORTED, "%s: fused expert tensor '%s' is not supported yet",
                       L->hm->entry.path, module);
    struct { const char *name; op_weight *w; int64_t rows, cols; int present; } mats[] = {
        {"ffn_gate_inp", &lw->router, E, H, 1},
        {"ffn_gate_exps", &lw->experts_gate, E * F, H, 1},
        {"ffn_up_exps", &lw->experts_up, E * F, H, 1},
        {"ffn_down_exps", &lw->experts_down, E * H, F, 1},
        {"ffn_gate_shexp", &lw->shared_gate, S, H, S > 0},
        {"ffn_up_shexp", &lw->shared_up, S, H, S > 0},
        {"ffn_down_shexp", &lw->shared_down, H, S, S > 0},
        {"ffn_gate_inp_shexp", &lw->shared_router, 1, H, S > 0},
    };
    for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++) {
        snprintf(module, sizeof module, "blk.%d.%s", i, mats[j].name);
        if (mats[j].present && (st = load_matrix(L, module, mats[j].rows, mats[j].cols, mats[j].w))) return st;
    }
    return HEARTH_OK;
}

/* A Qwen3-MoE layer's router (mlp.gate) and its experts stacked as mlx-lm stores them
 * (mlp.switch_mlp.{gate,up,down}_proj: [experts, rows, cols]). */
static hearth_status load_moe(loader *L, int i, layer_weights *lw) {
    const model_config *c = &L->m->cfg;
    char module[512];
    hearth_status st;
    int64_t E = c->n_experts;
    if (L->gguf) return load_moe_gguf(L, i, lw);
    snprintf(module, sizeof module, "%slayers.%d.mlp.gate", L->prefix, i);
    if ((st = load_matrix(L, module, E, c->hidden, &lw->router))) return st;
    struct { const char *name; op_weight *w; int64_t rows, cols; } ex[] = {
        {"gate_proj", &lw->experts_gate, c->moe_ffn, c->hidden},
        {"up_proj", &lw->experts_up, c->moe_ffn, c->hidden},
        {"down_proj", &lw->experts_down, c->hidden, c->moe_ffn},
    };
    for (int j = 0; j < 3; j++) {
        snprintf(module, sizeof module, "%slayers.%d.mlp.switch_mlp.%s", L->prefix, i, ex[j].name);
        if ((st = load_matrix(L, module, E * ex[j].rows, ex[j].cols, ex[j].w))) return st;
    }
    if (!c->shared_ffn) return HEARTH_OK;
    /* qwen3_5_moe: the shared expert (mlp.shared_expert.*) and its gate (mlp.shared_expert_gate) */
    struct { const char *name; op_weight *w; int64_t rows, cols; } sh[] = {
        {"shared_expert.gate_proj", &lw->shared_gate, c->shared_ffn, c->hidden},
        {"shared_expert.up_proj", &lw->shared_up, c->shared_ffn, c->hidden},
        {"shared_expert.down_proj", &lw->shared_down, c->hidden, c->shared_ffn},
        {"shared_expert_gate", &lw->shared_router, 1, c->hidden},
    };
    for (int j = 0; j < 4; j++) {
        snprintf(module, sizeof module, "%slayers.%d.mlp.%s", L->prefix, i, sh[j].name);
        if ((st = load_matrix(L, module, sh[j].rows, sh[j].cols, sh[j].w))) return st;
    }
    return HEARTH_OK;
}

/* ---- qwen3_5: a Gated DeltaNet layer (mlx-lm models/qwen3_5.py GatedDeltaNet) ---- */
static hearth_status load_gdn(loader *L, int i, layer_weights *lw) {
    const model_config *c = &L->m->cfg;
    char module[512], name[560];
    hearth_status st;
    int64_t kd = (int64_t)c->gdn_k_heads * c->gdn_k_dim, vd = (int64_t)c->gdn_v_heads * c->gdn_v_dim;
    int64_t conv = 2 * kd + vd;
    /* names: HF / mlx-lm, then llama.cpp's (GGUF; its value heads tiled, op_dims.gdn_v_tiled) */
    struct { const char *name, *gguf; op_weight *w; int64_t rows, cols; } mats[] = {
        {"in_proj_qkv", "attn_qkv", &lw->gdn_qkv, conv, c->hidden},
        {"in_proj_z", "attn_gate", &lw->gdn_z, vd, c->hidden},
        {"in_proj_b", "ssm_beta", &lw->gdn_b, c->gdn_v_heads, c->hidden},
        {"in_proj_a", "ssm_alpha", &lw->gdn_a, c->gdn_v_heads, c->hidden},
        {"out_proj", "ssm_out", &lw->gdn_out, c->hidden, vd},
    };
    for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++) {
        if (L->gguf) snprintf(module, sizeof module, "blk.%d.%s", i, mats[j].gguf);
        else snprintf(module, sizeof module, "%slayers.%d.linear_attn.%s", L->prefix, i, mats[j].name);
        if ((st = load_matrix(L, module, mats[j].rows, mats[j].cols, mats[j].w))) return st;
    }
    struct { const char *name, *gguf; const float **v; int64_t n; } vecs[] = {
        {"conv1d.weight", "ssm_conv1d.weight", &lw->gdn_conv, conv * c->gdn_conv},
        {"A_log", "ssm_a", &lw->gdn_A_log, c->gdn_v_heads},
        {"dt_bias", "ssm_dt.bias", &lw->gdn_dt_bias, c->gdn_v_heads},
        {"norm.weight", "ssm_norm.weight", &lw->gdn_norm, c->gdn_v_dim},
    };
    for (size_t j = 0; j < sizeof vecs / sizeof vecs[0]; j++) {
        if (L->gguf) snprintf(name, sizeof name, "blk.%d.%s", i, vecs[j].gguf);
        else snprintf(name, sizeof name, "%slayers.%d.linear_attn.%s", L->prefix, i, vecs[j].name);
        if ((st = load_vector(L, name, vecs[j].n, 1, vecs[j].v))) return st;
    }
    if (L->gguf && lw->gdn_A_log) { /* the converter stores ssm_a = -exp(A_log) */
        float *a = (float *)lw->gdn_A_log;
        for (int h = 0; h < c->gdn_v_heads; h++) {
            if (!(a[h] < 0.0f))
                return err_set(L->err, HEARTH_ERR_FORMAT,
                               "%s: blk.%d.ssm_a[%d] is %g; it must be negative (-exp(A_log))", L->hm->entry.path, i,
                               h, (double)a[h]);
            a[h] = logf(-a[h]);
        }
    }
    return HEARTH_OK;
}

/* Which layers are Gated DeltaNet ones and their state-pool index; and whether the norms
 * are stored as HF's offsets from 1 (a checkpoint mlx-lm has not sanitized: its conv1d
 * weight is [conv_dim, 1, width], mlx-lm's is [conv_dim, width, 1]; mlx-lm adds 1 to the
 * layer, final and q/k norms of such a checkpoint, not to the gated norm). */
static void qwen3_5_layout(loader *L) {
    model *m = L->m;
    int n = 0, kv = 0;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        m->layers[i].linear = (i + 1) % m->cfg.full_interval != 0;
        m->layers[i].state_layer = m->layers[i].linear ? n++ : -1;
        m->layers[i].kv_layer = m->layers[i].linear ? -1 : kv++; /* the KV pool holds attention layers only */
        if (m->layers[i].linear && m->layers[i].state_layer == 0) {
            char name[512];
            snprintf(name, sizeof name, "%slayers.%d.linear_attn.conv1d.weight", L->prefix, i);
            const tensor_info *t = model_find_tensor(L->hm, name);
            m->cfg.norm_shift = t && t->ndim == 3 && t->shape[2] != 1 ? 1.0f : 0.0f;
        }
    }
}
/* ---- end qwen3_5 ---- */

static hearth_status load_layer(loader *L, int i, layer_weights *lw) {
    const model_config *c = &L->m->cfg;
    char name[512], module[512];
    hearth_status st;
    struct { role r; op_weight *w; int64_t n_out, n_in; } mats[] = {
        {R_Q, &lw->q, (int64_t)c->n_heads * c->head_dim * (1 + c->attn_gate), c->hidden},
        {R_K, &lw->k, (int64_t)c->n_kv_heads * c->head_dim, c->hidden},
        {R_V, &lw->v, (int64_t)c->n_kv_heads * c->head_dim, c->hidden},
        {R_O, &lw->o, c->hidden, (int64_t)c->n_heads * c->head_dim},
        {R_GATE, &lw->gate, c->ffn, c->hidden},
        {R_UP, &lw->up, c->ffn, c->hidden},
        {R_DOWN, &lw->down, c->hidden, c->ffn},
    };
    lw->moe = model_layer_is_moe(L->hm, c, i);
    if (lw->moe && (st = load_moe(L, i, lw))) return st;
    if (lw->linear && (st = load_gdn(L, i, lw))) return st;
    for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++) {
        if (lw->moe && mats[j].r >= R_GATE && mats[j].r <= R_DOWN) continue; /* experts instead */
        if (lw->linear && mats[j].r <= R_O) continue;                        /* a Gated DeltaNet layer instead */
        layer_name(L, i, mats[j].r, "weight", name, sizeof name);
        snprintf(module, sizeof module, "%.*s", (int)(strlen(name) - 7), name);
        if ((st = load_matrix(L, module, mats[j].n_out, mats[j].n_in, mats[j].w))) return st;
    }
    int gemma = c->family == FAMILY_GEMMA3, qk = c->family == FAMILY_QWEN3 || c->family == FAMILY_QWEN3_MOE || gemma;
    if (c->family == FAMILY_QWEN3_5) qk = !lw->linear;
    if ((st = load_vector(L, layer_name(L, i, R_ATTN_NORM, "weight", name, sizeof name), c->hidden, 1, &lw->attn_norm)) ||
        (st = load_vector(L, layer_name(L, i, R_FFN_NORM, "weight", name, sizeof name), c->hidden, 1, &lw->ffn_norm)) ||
        (gemma && (st = load_vector(L, layer_name(L, i, R_POST_ATTN_NORM, "weight", name, sizeof name), c->hidden, 1,
                                    &lw->post_attn_norm))) ||
        (st = load_vector(L, layer_name(L, i, R_POST_FFN_NORM, "weight", name, sizeof name), c->hidden, gemma,
                          &lw->post_ffn_norm)) ||
        (st = load_vector(L, layer_name(L, i, R_Q_NORM, "weight", name, sizeof name), c->head_dim, qk, &lw->q_norm)) ||
        (st = load_vector(L, layer_name(L, i, R_K_NORM, "weight", name, sizeof name), c->head_dim, qk, &lw->k_norm)) ||
        (st = load_vector(L, layer_name(L, i, R_Q, "bias", name, sizeof name), (int64_t)c->n_heads * c->head_dim, 0,
                          &lw->q_bias)) ||
        (st = load_vector(L, layer_name(L, i, R_K, "bias", name, sizeof name), (int64_t)c->n_kv_heads * c->head_dim, 0,
                          &lw->k_bias)) ||
        (st = load_vector(L, layer_name(L, i, R_V, "bias", name, sizeof name), (int64_t)c->n_kv_heads * c->head_dim, 0,
                          &lw->v_bias)))
        return st;
    return HEARTH_OK;
}

/* ---- Gemma 4 (mlx-lm models/gemma4_text.py): a layer's weights by the shapes of its type
 * (sliding: head_dim and num_key_value_heads; full: global_head_dim and, with
 * attention_k_eq_v, num_global_key_value_heads and no v_proj), no k/v for the layers that
 * read an earlier layer's KV, a double-wide MLP on those where configured, the per-layer
 * input gate, and the model's per-layer input tables. */
static const char *gemma4_name(loader *L, int layer, const char *what, char *buf, size_t n) {
    snprintf(buf, n, "%slayers.%d.%s", L->prefix, layer, what);
    return buf;
}

/* A layer's tensor by its HF / mlx-lm name, or in a GGUF by llama.cpp's (blk.N.<gguf>). */
static const char *gemma4_tensor(loader *L, int layer, const char *hf, const char *gguf, char *buf, size_t n) {
    if (L->gguf) snprintf(buf, n, "blk.%d.%s", layer, gguf);
    else gemma4_name(L, layer, hf, buf, n);
    return buf;
}

/* The MoE block of a layer (enable_moe_block): router, experts stacked [experts, rows, cols]
 * as mlx-lm's sanitize leaves them (experts.switch_glu.*), and its three extra norms. */
static hearth_status load_gemma4_moe(loader *L, int i, layer_weights *lw) {
    const model_config *c = &L->m->cfg;
    char name[512];
    hearth_status st;
    int64_t E = c->n_experts, F = c->moe_ffn, H = c->hidden;
    lw->moe = 1;
    struct { const char *name, *gguf; op_weight *w; int64_t n_out, n_in; } mats[] = {
        {"router.proj", "ffn_gate_inp", &lw->router, E, H},
        {"experts.switch_glu.gate_proj", "ffn_gate_exps", &lw->experts_gate, E * F, H},
        {"experts.switch_glu.up_proj", "ffn_up_exps", &lw->experts_up, E * F, H},
        {"experts.switch_glu.down_proj", "ffn_down_exps", &lw->experts_down, E * H, F},
    };
    char module[512];
    /* Hugging Face's own layout (before mlx-lm's sanitize): experts.gate_up_proj [experts,
     * 2 * moe_ffn, hidden], each expert's gate rows then its up rows, and experts.down_proj,
     * both bare parameters; the experts' up is then read from the fused weight. llama.cpp's
     * converter keeps that fusion (ffn_gate_up_exps). */
    int fused = model_find_tensor(L->hm, gemma4_tensor(L, i, "experts.gate_up_proj", "ffn_gate_up_exps.weight", module,
                                                       sizeof module)) != NULL;
    for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++) {
        gemma4_tensor(L, i, mats[j].name, mats[j].gguf, module, sizeof module);
        if (fused && j == 1)
            st = load_tensor_matrix(L, module, gemma4_tensor(L, i, "experts.gate_up_proj", "ffn_gate_up_exps.weight",
                                                             name, sizeof name), 2 * E * F, H, mats[j].w);
        else if (fused && j == 2) continue;
        else if (fused && j == 3 && !L->gguf)
            st = load_tensor_matrix(L, module, gemma4_name(L, i, "experts.down_proj", name, sizeof name), E * H, F,
                                    mats[j].w);
        else st = load_matrix(L, module, mats[j].n_out, mats[j].n_in, mats[j].w);
        if (st) return st;
    }
    /* the converter names router.scale ffn_gate_inp.scale and per_expert_scale (a per-expert
     * factor on the experts' outputs) ffn_down_exps.scale */
    struct { const char *name, *gguf; const float **v; int64_t n; } vecs[] = {
        {"router.scale", "ffn_gate_inp.scale", &lw->router_norm, H},
        {"router.per_expert_scale", "ffn_down_exps.scale", &lw->expert_scale, E},
        {"pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight", &lw->ffn_norm_2, H},
        {"post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight", &lw->post_ffn_norm_1, H},
        {"post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight", &lw->post_ffn_norm_2, H},
    };
    for (size_t j = 0; j < sizeof vecs / sizeof vecs[0]; j++)
        if ((st = load_vector(L, gemma4_tensor(L, i, vecs[j].name, vecs[j].gguf, name, sizeof name), vecs[j].n, 1,
                              vecs[j].v)))
            return st;
    if (lw->router_norm) { /* the router's norm weight: scale * hidden^-0.5, a float32 product as mlx-lm's */
        float *w = (float *)lw->router_norm, root = (float)pow((double)H, -0.5);
        for (int64_t k = 0; k < H; k++) w[k] *= root;
    }
    return HEARTH_OK;
}

static hearth_status load_gemma4_layer(loader *L, int i, layer_weights *lw) {
    const model_config *c = &L->m->cfg;
    char name[512];
    hearth_status st;
    int full = c->layer_full[i];
    lw->sliding = !full;
    lw->head_dim = full ? c->full_head_dim : c->swa_head_dim;
    lw->n_kv_heads = full ? c->full_kv_heads : c->swa_kv_heads;
    lw->shares_kv = i >= c->first_shared;
    lw->kv_layer = c->layer_kv[i];
    lw->ffn = lw->shares_kv && c->double_wide ? c->ffn : c->swa_ffn;
    int64_t qd = (int64_t)c->n_heads * lw->head_dim, kd = (int64_t)lw->n_kv_heads * lw->head_dim, H = c->hidden;
    int has_v = !lw->shares_kv && !(full && c->k_eq_v);
    if (L->gguf && model_find_tensor(L->hm, gemma4_tensor(L, i, "", "attn_qkv.weight", name, sizeof name)))
        return err_set(L->err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s' (fused Q/K/V) is not supported; "
                       "hearth reads attn_q, attn_k and attn_v", L->hm->entry.path, name);
    if (L->gguf) /* llama.cpp: a layer without attn_v takes its values from the keys */
        has_v = !lw->shares_kv && model_find_tensor(L->hm, gemma4_tensor(L, i, "", "attn_v.weight", name, sizeof name));
    struct { const char *name, *gguf; op_weight *w; int64_t n_out, n_in; int present; } mats[] = {
        {"self_attn.q_proj", "attn_q", &lw->q, qd, H, 1},
        {"self_attn.k_proj", "attn_k", &lw->k, kd, H, !lw->shares_kv},
        {"self_attn.v_proj", "attn_v", &lw->v, kd, H, has_v},
        {"self_attn.o_proj", "attn_output", &lw->o, H, qd, 1},
        {"mlp.gate_proj", "ffn_gate", &lw->gate, lw->ffn, H, 1},
        {"mlp.up_proj", "ffn_up", &lw->up, lw->ffn, H, 1},
        {"mlp.down_proj", "ffn_down", &lw->down, H, lw->ffn, 1},
        {"per_layer_input_gate", "inp_gate", &lw->pl_gate, c->per_layer_dim, H, c->per_layer_dim > 0},
        {"per_layer_projection", "proj", &lw->pl_proj, H, c->per_layer_dim, c->per_layer_dim > 0},
    };
    for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++)
        if (mats[j].present &&
            (st = load_matrix(L, gemma4_tensor(L, i, mats[j].name, mats[j].gguf, name, sizeof name), mats[j].n_out,
                              mats[j].n_in, mats[j].w)))
            return st;
    struct { const char *name, *gguf; const float **v; int64_t n; int present; } vecs[] = {
        {"input_layernorm.weight", "attn_norm.weight", &lw->attn_norm, H, 1},
        {"post_attention_layernorm.weight", "post_attention_norm.weight", &lw->post_attn_norm, H, 1},
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight", &lw->ffn_norm, H, 1},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", &lw->post_ffn_norm, H, 1},
        {"self_attn.q_norm.weight", "attn_q_norm.weight", &lw->q_norm, lw->head_dim, 1},
        {"self_attn.k_norm.weight", "attn_k_norm.weight", &lw->k_norm, lw->head_dim, !lw->shares_kv},
        {"layer_scalar", "layer_output_scale.weight", &lw->layer_scalar, 1, 1},
        {"post_per_layer_input_norm.weight", "post_norm.weight", &lw->pl_norm, H, c->per_layer_dim > 0},
    };
    /* llama.cpp reads a GGUF without layer_output_scale as a scale of 1 */
    int unscaled = L->gguf && !model_find_tensor(L->hm, gemma4_tensor(L, i, "", "layer_output_scale.weight", name,
                                                                      sizeof name));
    for (size_t j = 0; j < sizeof vecs / sizeof vecs[0]; j++)
        if (vecs[j].present && !(unscaled && vecs[j].v == &lw->layer_scalar) &&
            (st = load_vector(L, gemma4_tensor(L, i, vecs[j].name, vecs[j].gguf, name, sizeof name), vecs[j].n, 1,
                              vecs[j].v)))
            return st;
    if (unscaled) {
        float *one = arena_take(L, sizeof *one);
        if (one) *one = 1.0f;
        lw->layer_scalar = one;
    }
    return c->n_experts ? load_gemma4_moe(L, i, lw) : HEARTH_OK;
}

static hearth_status load_gemma4_model(loader *L) {
    model *m = L->m;
    const model_config *c = &m->cfg;
    char name[512];
    hearth_status st;
    if (!c->per_layer_dim) return HEARTH_OK;
    int64_t all = (int64_t)c->n_layers * c->per_layer_dim;
    const char *prefix = L->gguf ? "" : L->prefix;
    snprintf(name, sizeof name, "%s%s", prefix, L->gguf ? "per_layer_token_embd" : "embed_tokens_per_layer");
    if ((st = load_matrix(L, name, c->per_layer_vocab, all, &m->embed_per_layer))) return st;
    snprintf(name, sizeof name, "%s%s", prefix, L->gguf ? "per_layer_model_proj" : "per_layer_model_projection");
    if ((st = load_matrix(L, name, all, c->hidden, &m->per_layer_proj))) return st;
    snprintf(name, sizeof name, "%s%s", prefix,
             L->gguf ? "per_layer_proj_norm.weight" : "per_layer_projection_norm.weight");
    return load_vector(L, name, c->per_layer_dim, 1, &m->per_layer_proj_norm);
}
/* ---- end of Gemma 4 */

/* ---- multi-token prediction (model_load_mtp): mtp.layers.0 as a full-attention layer, mtp.fc
 * and its input norms, mtp.norm as the final norm; the embedding and lm_head are the target's */
static hearth_status load_mtp(loader *L) {
    model *m = L->m;
    const model_config *c = &m->cfg;
    hearth_status st;
    int64_t H = c->hidden;
    m->embed = L->target->embed;
    m->lm_head = L->target->lm_head;
    m->layers[0].kv_layer = 0, m->layers[0].state_layer = -1;
    L->prefix = "mtp.";
    if ((st = load_layer(L, 0, &m->layers[0])) || (st = load_matrix(L, "mtp.fc", H, 2 * H, &m->mtp_fc)) ||
        (st = load_vector(L, "mtp.pre_fc_norm_embedding.weight", H, 1, &m->mtp_norm_embed)) ||
        (st = load_vector(L, "mtp.pre_fc_norm_hidden.weight", H, 1, &m->mtp_norm_hidden)))
        return st;
    return load_vector(L, "mtp.norm.weight", H, 1, &m->final_norm);
}

static hearth_status load_all(loader *L) {
    model *m = L->m;
    const model_config *c = &m->cfg;
    hearth_status st;
    if (L->target) return load_mtp(L);
    char embed_name[64], norm_name[64];
    snprintf(embed_name, sizeof embed_name, "%sembed_tokens", L->prefix);
    snprintf(norm_name, sizeof norm_name, "%snorm.weight", L->prefix);
    if ((st = load_matrix(L, L->gguf ? "token_embd" : embed_name, c->vocab, c->hidden, &m->embed))) return st;
    for (int i = 0; i < c->n_layers; i++) m->layers[i].kv_layer = i;
    if (c->family == FAMILY_QWEN3_5) qwen3_5_layout(L);
    if (c->family == FAMILY_GEMMA4 && (st = load_gemma4_model(L))) return st;
    for (int i = 0; i < c->n_layers; i++) {
        if (c->family == FAMILY_GEMMA4) {
            if ((st = load_gemma4_layer(L, i, &m->layers[i]))) return st;
            continue;
        }
        if ((st = load_layer(L, i, &m->layers[i]))) return st;
        m->layers[i].sliding = c->sliding_pattern > 0 && (i + 1) % c->sliding_pattern != 0;
    }
    if ((st = load_vector(L, L->gguf ? "output_norm.weight" : norm_name, c->hidden, 1, &m->final_norm)))
        return st;
    const char *head = L->gguf ? "output" : L->head;
    char name[64];
    snprintf(name, sizeof name, "%s.weight", head);
    if (model_find_tensor(L->hm, name)) return load_matrix(L, head, c->vocab, c->hidden, &m->lm_head);
    m->lm_head = m->embed; /* tied embeddings */
    return HEARTH_OK;
}

hearth_status model_config_read(const hearth_model *hm, model_config *c, hearth_error *err);

static const char *weight_prefix(const hearth_model *hm) {
    /* multimodal checkpoints (Qwen3.5, Gemma 4 with vision / audio towers) nest the text
     * model: its weights are read, the towers are not loaded */
    if (model_find_tensor(hm, "language_model.model.embed_tokens.weight")) return "language_model.model."; /* mlx-lm */
    if (model_find_tensor(hm, "model.language_model.embed_tokens.weight")) return "model.language_model."; /* HF */
    return !model_find_tensor(hm, "model.embed_tokens.weight") && model_find_tensor(hm, "embed_tokens.weight")
               ? ""
               : "model.";
}

static const char *head_name(const hearth_model *hm) {
    return model_find_tensor(hm, "language_model.lm_head.weight") ? "language_model.lm_head" : "lm_head";
}

/* The head's config: the model's, with one full-attention layer and no recurrent state. */
static hearth_status mtp_config(const hearth_model *hm, const model *t, model_config *c, hearth_error *err) {
    if (t->cfg.family != FAMILY_QWEN3_5 || t->cfg.mtp)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: multi-token prediction is Qwen3.5's (mtp.* weights); this "
                       "model has none hearth runs",
                       hm->entry.path);
    if (t->cfg.n_experts > 0)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: the multi-token-prediction head of a mixture-of-experts "
                       "Qwen3.5 is not supported yet",
                       hm->entry.path);
    if (!model_find_tensor(hm, "mtp.fc.weight"))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: no multi-token-prediction head (no tensor 'mtp.fc.weight'; "
                       "config.json declares %d MTP layers). mlx-lm's conversions drop the mtp.* weights: use the "
                       "Hugging Face checkpoint",
                       hm->entry.path, t->cfg.mtp_layers);
    c->n_layers = 1, c->n_state_layers = 0, c->n_kv_layers = 1, c->full_interval = 1, c->mtp = 1;
    c->norm_shift = t->cfg.norm_shift; /* the checkpoint's form, read from the model's layers */
    return HEARTH_OK;
}

static hearth_status plan_with(const hearth_model *hm, int use_mmap, const model *target, model **out,
                               hearth_error *err) {
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_status st = model_config_read(hm, &m->cfg, err);
    if (!st && target) st = mtp_config(hm, target, &m->cfg, err);
    if (!st && !(m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers)))
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    loader L = {.hm = hm,
                .m = m,
                .gguf = hm->entry.format == MODEL_FORMAT_GGUF,
                .use_mmap = use_mmap,
                .err = err,
                .prefix = weight_prefix(hm),
                .head = head_name(hm),
                .target = target};
    if (!st) st = load_all(&L); /* sizing pass: checks names and shapes, copies nothing */
    if (!st) st = model_ops_build(m, err);
    if (st) {
        model_free(m);
        return st;
    }
    m->arena_bytes = L.used;
    m->load_peak_bytes = L.load_peak;
    *out = m;
    return HEARTH_OK;
}

hearth_status model_plan(const hearth_model *hm, int use_mmap, model **out, hearth_error *err) {
    return plan_with(hm, use_mmap, NULL, out, err);
}

hearth_status model_plan_mtp(const hearth_model *hm, const model *target, model **out, hearth_error *err) {
    return plan_with(hm, 0, target, out, err);
}

/* Drops the tensor pages of a file mapping from this process once the weights are copied
 * (MADV_DONTNEED on a private read-only mapping: the page cache keeps them and a later read
 * faults them back). Without it the process held every weight twice, in the arena and as
 * mapped file pages (1B Q4_0: RssAnon 780 MB + RssFile 756 MB), and that is what top and
 * fit's running footprint showed. The pages before the first tensor (metadata) stay. */
static void drop_tensor_pages(const file_map *fm, const tensor_info *t, size_t n) {
    if (!fm->data || !n) return;
    const uint8_t *start = NULL;
    for (size_t i = 0; i < n; i++)
        if (!start || t[i].data < start) start = t[i].data;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)start + page - 1) & ~(page - 1),
              hi = ((uintptr_t)fm->data + fm->size + page - 1) & ~(page - 1);
    if (page > 1 && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void model_drop_file_pages(const hearth_model *hm) {
    if (hm->entry.format == MODEL_FORMAT_GGUF) drop_tensor_pages(&hm->gguf.map, hm->gguf.tensors, hm->gguf.n_tensors);
    else
        for (size_t i = 0; i < hm->st.n_files; i++)
            drop_tensor_pages(&hm->st.files[i].map, hm->st.files[i].tensors, hm->st.files[i].n_tensors);
}

/* op_model.release_host of a mapped load: [p, p + n)'s pages with the fault-around windows
 * its reading mapped, within p's file mapping (never past it: an anonymous neighbour's pages
 * would come back as zeros), leave the process. Private read-only file pages: a later read
 * faults them in again from the page cache or the file. */
static void release_mapped(const void *ctx, const void *p, size_t n) {
    if (p) drop_pages(ctx, p, n);
}

static hearth_status load_with(const hearth_model *hm, int use_mmap, const model *target, model **out,
                               hearth_error *err) {
    model *m;
    hearth_status st = plan_with(hm, use_mmap, target, &m, err);
    if (st) return st;
    loader L = {.hm = hm,
                .m = m,
                .gguf = hm->entry.format == MODEL_FORMAT_GGUF,
                .use_mmap = use_mmap,
                .err = err,
                .cap = m->arena_bytes,
                .prefix = weight_prefix(hm),
                .head = head_name(hm),
                .target = target};
    if (!(L.arena = mem_alloc_stream(L.cap)))
        st = err_set(err, HEARTH_ERR_NOMEM, "%s: cannot allocate %.1f MiB for the weights", hm->entry.path,
                     (double)L.cap / (1024.0 * 1024.0));
    else {
        m->arena = L.arena;
        st = load_all(&L);
    }
    if (!st) st = model_ops_build(m, err); /* the vectors' pointers are set now */
    if (st) {
        model_free(m);
        return st;
    }
    if (!use_mmap) model_drop_file_pages(hm);
    if (use_mmap) m->ops.release_host = release_mapped, m->ops.release_ctx = hm;
    *out = m;
    return HEARTH_OK;
}

hearth_status model_load(const hearth_model *hm, int use_mmap, model **out, hearth_error *err) {
    return load_with(hm, use_mmap, NULL, out, err);
}

hearth_status model_load_mtp(const hearth_model *hm, const model *target, model **out, hearth_error *err) {
    return load_with(hm, 0, target, out, err);
}

size_t model_weight_bytes(const model *m) { return m->arena_bytes; }
size_t model_load_peak_bytes(const model *m) { return m->load_peak_bytes; }

hearth_status model_set_weight(model *m, const char *tensor, const op_weight *w, op_weight *old, hearth_error *err) {
    op_weight *named = NULL;
    for (int i = 0; i < m->n_named && !named; i++)
        if (!strcmp(m->named[i].tensor, tensor)) named = m->named[i].w;
    if (!named) return err_set(err, HEARTH_ERR_INVALID, "no loaded weight '%s'", tensor);
    if (w->n != named->n || w->k != named->k)
        return err_set(err, HEARTH_ERR_INVALID, "'%s': [%lld,%lld] in place of [%lld,%lld]", tensor, (long long)w->n,
                       (long long)w->k, (long long)named->n, (long long)named->k);
    hearth_status st = op_weight_check(w, tensor, err);
    if (st) return st;
    const void *was = named->data;
    if (old) *old = *named;
    /* a tied table is held twice (embed and lm_head, one data): both views change */
    if (m->embed.data == was) m->embed = *w;
    if (m->lm_head.data == was) m->lm_head = *w;
    *named = *w;
    return HEARTH_OK;
}

void model_free(model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_named; i++) free(m->named[i].tensor);
    free(m->named);
    free(m->arena);
    free(m->layers);
    free(m->items);
    free(m->layer_window);
    if (m->cfg.inv_freq_local != m->cfg.inv_freq_global) free(m->cfg.inv_freq_local);
    free(m->cfg.layer_full);
    free(m->cfg.layer_kv);
    free(m->cfg.kv_heads);
    free(m->cfg.kv_dims);
    free(m->cfg.inv_freq_global);
    free(m);
}
