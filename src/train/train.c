/* train.c: hearth train (hearth.h, "training"): LoRA SFT of a llama-, qwen3-, minicpm-, gemma3- or gemma4-family
 * decoder on the CPU in float32, following mlx_lm.lora 0.32.2 step for step: the same
 * batches in the same order (numpy's legacy generator seeded with --seed), the loss
 * averaged over the batch's target tokens, Adam without bias correction, the same adapter
 * files. The forward keeps every activation of the LoRA layers; the backward runs the ops'
 * backwards (train_ops.c) from the loss down to the lowest LoRA layer. Frozen weights are
 * dequantized to float32 once at load. */
#include "base/err.h"
#include "engine/fit_internal.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/model.h"
#include "model/model_handle.h"
#include "train/train_internal.h"
#include "train/train_ops.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The trained projections: attention's and the MLP's, Gemma 4's per-layer input gate and
 * projection, Qwen3.5's Gated DeltaNet projections, and a mixture-of-experts layer's router, shared expert
 * (Qwen3.5-MoE: gate, up, down and its one-row gate) and routed experts (one pair per expert: ne[p] of them, each
 * expert's A [k, r] and B [r, n] one after the other), as mlx_lm.lora's default keys adapt
 * them. A layer without one (Gemma 4's shared-KV layers have no k and v, its full layers
 * with values = keys no v, the other families no per-layer ones) has n 0. */
enum {
    P_Q,
    P_K,
    P_V,
    P_O,
    P_GATE,
    P_UP,
    P_DOWN,
    P_PLG,
    P_PLP,
    P_GQKV,
    P_GZ,
    P_GB,
    P_GA,
    P_GOUT, /* a Gated DeltaNet layer's in_proj_qkv / z / b / a and out_proj */
    P_RT,
    P_SG,
    P_SU,
    P_SD,
    P_SR,
    P_EG,
    P_EU,
    P_ED,
    N_P
};
#define GDN_CK 16 /* Gated DeltaNet: tokens between the states the backward starts again from */
static const char *const proj_name[N_P] = {"self_attn.q_proj",
                                           "self_attn.k_proj",
                                           "self_attn.v_proj",
                                           "self_attn.o_proj",
                                           "mlp.gate_proj",
                                           "mlp.up_proj",
                                           "mlp.down_proj",
                                           "per_layer_input_gate",
                                           "per_layer_projection",
                                           "linear_attn.in_proj_qkv",
                                           "linear_attn.in_proj_z",
                                           "linear_attn.in_proj_b",
                                           "linear_attn.in_proj_a",
                                           "linear_attn.out_proj",
                                           "mlp.gate",
                                           "mlp.shared_expert.gate_proj",
                                           "mlp.shared_expert.up_proj",
                                           "mlp.shared_expert.down_proj",
                                           "mlp.shared_expert_gate",
                                           "mlp.switch_mlp.gate_proj",
                                           "mlp.switch_mlp.up_proj",
                                           "mlp.switch_mlp.down_proj"};
static int is_expert(int p) { return p >= P_EG; }

/* One layer's activations for a sequence of up to T tokens, kept for the backward. */
typedef struct acts {
    float *x_in, *h1, *rstd1, *ql, *qr, *rstdq, *kl, *kr, *rstdk, *v, *p, *a, *x_mid, *h2, *rstd2, *g, *u, *mm;
    float *xa[N_P];
    float *ro, *rstd_pa, *rd, *rstd_pf; /* Gemma's post-norms: the attention and MLP outputs they norm */
    float *vl, *rstdv;                  /* Gemma 4: the values before their norm (unscaled) */
    float *x_pl, *pg, *pm, *pp, *rstd_pl; /* Gemma 4's per-layer input: its gate's input and output, the
                                             gated product, the projection, its norm */
    /* a mixture-of-experts MLP (Qwen3-MoE): the router's probabilities [T, E], each token's
     * experts and weights [T, K], and per (token, pick) the expert's gate, up, gated product
     * [T * K, Fm] and output [T * K, D] */
    float *mprob, *mw, *mg, *mu, *mh, *mo;
    float *xe[3]; /* the routed experts' LoRA: scale * x A of each (token, pick) for gate, up, down [T * K, r] */
    float *shg, *shu, *sho, *shz; /* Qwen3.5-MoE's shared expert: its gate, up, output, gate logit */
    float *rx, *rstd_r, *h2b, *rstd_b, *rd1, *rstd_p1, *eo, *rstd_p2; /* Gemma 4's experts: router input, experts'
                                                                         input, MLP and experts outputs, 1 / rms */
    int32_t *msel;
    /* Qwen3.5: a gated attention's queries and output gates (split from q_proj's rows) and its
     * gated output; a Gated DeltaNet layer's projections (raw qkv, z, b, a), the conv before and
     * after its SiLU, q and k normed and their 1 / rms, beta and g, y, 1 / rms of y, y normed,
     * the gated output, and the state before every GDN_CK-th token */
    float *qs, *qgate, *ag;
    float *graw, *gz, *gb, *ga, *gpre, *gcv, *gqn, *gkn, *grq, *grk, *gbeta, *gg, *gy, *gry, *gyn, *ggo, *gck;
} acts;

typedef struct tlayer {
    const float *w[N_P], *bias[3], *attn_norm, *ffn_norm, *q_norm, *k_norm;
    const float *post_attn_norm, *post_ffn_norm; /* Gemma's, else NULL */
    const float *inv_freq;                       /* its RoPE table (Gemma's sliding layers: the local base) */
    int window;                                  /* sliding-window layers: the window, else 0 */
    int hd, Hkv, F;                              /* its head_dim, KV heads and MLP width (Gemma 4: per layer) */
    int rd;                                      /* the head dims RoPE turns (Qwen3.5: a part; else hd) */
    int k_eq_v, v_norm;         /* Gemma 4: values are the keys' projection; values normed without a scale */
    int src;                    /* Gemma 4's shared-KV layers: the layer whose keys and values it reads, else -1 */
    float *kk, *kv, *kk2, *kv2; /* a layer others read the KV of: its keys and values (each slot) */
    float *dks, *dvs;           /* and the gradients the readers above it add to them */
    float layer_scalar;         /* Gemma 4: the block's output (and residual) times it, else 1 */
    const float *pl_norm;       /* Gemma 4: post_per_layer_input_norm */
    int moe;                    /* its MLP is routed experts (frozen): router [E, D], experts stacked as the model's */
    int linear;                 /* a Gated DeltaNet layer (Qwen3.5; frozen): its weights below */
    const float *gqkv, *gz, *gbw, *gaw, *gout, *conv, *A_log, *dt_bias, *gnorm;
    const float *router;
    const op_weight *eg, *eu, *ed;  /* the experts in their own format: each is made float32 when its turn comes */
    int fused;                      /* eg holds each expert's gate rows, then its up rows (eu NULL) */
    int beside;                     /* Gemma 4: the experts run beside a dense MLP, routed from x */
    const float *sg, *su, *sd, *sr; /* Qwen3.5-MoE: the shared expert and its one-row gate */
    /* Gemma 4's experts beside the MLP: the router's norm weight (its scale / sqrt(hidden)), the
     * per-expert scales, and the norms after the MLP, before and after the experts */
    const float *router_w, *expert_scale, *post_ffn_norm_1, *ffn_norm_2, *post_ffn_norm_2;
    int64_t n[N_P], k[N_P], ne[N_P]; /* ne: the routed experts' count (their pairs), else 1 */
    tr_lora lora[N_P];
    int has_lora;
    acts s, s2;      /* s2: the second sequence of a preference pair (dpo, orpo) */
    float *ck, *ck2; /* --grad-checkpoint: the layer's input (each slot) instead of s and s2 */
} tlayer;

typedef struct trainer {
    hearth_model *hm;
    model *m;
    threadpool *tp;
    int L, D, Hq, Hkv, hd, F, V, adjacent, first_lora, r, T;
    float eps, attn_scale, scale;
    float emb_scale, res_scale, logit_div; /* MiniCPM's (1 elsewhere): embeddings, block outputs, normed rows */
    int gelu, post_norms; /* Gemma: GELU(tanh)-gated MLP; each block's output normed before the residual */
    float softcap;        /* Gemma 4: final logit softcap (0: none) */
    int kv_shared;        /* Gemma 4: some layers read another layer's KV */
    int P;                /* Gemma 4's per-layer inputs: their width (0: none) */
    const float *pl_proj; /* per_layer_model_projection [L * P, D] */
    float *pl_in, *pl_tmp; /* the per-layer inputs [L][T][P]; the projection's [T, L * P] */
    float *pl_in2;         /* the second slot's per-layer inputs (dpo, orpo) */
    float *pl_row;         /* one row of the per-layer embedding table [L * P] */
    float *dvl, *dpl;      /* Gemma 4's backward: the unnormed values' gradient; the per-layer product's */
    int E, K, Fm, norm_topk; /* mixture of experts: experts, picks per token, expert width, renormalised picks */
    int Fs;                  /* Qwen3.5-MoE: the shared expert's width (0: none) */
    float *sdh, *sdg, *sdu, *sdo; /* its backward's scratch */
    float *g4b, *g4c, *g4x, *g4r; /* Gemma 4's experts backward: the MLP's and experts' outputs' gradients, the
                                     experts' and router's inputs' */
    float *mx, *mdx, *mga, *mua, *mdh, *mdg, *mdu, *mdo, *mdl; /* its scratch: gathered rows and gradients */
    float *mxa, *mhx, *sdx; /* the experts' LoRA: gathered x A rows, gathered gated products; the shared one's */
    float *ewg, *ewu, *ewd; /* one expert's gate, up [Fm, D] and down [D, Fm] in float32 */
    int eq;                 /* some experts are not float32 (ewg, ewu, ewd are made then) */
    int32_t *mrow;                                             /* the (token, pick) slots of one expert */
    int gated; /* Qwen3.5: attention output times sigmoid of a gate from q_proj */
    int Hk, Hv, Dk, Dv, Cc, Kc,
        gdn_tiled;   /* Gated DeltaNet geometry: key / value heads and dims, conv channels and width */
    int64_t gdn_per; /* floats of one value head's work area (gdn_work) */
    float *gdn_work, *gd_out, *gd_z, *gd_y, *gd_q, *gd_k, *gd_v, *gd_g, *gd_beta, *gd_qn, *gd_c, *gd_qkv, *gd_a, *gd_b;
    float *dqg, *dqf; /* gated attention's backward: the gate's gradient, q_proj's rows' */
    const float *final_norm, *lm_head;
    tlayer *layers;
    float **owned;
    int n_owned;
    acts shared; /* the activations of layers below the LoRA ones: not kept */
    int lora_off, pref; /* lora_off: the frozen base alone (dpo's reference); pref: two activation slots */
    int ckpt, opt;      /* --grad-checkpoint (the LoRA layers recompute into shared); the optimizer (OPT_*) */
    float weight_decay;
    float *xf2, *hf2, *rstdf2, *dh2, *ce; /* the second slot's final-norm activations; per-row ce */
    float *prefix, *prefix2; /* dpo: each sequence's input to the lowest LoRA layer, from the reference's pass */
    int dpo;
    float *dxs; /* res_scale != 1: the residual's gradient times it (the block outputs') */
    float *x, *tmp, *xf, *hf, *rstdf, *dx, *dtmp, *dmm, *dg, *du, *dq, *dk, *dv, *dql, *dkl, *da, *dh, *xent_scratch,
        *lin_scratch, *attn_scratch, *weight;
    int32_t *targets;
    float *adam_m, *adam_v;      /* one block over every LoRA tensor, in layer and projection order (Muon: its
                                    momentum in adam_m; Adafactor: each tensor's row and column means at its offset) */
    size_t n_params, max_tensor; /* max_tensor: the largest LoRA tensor's floats */
    float *opt_work;             /* Muon, Adafactor: one tensor's scratch (muon_tensor, adafactor_tensor) */
    int dora;                    /* --fine-tune-type dora: each pair has a magnitude m (tr_lora) */
    int moe_lora;                /* a mixture-of-experts layer's router, experts or shared expert is trained */
    int64_t dora_n;              /* the widest trained projection's outputs */
    float *dora_work;            /* [T, widest N]: the DoRA backward's (tr_lora.work) */
    /* dry: size everything, allocate and load nothing (hearth_train_fit); the bytes each
     * allocation would take, by what it holds (part) */
    int dry, part, threads, T1, T2; /* the two slots' longest sequences (a pair's chosen and rejected), for dry sizing */
    size_t dry_bytes[5];
} trainer;

/* Projection p's LoRA pair among a layer's, NULL where it has none. */
static const tr_lora *lora_of(const tr_lora *lo, int p) { return lo[p].a ? &lo[p] : NULL; }
static int trained(const tlayer *y, int p) { return y->lora[p].a != NULL; }
/* Projection p's module path in the adapter files (Gemma 4 names its router and experts otherwise). */
static const char *pname(const trainer *t, int p);
static int keyed(const hearth_train_options *o, const char *path);
/* Expert e's pair of a routed experts' projection, as one projection's (its gradients too). */
static tr_lora expert_lora(const tlayer *y, int p, int64_t e) {
    tr_lora l = y->lora[p];
    size_t na = (size_t)(y->k[p] * l.r), nb = (size_t)(l.r * y->n[p]);
    l.a += e * na, l.ga += e * na, l.b += e * nb, l.gb += e * nb;
    return l;
}

enum { PART_DENSE, PART_ADAPTER, PART_OPTIMIZER, PART_ACTIVATIONS, PART_BUFFERS };
enum { OPT_ADAM, OPT_ADAMW, OPT_SGD, OPT_MUON, OPT_ADAFACTOR };
static const char *const part_name[] = {"dense_weight_copies", "adapter_and_gradients", "optimizer_state",
                                        "saved_activations", "step_buffers"};

/* What an allocation of n bytes adds to the resident set once written: glibc serves large
 * blocks (from its mmap threshold, 128 KiB at first) as whole pages plus a header page,
 * small ones from the heap with a 16-byte header. */
static size_t resident_of(size_t n) {
    return n >= 128 * 1024 ? (n + 4096 + 4095) / 4096 * 4096 : n + 16;
}
static float dry_block[16]; /* what a dry falloc returns: never written through */

static float *falloc(trainer *t, size_t n) {
    if (t->dry) {
        t->dry_bytes[t->part] += resident_of((n ? n : 1) * sizeof(float));
        return dry_block;
    }
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) return NULL;
    float **g = realloc(t->owned, sizeof(float *) * (size_t)(t->n_owned + 1));
    if (!g) return free(p), NULL;
    t->owned = g;
    t->owned[t->n_owned++] = p;
    return p;
}

/* A frozen weight as float32 rows: used in place when it is float32 already. */
static const float *dense(trainer *t, const op_weight *w) {
    if (w->dtype == DT_F32) return t->dry ? dry_block : w->data;
    t->part = PART_DENSE;
    float *p = falloc(t, (size_t)(w->n * w->k));
    if (p && !t->dry)
        for (int64_t i = 0; i < w->n; i++) op_weight_dequant_row(w, i, p + i * w->k);
    return p;
}

/* mlp: which MLPs' and mixers' activations (ACT_*): the others' would never be written (so
 * never resident, and fit must not count them) */
enum { ACT_DENSE = 1, ACT_MOE = 2, ACT_ATTN = 4, ACT_GDN = 8 };
/* Gemma 4's experts sit beside a dense MLP (beside); Qwen's replace it */
static int act_kinds(const tlayer *y) {
    return (y->moe ? ACT_MOE : 0) | (!y->moe || y->beside ? ACT_DENSE : 0) | (y->linear ? ACT_GDN : ACT_ATTN);
}
static int alloc_acts(trainer *t, acts *s, int mlp) {
    int64_t T = t->T, qd = (int64_t)t->Hq * t->hd, kd = (int64_t)t->Hkv * t->hd;
    if ((mlp & ACT_GDN)) {
        int64_t C = t->Cc, VD = (int64_t)t->Hv * t->Dv, KD = (int64_t)t->Hk * t->Dk, Hv = t->Hv;
        int64_t ck = (T + GDN_CK - 1) / GDN_CK * Hv * t->Dv * t->Dk;
        float **c3[] = {&s->graw, &s->gpre, &s->gcv};
        float **v4[] = {&s->gz, &s->gy, &s->gyn, &s->ggo};
        float **h3[] = {&s->gb, &s->ga, &s->gbeta, &s->gg, &s->gry};
        for (size_t i = 0; i < 3; i++)
            if (!(*c3[i] = falloc(t, (size_t)(T * C)))) return -1;
        for (size_t i = 0; i < 4; i++)
            if (!(*v4[i] = falloc(t, (size_t)(T * VD)))) return -1;
        for (size_t i = 0; i < 5; i++)
            if (!(*h3[i] = falloc(t, (size_t)(T * Hv)))) return -1;
        if (!(s->gqn = falloc(t, (size_t)(T * KD))) || !(s->gkn = falloc(t, (size_t)(T * KD))) ||
            !(s->grq = falloc(t, (size_t)(T * t->Hk))) || !(s->grk = falloc(t, (size_t)(T * t->Hk))) ||
            !(s->gck = falloc(t, (size_t)ck)))
            return -1;
    }
    if (t->gated && (mlp & ACT_ATTN) &&
        (!(s->qs = falloc(t, (size_t)(T * qd))) || !(s->qgate = falloc(t, (size_t)(T * qd))) ||
         !(s->ag = falloc(t, (size_t)(T * qd)))))
        return -1;
    float **f[] = {&s->x_in, &s->h1, &s->x_mid, &s->h2};
    for (size_t i = 0; i < 4; i++)
        if (!(*f[i] = falloc(t, (size_t)(T * t->D)))) return -1;
    float **r[] = {&s->rstd1, &s->rstd2};
    for (size_t i = 0; i < 2; i++)
        if (!(*r[i] = falloc(t, (size_t)T))) return -1;
    if ((mlp & ACT_ATTN) &&
        (!(s->ql = falloc(t, (size_t)(T * qd * (1 + t->gated)))) || !(s->qr = falloc(t, (size_t)(T * qd))) ||
         !(s->a = falloc(t, (size_t)(T * qd))) || !(s->kl = falloc(t, (size_t)(T * kd))) ||
         !(s->kr = falloc(t, (size_t)(T * kd))) || !(s->v = falloc(t, (size_t)(T * kd))) ||
         !(s->rstdq = falloc(t, (size_t)(T * t->Hq))) || !(s->rstdk = falloc(t, (size_t)(T * t->Hkv))) ||
         !(s->p = falloc(t, (size_t)(t->Hq * T * T)))))
        return -1;
    if ((mlp & ACT_DENSE) && (!(s->g = falloc(t, (size_t)(T * t->F))) || !(s->u = falloc(t, (size_t)(T * t->F))) ||
                              !(s->mm = falloc(t, (size_t)(T * t->F)))))
        return -1;
    for (int p = 0; p < N_P; p++)
        if (!(s->xa[p] = falloc(t, (size_t)(T * t->r)))) return -1;
    if (t->post_norms && (!(s->ro = falloc(t, (size_t)(T * t->D))) || !(s->rd = falloc(t, (size_t)(T * t->D))) ||
                          !(s->rstd_pa = falloc(t, (size_t)T)) || !(s->rstd_pf = falloc(t, (size_t)T))))
        return -1;
    if (t->m->cfg.family == FAMILY_GEMMA4 &&
        (!(s->vl = falloc(t, (size_t)(T * kd))) || !(s->rstdv = falloc(t, (size_t)(T * t->Hkv)))))
        return -1;
    for (int j = 0; (mlp & ACT_MOE) && j < 3; j++)
        if (!(s->xe[j] = falloc(t, (size_t)(T * t->K * t->r)))) return -1;
    if ((mlp & ACT_MOE) &&
        (!(s->mprob = falloc(t, (size_t)(T * t->E))) || !(s->mw = falloc(t, (size_t)(T * t->K))) ||
         !(s->msel = (int32_t *)falloc(t, (size_t)(T * t->K))) || !(s->mg = falloc(t, (size_t)(T * t->K * t->Fm))) ||
         !(s->mu = falloc(t, (size_t)(T * t->K * t->Fm))) || !(s->mh = falloc(t, (size_t)(T * t->K * t->Fm))) ||
         !(s->mo = falloc(t, (size_t)(T * t->K * t->D))) ||
         (t->gelu && (!(s->rx = falloc(t, (size_t)(T * t->D))) || !(s->h2b = falloc(t, (size_t)(T * t->D))) ||
                      !(s->rd1 = falloc(t, (size_t)(T * t->D))) || !(s->eo = falloc(t, (size_t)(T * t->D))) ||
                      !(s->rstd_r = falloc(t, (size_t)T)) || !(s->rstd_b = falloc(t, (size_t)T)) ||
                      !(s->rstd_p1 = falloc(t, (size_t)T)) || !(s->rstd_p2 = falloc(t, (size_t)T)))) ||
         (t->Fs && (!(s->shg = falloc(t, (size_t)(T * t->Fs))) || !(s->shu = falloc(t, (size_t)(T * t->Fs))) ||
                    !(s->sho = falloc(t, (size_t)(T * t->D))) || !(s->shz = falloc(t, (size_t)T))))))
        return -1;
    if (t->P && (!(s->x_pl = falloc(t, (size_t)(T * t->D))) || !(s->pg = falloc(t, (size_t)(T * t->P))) ||
                 !(s->pm = falloc(t, (size_t)(T * t->P))) || !(s->pp = falloc(t, (size_t)(T * t->D))) ||
                 !(s->rstd_pl = falloc(t, (size_t)T))))
        return -1;
    return 0;
}

/* The Gated DeltaNet backward's buffers (T rows at most) and every value head's work area. */
static int alloc_gdn_scratch(trainer *t, int64_t T) {
    int64_t C = t->Cc, VD = (int64_t)t->Hv * t->Dv, Hv = t->Hv;
    float **v[] = {&t->gd_out, &t->gd_z, &t->gd_y, &t->gd_v};
    for (size_t i = 0; i < 4; i++)
        if (!(*v[i] = falloc(t, (size_t)(T * VD)))) return -1;
    float **h[] = {&t->gd_g, &t->gd_beta, &t->gd_a, &t->gd_b};
    for (size_t i = 0; i < 4; i++)
        if (!(*h[i] = falloc(t, (size_t)(T * Hv)))) return -1;
    return !(t->gd_q = falloc(t, (size_t)(T * Hv * t->Dk))) || !(t->gd_k = falloc(t, (size_t)(T * Hv * t->Dk))) ||
                   !(t->gd_qn = falloc(t, (size_t)(2 * t->Hk * t->Dk))) || !(t->gd_c = falloc(t, (size_t)(T * C))) ||
                   !(t->gd_qkv = falloc(t, (size_t)(T * C))) || !(t->gdn_work = falloc(t, (size_t)(Hv * t->gdn_per)))
               ? -1
               : 0;
}

/* A norm's weight as the trainer applies it: Gemma's (1 + w) form (norm_shift) as a copy
 * holding 1 + w, else the model's own (NULL stays NULL). Dry (a plan: no weights, every
 * pointer NULL), each of a Gemma's norms counts as such a copy. */
static const float *norm_weight(trainer *t, const float *w, int64_t n, int *bad) {
    float shift = t->m->cfg.norm_shift;
    if ((!w && !t->dry) || shift == 0) return w;
    t->part = PART_DENSE;
    float *p = falloc(t, (size_t)n);
    if (!p) return *bad = 1, NULL;
    for (int64_t i = 0; !t->dry && i < n; i++) p[i] = shift + w[i];
    return p;
}

static void free_trainer(trainer *t) {
    for (int i = 0; i < t->n_owned; i++) free(t->owned[i]);
    free(t->owned);
    free(t->layers);
    free(t->targets);
    tp_destroy(t->tp);
    tr_gemm_release();
    model_free(t->m);
    hearth_model_close(t->hm);
}

/* splitmix64 for the initial LoRA A (mlx-lm's own draws come from MLX's generator) */
static double uniform01(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

/* Loads the weights of the open model t->hm and sizes everything for sequences of max_T. */
static hearth_status open_trainer(trainer *t, const char *name, const hearth_train_options *o, int max_T,
                                  hearth_error *err) {
    hearth_status st;
    if ((st = (t->dry ? model_plan : model_load)(t->hm, 0, &t->m, err))) return st;
    const model_config *c = &t->m->cfg;
    int gemma4 = c->family == FAMILY_GEMMA4, gemma = c->family == FAMILY_GEMMA3 || gemma4;
    int hybrid = c->family == FAMILY_QWEN3_5;
    if (hybrid) {
        t->gated = c->attn_gate, t->Hk = c->gdn_k_heads, t->Hv = c->gdn_v_heads, t->Dk = c->gdn_k_dim;
        t->Dv = c->gdn_v_dim, t->Kc = c->gdn_conv, t->gdn_tiled = c->gdn_v_tiled;
        t->Cc = 2 * t->Hk * t->Dk + t->Hv * t->Dv;
        t->gdn_per = (int64_t)(GDN_CK + 2) * t->Dv * t->Dk + t->Dk;
    }
    if (c->family != FAMILY_LLAMA && c->family != FAMILY_QWEN3 && c->family != FAMILY_MINICPM && !gemma &&
        c->family != FAMILY_QWEN3_MOE && !hybrid)
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: hearth train handles llama-, qwen3-, qwen3_moe-, qwen3_5-, qwen3_5_moe-, minicpm-, gemma3- "
                       "and gemma4-family models so far (this is %s)",
                       name, t->hm->sum.architecture);
    if (c->family == FAMILY_QWEN3_MOE || ((hybrid || gemma4) && c->n_experts))
        t->E = c->n_experts, t->K = c->top_k_experts, t->Fm = c->moe_ffn, t->norm_topk = c->norm_topk;
    t->Fs = hybrid ? c->shared_ffn : 0;
    if ((!gemma && !hybrid && c->norm_shift != 0) || (!gemma && c->sliding_window) || (c->softcap != 0 && !gemma4) ||
        (c->family != FAMILY_MINICPM && !gemma && c->embed_scale != 1) ||
        (c->family != FAMILY_MINICPM && (c->residual_scale != 1 || c->logits_div != 1)))
        return err_set(err, HEARTH_ERR_UNSUPPORTED,
                       "%s: this model's variant (scaled embeddings, residuals or "
                       "logits, sliding windows, a logit softcap) is not handled by hearth train yet",
                       name);
    t->gelu = t->post_norms = gemma;
    t->softcap = gemma4 ? c->softcap : 0, t->P = gemma4 ? c->per_layer_dim : 0;
    t->L = c->n_layers, t->D = c->hidden, t->Hq = c->n_heads, t->Hkv = c->n_kv_heads, t->hd = c->head_dim;
    t->F = c->ffn, t->V = c->vocab, t->eps = c->norm_eps, t->attn_scale = c->attn_scale;
    t->emb_scale = c->embed_scale, t->res_scale = c->residual_scale, t->logit_div = c->logits_div;
    t->adjacent = c->rope_adjacent;
    int bad_norm = 0;
    t->final_norm = norm_weight(t, t->m->final_norm, t->D, &bad_norm);
    t->r = o->lora_rank, t->scale = (float)o->lora_scale, t->T = max_T;
    if (o->num_layers > t->L)
        return err_set(err, HEARTH_ERR_INVALID, "--num-layers %d: the model has only %d layers", o->num_layers, t->L);
    t->first_lora = o->num_layers < 0 ? 0 : t->L - o->num_layers;
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    t->threads = threads > 0 ? threads : 1;
    if (!t->dry && (st = tp_create(t->threads, &t->tp, err))) return st;
    if (!(t->layers = calloc((size_t)t->L, sizeof *t->layers))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (!(t->lm_head = dense(t, &t->m->lm_head))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    if (t->P && !(t->pl_proj = dense(t, &t->m->per_layer_proj))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    uint64_t rng = o->seed * 0x2545f4914f6cdd1dull + 1;
    t->dora = o->dora;
    if (t->dora && t->r > 64) return err_set(err, HEARTH_ERR_UNSUPPORTED, "DoRA training takes a rank of at most 64");
    for (int l = 0; l < t->L; l++) {
        const layer_weights *lw = &t->m->layers[l];
        tlayer *y = &t->layers[l];
        if ((lw->linear && !hybrid) || (lw->sliding && !gemma))
            return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: layer %d is not a layer training handles", name, l);
        if ((y->linear = lw->linear)) { /* a Gated DeltaNet layer: frozen, the gradient goes through */
            if (!(y->gqkv = dense(t, &lw->gdn_qkv)) || !(y->gz = dense(t, &lw->gdn_z)) ||
                !(y->gbw = dense(t, &lw->gdn_b)) || !(y->gaw = dense(t, &lw->gdn_a)) ||
                !(y->gout = dense(t, &lw->gdn_out)))
                return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            y->conv = lw->gdn_conv, y->A_log = lw->gdn_A_log, y->dt_bias = lw->gdn_dt_bias, y->gnorm = lw->gdn_norm;
        }
        if ((y->moe = lw->moe)) { /* the experts stay frozen: LoRA on the attention projections */
            y->fused = !lw->experts_up.n;
            if (gemma4) { /* (the loader made router_norm the scale times hidden^-1/2, as mlx-lm computes it) */
                y->beside = 1, y->router_w = lw->router_norm, y->expert_scale = lw->expert_scale;
                y->post_ffn_norm_1 = lw->post_ffn_norm_1, y->ffn_norm_2 = lw->ffn_norm_2;
                y->post_ffn_norm_2 = lw->post_ffn_norm_2;
            }
            y->eg = &lw->experts_gate, y->eu = y->fused ? NULL : &lw->experts_up, y->ed = &lw->experts_down;
            t->eq |= y->eg->dtype != DT_F32 || (y->eu && y->eu->dtype != DT_F32) || y->ed->dtype != DT_F32;
            if (!(y->router = dense(t, &lw->router)) ||
                (t->Fs && (!(y->sg = dense(t, &lw->shared_gate)) || !(y->su = dense(t, &lw->shared_up)) ||
                           !(y->sd = dense(t, &lw->shared_down)) || !(y->sr = dense(t, &lw->shared_router)))))
                return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        }
        const op_weight *ws[P_GQKV] = {&lw->q,  &lw->k,    &lw->v,       &lw->o,      &lw->gate,
                                       &lw->up, &lw->down, &lw->pl_gate, &lw->pl_proj};
        for (int p = 0; p < N_P; p++) y->ne[p] = 1;
        for (int p = 0; p < P_GQKV; p++) {
            if (!ws[p]->n) continue; /* a projection this layer does not have */
            if (!(y->w[p] = dense(t, ws[p]))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
            y->n[p] = ws[p]->n, y->k[p] = ws[p]->k;
        }
        /* a Gated DeltaNet layer's projections (dense copies above), but on a GGUF base, whose
         * value heads llama.cpp's converter reorders (its adapters would not serve) */
        if (y->linear && !c->gdn_v_tiled) {
            const float *gw[] = {y->gqkv, y->gz, y->gbw, y->gaw, y->gout};
            const op_weight *go[] = {&lw->gdn_qkv, &lw->gdn_z, &lw->gdn_b, &lw->gdn_a, &lw->gdn_out};
            for (int p = P_GQKV; p <= P_GOUT; p++)
                y->w[p] = gw[p - P_GQKV], y->n[p] = go[p - P_GQKV]->n, y->k[p] = go[p - P_GQKV]->k;
        }
        if (y->moe) { /* the router, the shared expert (dense copies above) and the routed experts */
            const float *dw[] = {y->router, y->sg, y->su, y->sd, y->sr};
            const op_weight *ow[] = {&lw->router, &lw->shared_gate, &lw->shared_up, &lw->shared_down,
                                     &lw->shared_router};
            for (int p = P_RT; p <= P_SR; p++)
                if (dw[p - P_RT]) y->w[p] = dw[p - P_RT], y->n[p] = ow[p - P_RT]->n, y->k[p] = ow[p - P_RT]->k;
            for (int p = P_EG; p <= P_ED; p++) {
                y->ne[p] = t->E;
                y->n[p] = p == P_ED ? t->D : t->Fm, y->k[p] = p == P_ED ? t->Fm : t->D;
            }
        }
        y->hd = gemma4 ? lw->head_dim : t->hd, y->Hkv = gemma4 ? lw->n_kv_heads : t->Hkv;
        y->F = gemma4 ? lw->ffn : t->F;
        y->rd = c->rope_dims > 0 && c->rope_dims < y->hd ? c->rope_dims : y->hd;
        y->v_norm = gemma4, y->k_eq_v = gemma4 && !lw->shares_kv && !lw->v.n;
        y->layer_scalar = gemma4 && lw->layer_scalar ? lw->layer_scalar[0] : 1.0f;
        y->pl_norm = lw->pl_norm;
        y->src = -1;
        if (gemma4 && lw->shares_kv) { /* the layer below that stores the KV this one reads */
            for (int j = 0; j < l && y->src < 0; j++)
                if (!t->m->layers[j].shares_kv && t->m->layers[j].kv_layer == lw->kv_layer) y->src = j;
            if (y->src < 0)
                return err_set(err, HEARTH_ERR_INVALID, "%s: layer %d reads a KV no layer below it stores", name, l);
            t->kv_shared = 1;
        }
        if ((!y->linear && (!y->w[P_Q] || !y->w[P_O] || (y->src < 0 && !y->w[P_K]))) ||
            (!y->moe && (!y->w[P_GATE] || !y->w[P_UP] || !y->w[P_DOWN])) || (t->P && (!y->w[P_PLG] || !y->w[P_PLP])))
            return err_set(err, HEARTH_ERR_INVALID, "%s: layer %d lacks a projection training needs", name, l);
        y->bias[0] = lw->q_bias, y->bias[1] = lw->k_bias, y->bias[2] = lw->v_bias;
        y->attn_norm = norm_weight(t, lw->attn_norm, t->D, &bad_norm);
        y->ffn_norm = norm_weight(t, lw->ffn_norm, t->D, &bad_norm);
        y->post_attn_norm = norm_weight(t, lw->post_attn_norm, t->D, &bad_norm);
        y->post_ffn_norm = norm_weight(t, lw->post_ffn_norm, t->D, &bad_norm);
        y->q_norm = norm_weight(t, lw->q_norm, y->hd, &bad_norm);
        y->k_norm = norm_weight(t, lw->k_norm, y->hd, &bad_norm);
        if (bad_norm) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        if (t->post_norms && !t->dry && (!y->post_attn_norm || !y->post_ffn_norm))
            return err_set(err, HEARTH_ERR_INVALID, "%s: layer %d has no post-attention or post-feedforward norm", name,
                           l);
        y->window = lw->sliding ? c->sliding_window : 0;
        y->inv_freq = lw->sliding ? c->inv_freq_local : c->inv_freq_global;
        y->has_lora = l >= t->first_lora;
        if (y->has_lora) {
            t->part = PART_ADAPTER;
            for (int p = 0; p < N_P; p++) {
                /* every projection the layer has, Gemma 4's per-layer input gate and projection
                 * and a mixture of experts' router, experts and shared expert included:
                 * mlx_lm.lora's default keys (the experts not with DoRA, which mlx-lm has not
                 * for them either) */
                if (!y->n[p] || (is_expert(p) && t->dora) || !keyed(o, pname(t, p))) continue;
                tr_lora *lo = &y->lora[p];
                int64_t K = y->k[p], N = y->n[p], E = y->ne[p];
                *lo = (tr_lora){.r = t->r,
                                .scale = t->scale,
                                .a = falloc(t, (size_t)(E * K * t->r)),
                                .b = falloc(t, (size_t)(E * t->r * N)),
                                .ga = falloc(t, (size_t)(E * K * t->r)),
                                .gb = falloc(t, (size_t)(E * t->r * N))};
                if (!lo->a || !lo->b || !lo->ga || !lo->gb) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                double bound = 1.0 / sqrt((double)K); /* mlx-lm: A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0 */
                for (int64_t i = 0; !t->dry && i < E * K * t->r; i++)
                    lo->a[i] = (float)((2 * uniform01(&rng) - 1) * bound);
                t->n_params += (size_t)(E * (K * t->r + t->r * N));
                t->moe_lora |= p >= P_RT;
                if (t->dora) { /* m starts at the base's row norms (mlx-lm's DoRALinear.set_linear) */
                    if (!(lo->m = falloc(t, (size_t)N)) || !(lo->gm = falloc(t, (size_t)N)) ||
                        !(lo->denom = falloc(t, (size_t)N)))
                        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                    for (int64_t n = 0; !t->dry && n < N; n++) {
                        float acc = 0;
                        for (int64_t k = 0; k < K; k++) acc += y->w[p][n * K + k] * y->w[p][n * K + k];
                        lo->m[n] = sqrtf(acc);
                    }
                    t->n_params += (size_t)N;
                    if (N > t->dora_n) t->dora_n = N;
                }
                size_t big = (size_t)((K > N ? K : N) * t->r);
                if (big > t->max_tensor) t->max_tensor = big;
            }
            t->part = PART_ACTIVATIONS;
            /* dry: each slot (a pair's chosen and rejected sequences) is resident only as
             * far as the longest of its sequences is long */
            int T = t->T, T1 = t->dry && t->T1 > 0 && t->T1 < T ? t->T1 : T;
            int T2 = t->dry && t->T2 > 0 && t->T2 < T ? t->T2 : T, bad;
            if (t->ckpt) { /* only the layer's input: the backward recomputes the rest into shared */
                bad = !(y->ck = falloc(t, (size_t)T1 * (size_t)t->D)) ||
                      (t->pref && !(y->ck2 = falloc(t, (size_t)T2 * (size_t)t->D)));
            } else {
                int mlp = act_kinds(y);
                t->T = T1, bad = alloc_acts(t, &y->s, mlp);
                t->T = T2, bad = bad || (t->pref && alloc_acts(t, &y->s2, mlp)), t->T = T;
            }
            if (bad) return err_set(err, HEARTH_ERR_NOMEM, "out of memory for activations");
        }
    }
    if (t->n_params == 0 && o->n_lora_keys) {
        char list[512] = "";
        for (int p = 0, n = 0; p < N_P; p++) { /* what this model's trained layers have */
            int has = 0;
            for (int l = t->first_lora; l < t->L; l++) has |= t->layers[l].n[p] > 0;
            if (has && n < 24)
                n += snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", n ? ", " : "", pname(t, p)) > 0;
        }
        return err_set(err, HEARTH_ERR_INVALID,
                       "lora_parameters.keys: no module of %s's trained layers is listed (its modules: %s)", name,
                       list);
    }
    t->part = PART_ACTIVATIONS;
    for (int l = 0; l < t->L; l++) /* the keys and values shared-KV layers read, kept (each slot) */
        if (t->layers[l].src >= 0) {
            tlayer *y = &t->layers[t->layers[l].src];
            size_t n = (size_t)max_T * (size_t)(y->Hkv * y->hd);
            if (y->kk) continue;
            if (!(y->kk = falloc(t, n)) || !(y->kv = falloc(t, n)) ||
                (t->pref && (!(y->kk2 = falloc(t, n)) || !(y->kv2 = falloc(t, n)))) || !(y->dks = falloc(t, n)) ||
                !(y->dvs = falloc(t, n)))
                return err_set(err, HEARTH_ERR_NOMEM, "out of memory for activations");
        }
    int kinds = 0; /* the MLPs the layers that run in shared have */
    for (int l = 0; l < t->L; l++)
        if (l < t->first_lora || t->ckpt) kinds |= act_kinds(&t->layers[l]);
    if ((t->first_lora > 0 || t->ckpt) && alloc_acts(t, &t->shared, kinds))
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory for activations");
    t->part = PART_BUFFERS;
    int64_t T = max_T, D = t->D, qd = (int64_t)t->Hq * t->hd, kd = (int64_t)t->Hkv * t->hd, F = t->F;
    int64_t wide = F > qd ? F : qd;
    wide = wide > D ? wide : D;
    if (!(t->x = falloc(t, (size_t)(T * D))) || !(t->tmp = falloc(t, (size_t)(T * wide))) ||
        !(t->xf = falloc(t, (size_t)(T * D))) || !(t->hf = falloc(t, (size_t)(T * D))) ||
        !(t->rstdf = falloc(t, (size_t)T)) || !(t->dx = falloc(t, (size_t)(T * D))) ||
        !(t->dtmp = falloc(t, (size_t)(T * D))) || !(t->dmm = falloc(t, (size_t)(T * F))) ||
        !(t->dg = falloc(t, (size_t)(T * (F > t->P ? F : t->P)))) ||
        !(t->du = falloc(t, (size_t)(T * (F > t->P ? F : t->P)))) || !(t->dq = falloc(t, (size_t)(T * qd))) ||
        !(t->dk = falloc(t, (size_t)(T * kd))) || !(t->dv = falloc(t, (size_t)(T * kd))) ||
        !(t->dql = falloc(t, (size_t)(T * qd))) || !(t->dkl = falloc(t, (size_t)(T * kd))) ||
        !(t->da = falloc(t, (size_t)(T * qd))) ||
        (t->m->cfg.family == FAMILY_GEMMA4 && !(t->dvl = falloc(t, (size_t)(T * kd)))) ||
        (t->P && t->pref && !(t->pl_in2 = falloc(t, (size_t)(T * t->L * t->P)))) ||
        (t->gated && (!(t->dqg = falloc(t, (size_t)(T * qd))) || !(t->dqf = falloc(t, (size_t)(T * qd * 2))))) ||
        (t->Hv && alloc_gdn_scratch(t, T)) ||
        (t->eq && (!(t->ewg = falloc(t, (size_t)(t->Fm * D))) || !(t->ewu = falloc(t, (size_t)(t->Fm * D))) ||
                   !(t->ewd = falloc(t, (size_t)(t->Fm * D))))) ||
        (t->E && (!(t->mx = falloc(t, (size_t)(T * D))) || !(t->mdx = falloc(t, (size_t)(T * D))) ||
                  !(t->mdo = falloc(t, (size_t)(T * D))) || !(t->mga = falloc(t, (size_t)(T * t->Fm))) ||
                  !(t->mua = falloc(t, (size_t)(T * t->Fm))) || !(t->mdh = falloc(t, (size_t)(T * t->Fm))) ||
                  !(t->mdg = falloc(t, (size_t)(T * t->Fm))) || !(t->mdu = falloc(t, (size_t)(T * t->Fm))) ||
                  !(t->mdl = falloc(t, (size_t)(T * t->E))) || !(t->mrow = (int32_t *)falloc(t, (size_t)T)) ||
                  !(t->mxa = falloc(t, (size_t)(T * t->r))) || !(t->mhx = falloc(t, (size_t)(T * t->Fm))))) ||
        (t->Fs && !(t->sdx = falloc(t, (size_t)(T * t->Fs)))) ||
        (t->E && t->gelu &&
         (!(t->g4b = falloc(t, (size_t)(T * D))) || !(t->g4c = falloc(t, (size_t)(T * D))) ||
          !(t->g4x = falloc(t, (size_t)(T * D))) || !(t->g4r = falloc(t, (size_t)(T * D))))) ||
        (t->Fs && (!(t->sdh = falloc(t, (size_t)(T * t->Fs))) || !(t->sdg = falloc(t, (size_t)(T * t->Fs))) ||
                   !(t->sdu = falloc(t, (size_t)(T * t->Fs))) || !(t->sdo = falloc(t, (size_t)(T * D))))) ||
        (t->P &&
         (!(t->pl_in = falloc(t, (size_t)(T * t->L * t->P))) || !(t->pl_tmp = falloc(t, (size_t)(T * t->L * t->P))) ||
          !(t->dpl = falloc(t, (size_t)(T * t->P))) || !(t->pl_row = falloc(t, (size_t)(t->L * t->P))))) ||
        !(t->dh = falloc(t, (size_t)(T * D))) || !(t->weight = falloc(t, (size_t)T)) ||
        !(t->ce = falloc(t, (size_t)T)) || (t->res_scale != 1 && !(t->dxs = falloc(t, (size_t)(T * D)))) ||
        (t->pref && (!(t->xf2 = falloc(t, (size_t)(T * D))) || !(t->hf2 = falloc(t, (size_t)(T * D))) ||
                     !(t->rstdf2 = falloc(t, (size_t)T)) || !(t->dh2 = falloc(t, (size_t)(T * D))))) ||
        (t->dpo && t->first_lora > 0 && !t->kv_shared && /* shared KV: the layers below run each pass */
         (!(t->prefix = falloc(t, (size_t)(T * D))) || !(t->prefix2 = falloc(t, (size_t)(T * D))))) ||
        !(t->lin_scratch = falloc(t, (size_t)(T * t->r))) ||
        (t->dora && !(t->dora_work = falloc(t, (size_t)(T * t->dora_n)))) ||
        !(t->attn_scratch = falloc(t, (size_t)(t->Hq * T * T))) ||
        /* a chunk holds at most T rows: dry, what of the scratch is ever written */
        !(t->xent_scratch = falloc(t, (size_t)(t->dry && T < TR_XENT_ROWS ? T : TR_XENT_ROWS) *
                                          (size_t)TR_XENT_ROW_FLOATS(t->V, D))) ||
        (t->part = PART_OPTIMIZER,
         ((t->opt != OPT_SGD && (!(t->adam_m = falloc(t, t->n_params)) || !(t->adam_v = falloc(t, t->n_params)))) ||
          ((t->opt == OPT_MUON || t->opt == OPT_ADAFACTOR) &&
           !(t->opt_work = falloc(t, 2 * t->max_tensor + 2 * (size_t)t->r * (size_t)t->r))))))
        return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int l = t->first_lora; t->dora && l < t->L; l++)
        for (int p = 0; p < N_P; p++) t->layers[l].lora[p].work = t->dora_work;
    if (t->dry) t->dry_bytes[PART_BUFFERS] += resident_of((size_t)T * sizeof(int32_t));
    else if (!(t->targets = calloc((size_t)T, sizeof(int32_t)))) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    return HEARTH_OK;
}

/* The decoder layers' module path in each adapter format: mlx-lm's model (Qwen3.5's wraps
 * its language model) and PEFT's (transformers' Qwen3.5 is a conditional-generation model
 * whose text layers sit under model.language_model). */
static const char *pname(const trainer *t, int p) {
    static const char *const gemma4[] = {"router.proj", "experts.switch_glu.gate_proj", "experts.switch_glu.up_proj",
                                         "experts.switch_glu.down_proj"};
    if (t->m->cfg.family == FAMILY_GEMMA4 && (p == P_RT || is_expert(p))) return gemma4[p == P_RT ? 0 : p - P_EG + 1];
    return proj_name[p];
}

/* Whether lora_parameters.keys names module path (none given: every module is). */
static int keyed(const hearth_train_options *o, const char *path) {
    for (int i = 0; i < o->n_lora_keys; i++)
        if (!strcmp(o->lora_keys[i], path)) return 1;
    return o->n_lora_keys == 0;
}

static const char *mlx_prefix(const trainer *t) {
    return t->m->cfg.family == FAMILY_QWEN3_5 ? "language_model.model." : "model.";
}
static const char *peft_prefix(const trainer *t) {
    return t->m->cfg.family == FAMILY_QWEN3_5 ? "base_model.model.model.language_model." : "base_model.model.model.";
}

static void lora_tensor_name(const trainer *t, char *buf, size_t cap, int layer, int p, int b) {
    snprintf(buf, cap, "%slayers.%d.%s.lora_%c", mlx_prefix(t), layer, pname(t, p), b ? 'b' : 'a');
}

/* GGUF llama q/k rows are in adjacent-pair RoPE order: output (h, i, j) of [heads, half, 2]
 * is HF's (h, j, i) of [heads, 2, half]. B's columns follow the base's rows, so adapter files
 * (HF order) are permuted on the way in and out. */
static void permute_b(const float *src, float *dst, int r, int64_t N, int heads, int to_hf) {
    int64_t half = N / heads / 2;
    for (int q = 0; q < r; q++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < half; i++)
                for (int j = 0; j < 2; j++) {
                    int64_t g = (h * half + i) * 2 + j, f = (h * 2 + j) * half + i;
                    dst[q * N + (to_hf ? f : g)] = src[q * N + (to_hf ? g : f)];
                }
}

static int permuted(const trainer *t, int p) { return t->adjacent && (p == P_Q || p == P_K); }
static int heads_of(const trainer *t, int p) { return p == P_Q ? t->Hq : t->Hkv; }

/* --resume-adapter-file: every tensor must be a LoRA pair of a trained layer, of its shape */
static hearth_status load_adapter_weights(trainer *t, const char *path, hearth_error *err) {
    st_file f;
    hearth_status st = st_open(path, &f, err);
    if (st) return st;
    for (size_t i = 0; !st && i < f.n_tensors; i++) {
        const tensor_info *ti = &f.tensors[i];
        float *dst = NULL;
        int64_t rows = 0, cols = 0, ne = 1;
        int perm_heads = 0;
        int vec = 0; /* DoRA's m [N] */
        for (int l = t->first_lora; l < t->L && !dst; l++)
            for (int p = 0; p < N_P && !dst; p++)
                for (int b = 0; b < (t->dora ? 3 : 2) && !dst && trained(&t->layers[l], p); b++) {
                    char nm[128];
                    if (b == 2)
                        snprintf(nm, sizeof nm, "%slayers.%d.%s.m", mlx_prefix(t), l, pname(t, p));
                    else
                        lora_tensor_name(t, nm, sizeof nm, l, p, b);
                    if (!strcmp(nm, ti->name)) {
                        tlayer *y = &t->layers[l];
                        dst = b == 2 ? y->lora[p].m : b ? y->lora[p].b : y->lora[p].a;
                        rows = b == 2 ? 1 : b ? t->r : y->k[p], cols = b ? y->n[p] : t->r, ne = y->ne[p];
                        perm_heads = b && permuted(t, p) ? heads_of(t, p) : 0;
                        vec = b == 2;
                    }
                }
        if (!dst)
            st = err_set(err, HEARTH_ERR_INVALID,
                         "%s: tensor '%s' is not a %s tensor of a trained layer (rank %d, "
                         "layers %d..%d)",
                         path, ti->name, t->dora ? "DoRA" : "LoRA", t->r, t->first_lora, t->L - 1);
        else if (vec && (ti->dtype != DT_F32 || ti->ndim != 1 || ti->shape[0] != cols))
            st = err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' must be float32 [%lld]", path, ti->name,
                         (long long)cols);
        else if (ne > 1 && (ti->dtype != DT_F32 || ti->ndim != 3 || ti->shape[0] != ne || ti->shape[1] != cols ||
                            ti->shape[2] != rows))
            st = err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' must be float32 [%lld, %lld, %lld]", path, ti->name,
                         (long long)ne, (long long)cols, (long long)rows);
        else if (ne > 1) /* mlx-lm's LoRASwitchLinear layout: each expert's block transposed */
            for (int64_t e = 0; e < ne; e++)
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++)
                        dst[(e * rows + r) * cols + c] = ((const float *)ti->data)[(e * cols + c) * rows + r];
        else if (!vec && (ti->dtype != DT_F32 || ti->ndim != 2 || ti->shape[0] != rows || ti->shape[1] != cols))
            st = err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s' must be float32 [%lld, %lld]", path, ti->name,
                         (long long)rows, (long long)cols);
        else if (perm_heads)
            permute_b((const float *)ti->data, dst, (int)rows, cols, perm_heads, 0);
        else memcpy(dst, ti->data, sizeof(float) * (size_t)(rows * cols));
    }
    st_close(&f);
    return st;
}

/* rows [row0, row0 + n) of w as float32: in place for a float32 weight, else dequantized into buf */
static const float *weight_rows(const op_weight *w, int64_t row0, int64_t n, float *buf) {
    if (w->dtype == DT_F32) return (const float *)w->data + row0 * w->k;
    for (int64_t i = 0; i < n; i++) op_weight_dequant_row(w, row0 + i, buf + i * w->k);
    return buf;
}

/* Expert e's gate, up [Fm, D] and down [D, Fm] rows among the stacked (or fused gate-then-up)
 * ones, as float32 (t->ewg, ewu, ewd when they are not float32): the experts stay in their
 * format, one is made float32 at a time */
static void expert_weights(trainer *t, const tlayer *y, int64_t e, const float **g, const float **u, const float **d) {
    int64_t Fm = t->Fm, D = t->D;
    *g = weight_rows(y->eg, e * (y->fused ? 2 : 1) * Fm, Fm, t->ewg);
    *u = y->fused ? weight_rows(y->eg, (2 * e + 1) * Fm, Fm, t->ewu) : weight_rows(y->eu, e * Fm, Fm, t->ewu);
    *d = weight_rows(y->ed, e * D, D, t->ewd);
}

/* The slots (token * K + pick) routed to expert e, into t->mrow; returns how many. */
static int expert_rows(const trainer *t, const acts *s, int64_t T, int e) {
    int n = 0;
    for (int64_t i = 0; i < T * t->K; i++)
        if (s->msel[i] == e) t->mrow[n++] = (int32_t)i;
    return n;
}

/* A Qwen3-MoE MLP on s->h2 into t->tmp, as mlx-lm's Qwen3MoeSparseMoeBlock: the router's
 * softmax over every expert, the top K (op_moe_route: the engine's rule), renormalised with
 * norm_topk_prob; each expert's SwiGLU on the rows routed to it (gathered: one product per
 * weight); each token's outputs weighted and summed in pick order. */
/* y[n, N] += expert e's LoRA update of its gathered rows x [n, K] (l NULL: none); xa [n, r]
 * gets scale * x A for the backward, scattered to the slots' rows of keep (t->mrow). */
static void expert_lora_fwd(trainer *t, const tlayer *y, const tr_lora *lo, int p, int e, int n, const float *x,
                            float *out, float *keep) {
    if (!lo || !lora_of(lo, p)) return;
    tr_lora l = expert_lora(y, p, e);
    int64_t r = t->r;
    /* the base product is in out already: add the update alone (linear of a zero weight) */
    tr_linear_fwd(t->tp, x, n, y->k[p], NULL, y->n[p], NULL, &l, t->mxa, out);
    for (int i = 0; i < n; i++) memcpy(keep + (int64_t)t->mrow[i] * r, t->mxa + i * r, sizeof(float) * (size_t)r);
}

static void moe_forward(trainer *t, const tlayer *y, acts *s, int64_t T, const float *xin, const float *rin, float *out,
                        const tr_lora *lo) {
    int64_t D = t->D, Fm = t->Fm, K = t->K, E = t->E;
#define MLORA(p) (lo ? lora_of(lo, p) : NULL)
    tr_linear_fwd(t->tp, rin, T, D, y->router, E, NULL, MLORA(P_RT), s->xa[P_RT], s->mprob);
    /* Gemma 4's rule (router_norm set): the top K by logit, their softmax times per_expert_scale */
    op_moe route = {.norm_topk = t->norm_topk, .router_norm = y->router_w, .expert_scale = y->expert_scale};
    for (int64_t i = 0; i < T; i++)
        op_moe_route(&route, s->mprob + i * E, (int)E, (int)K, s->msel + i * K, s->mw + i * K);
    for (int e = 0; e < E; e++) {
        int n = expert_rows(t, s, T, e);
        if (!n) continue;
        for (int r = 0; r < n; r++) memcpy(t->mx + r * D, xin + t->mrow[r] / K * D, sizeof(float) * (size_t)D);
        const float *wg, *wu, *wd;
        expert_weights(t, y, e, &wg, &wu, &wd);
        tr_matmul_nt(t->tp, t->mx, n, D, wg, Fm, t->mga, 0);
        tr_matmul_nt(t->tp, t->mx, n, D, wu, Fm, t->mua, 0);
        expert_lora_fwd(t, y, lo, P_EG, e, n, t->mx, t->mga, s->xe[0]);
        expert_lora_fwd(t, y, lo, P_EU, e, n, t->mx, t->mua, s->xe[1]);
        (t->gelu ? tr_gelu_mul_fwd : tr_silu_mul_fwd)(t->tp, t->mga, t->mua, n * Fm, t->mdh);
        tr_matmul_nt(t->tp, t->mdh, n, Fm, wd, D, t->mdo, 0);
        expert_lora_fwd(t, y, lo, P_ED, e, n, t->mdh, t->mdo, s->xe[2]);
        for (int r = 0; r < n; r++) {
            int64_t i = t->mrow[r];
            memcpy(s->mg + i * Fm, t->mga + r * Fm, sizeof(float) * (size_t)Fm);
            memcpy(s->mu + i * Fm, t->mua + r * Fm, sizeof(float) * (size_t)Fm);
            memcpy(s->mh + i * Fm, t->mdh + r * Fm, sizeof(float) * (size_t)Fm);
            memcpy(s->mo + i * D, t->mdo + r * D, sizeof(float) * (size_t)D);
        }
    }
    for (int64_t i = 0; i < T; i++)
        for (int64_t d = 0; d < D; d++) {
            float acc = 0;
            for (int64_t k = 0; k < K; k++) acc += s->mo[(i * K + k) * D + d] * s->mw[i * K + k];
            out[i * D + d] = acc;
        }
    if (!t->Fs) return;
    /* Qwen3.5-MoE: + sigmoid(shared_expert_gate . x) * shared_expert(x) */
    int64_t Fs = t->Fs;
    tr_linear_fwd(t->tp, xin, T, D, y->sg, Fs, NULL, MLORA(P_SG), s->xa[P_SG], s->shg);
    tr_linear_fwd(t->tp, xin, T, D, y->su, Fs, NULL, MLORA(P_SU), s->xa[P_SU], s->shu);
    tr_silu_mul_fwd(t->tp, s->shg, s->shu, T * Fs, t->sdh);
    tr_linear_fwd(t->tp, t->sdh, T, Fs, y->sd, D, NULL, MLORA(P_SD), s->xa[P_SD], s->sho);
    tr_linear_fwd(t->tp, xin, T, D, y->sr, 1, NULL, MLORA(P_SR), s->xa[P_SR], s->shz);
#undef MLORA
    for (int64_t i = 0; i < T; i++) {
        float g = 1.0f / (1.0f + expf(-s->shz[i]));
        for (int64_t d = 0; d < D; d++) out[i * D + d] += g * s->sho[i * D + d];
    }
}

/* Its backward from dy [T, D] (the block output's gradient): dxin gets each expert's input
 * gradient, scaled by the token's weight (and the shared expert's), drin the router's input's:
 * through the weights' renormalisation and the softmax (the picks themselves are constants).
 * Both are added to (they may be the same buffer). */
/* Expert e's LoRA backward on its gathered rows (t->mrow): x [n, k] its input, dy [n, N]
 * its output's gradient; the pair's gradients added to, and dx [n, k] (NULL: not wanted). */
static void expert_lora_bwd(trainer *t, const tlayer *y, int p, int e, int n, const float *x, const float *keep,
                            const float *dy, float *dx) {
    if (!trained(y, p)) return;
    tr_lora l = expert_lora(y, p, e);
    int64_t r = t->r;
    for (int i = 0; i < n; i++) memcpy(t->mxa + i * r, keep + (int64_t)t->mrow[i] * r, sizeof(float) * (size_t)r);
    tr_linear_bwd(t->tp, x, n, y->k[p], NULL, y->n[p], &l, t->mxa, dy, dx, t->lin_scratch);
}

static void moe_backward(trainer *t, const tlayer *y, const acts *s, int64_t T, const float *xin, const float *rin,
                         const float *dy, float *dxin, float *drin) {
    int64_t D = t->D, Fm = t->Fm, K = t->K, E = t->E;
    float *dh2 = dxin, *sc = t->lin_scratch;
    for (int e = 0; e < E; e++) {
        int n = expert_rows(t, s, T, e);
        if (!n) continue;
        int lora = trained(y, P_EG) || trained(y, P_EU) || trained(y, P_ED);
        for (int r = 0; r < n; r++) {
            int64_t i = t->mrow[r];
            for (int64_t d = 0; d < D; d++) t->mdo[r * D + d] = dy[i / K * D + d] * s->mw[i];
            memcpy(t->mga + r * Fm, s->mg + i * Fm, sizeof(float) * (size_t)Fm);
            memcpy(t->mua + r * Fm, s->mu + i * Fm, sizeof(float) * (size_t)Fm);
            if (lora) { /* the pairs' inputs: the expert's rows of x and its gated products */
                memcpy(t->mx + r * D, xin + i / K * D, sizeof(float) * (size_t)D);
                memcpy(t->mhx + r * Fm, s->mh + i * Fm, sizeof(float) * (size_t)Fm);
            }
        }
        const float *wg, *wu, *wd;
        expert_weights(t, y, e, &wg, &wu, &wd);
        memset(t->mdh, 0, sizeof(float) * (size_t)(n * Fm));
        tr_matmul_nn(t->tp, t->mdo, n, D, wd, Fm, t->mdh);
        expert_lora_bwd(t, y, P_ED, e, n, t->mhx, s->xe[2], t->mdo, t->mdh);
        (t->gelu ? tr_gelu_mul_bwd : tr_silu_mul_bwd)(t->tp, t->mga, t->mua, t->mdh, n * Fm, t->mdg, t->mdu);
        memset(t->mdx, 0, sizeof(float) * (size_t)(n * D));
        tr_matmul_nn(t->tp, t->mdg, n, Fm, wg, D, t->mdx);
        tr_matmul_nn(t->tp, t->mdu, n, Fm, wu, D, t->mdx);
        expert_lora_bwd(t, y, P_EG, e, n, t->mx, s->xe[0], t->mdg, t->mdx);
        expert_lora_bwd(t, y, P_EU, e, n, t->mx, s->xe[1], t->mdu, t->mdx);
        for (int r = 0; r < n; r++)
            for (int64_t d = 0; d < D; d++) dh2[t->mrow[r] / K * D + d] += t->mdx[r * D + d];
    }
    for (int64_t i = 0; i < T; i++) { /* the router: dw -> dp (of the picked probabilities) -> dlogits */
        const float *p = s->mprob + i * E, *w = s->mw + i * K;
        const int32_t *sel = s->msel + i * K;
        float *dl = t->mdl + i * E, dpw = 0, total = 0, dsum = 0;
        memset(dl, 0, sizeof(float) * (size_t)E);
        for (int64_t k = 0; k < K; k++) { /* dw_k = dy . o_k, kept in dl at the pick's expert */
            const float *o = s->mo + (i * K + k) * D;
            float acc = 0;
            for (int64_t d = 0; d < D; d++) acc += dy[i * D + d] * o[d];
            dl[sel[k]] = acc, dpw += acc * w[k], total += p[sel[k]];
        }
        if (y->beside) { /* Gemma 4: w_k = softmax over the picks' logits (p holds logits) * scale */
            float q[256], mxl = p[sel[0]], z = 0, dq = 0;
            for (int64_t k = 0; k < K; k++) z += (q[k] = expf(p[sel[k]] - mxl));
            for (int64_t k = 0; k < K; k++) q[k] /= z, dl[sel[k]] *= y->expert_scale[sel[k]], dq += q[k] * dl[sel[k]];
            for (int64_t k = 0; k < K; k++) dl[sel[k]] = q[k] * (dl[sel[k]] - dq);
            continue;
        }
        if (t->norm_topk) /* w = p / total over the picks: dp_j = (dw_j - sum_k dw_k w_k) / total */
            for (int64_t k = 0; k < K; k++) dl[sel[k]] = (dl[sel[k]] - dpw) / total;
        for (int64_t k = 0; k < K; k++) dsum += p[sel[k]] * dl[sel[k]];
        for (int64_t e = 0; e < E; e++) dl[e] = p[e] * (dl[e] - dsum); /* the softmax's backward */
    }
    tr_linear_bwd(t->tp, rin, T, D, y->router, E, lora_of(y->lora, P_RT), s->xa[P_RT], t->mdl, drin, sc);
    if (!t->Fs) return;
    int64_t Fs = t->Fs; /* the shared expert and its gate */
    for (int64_t i = 0; i < T; i++) {
        float g = 1.0f / (1.0f + expf(-s->shz[i])), dz = 0;
        for (int64_t d = 0; d < D; d++) {
            t->sdo[i * D + d] = dy[i * D + d] * g;
            dz += dy[i * D + d] * s->sho[i * D + d];
        }
        t->mdl[i] = dz * g * (1.0f - g); /* the gate logit's gradient (mdl is free again) */
    }
    tr_linear_bwd(t->tp, xin, T, D, y->sr, 1, lora_of(y->lora, P_SR), s->xa[P_SR], t->mdl, dh2, sc);
    memset(t->sdh, 0, sizeof(float) * (size_t)(T * Fs));
    if (trained(y, P_SD)) tr_silu_mul_fwd(t->tp, s->shg, s->shu, T * Fs, t->sdx); /* the down's input again */
    tr_linear_bwd(t->tp, t->sdx, T, Fs, y->sd, D, lora_of(y->lora, P_SD), s->xa[P_SD], t->sdo, t->sdh, sc);
    tr_silu_mul_bwd(t->tp, s->shg, s->shu, t->sdh, T * Fs, t->sdg, t->sdu);
    tr_linear_bwd(t->tp, xin, T, D, y->sg, Fs, lora_of(y->lora, P_SG), s->xa[P_SG], t->sdg, dh2, sc);
    tr_linear_bwd(t->tp, xin, T, D, y->su, Fs, lora_of(y->lora, P_SU), s->xa[P_SU], t->sdu, dh2, sc);
}

/* ---- Qwen3.5's Gated DeltaNet layers (frozen: the gradient goes through them) ----------
 * mlx-lm's qwen3_5.py GatedDeltaNet with gated_delta_ops (the sequential form it trains
 * with): qkv = silu(causal depthwise conv(in_proj_qkv x)), q and k L2-normalised (q times
 * k_dim^-1/2 more), beta = sigmoid(in_proj_b x), g = exp(-exp(A_log) softplus(in_proj_a x +
 * dt_bias)); per value head the delta rule on a [v_dim, k_dim] state from zero: S *= g;
 * delta = beta (v - S k); S += delta k^T; y = S q; then out_proj(silu(z) rmsnorm(y) w). The
 * backward walks the rule in reverse from states kept every GDN_CK tokens (each chunk's
 * states computed again). */
static float gdn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float gdn_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); } /* mlx's */
static int gdn_hk(const trainer *t, int h) { return t->gdn_tiled ? h % t->Hk : h / (t->Hv / t->Hk); }

typedef struct gdn_job {
    trainer *t;
    const acts *s;
    int64_t T;
} gdn_job;

/* one value head's rule over the sequence: y, and the state before every GDN_CK-th token */
static void gdn_fwd_head(void *vc, int task, int thread) {
    (void)thread;
    const gdn_job *j = vc;
    trainer *t = j->t;
    const acts *s = j->s;
    int64_t h = task, Dk = t->Dk, Dv = t->Dv, Hk = t->Hk, Hv = t->Hv, C = t->Cc, hk = gdn_hk(t, task);
    float *S = t->gdn_work + h * t->gdn_per;
    memset(S, 0, sizeof(float) * (size_t)(Dv * Dk));
    for (int64_t i = 0; i < j->T; i++) {
        if (i % GDN_CK == 0) memcpy(s->gck + ((i / GDN_CK) * Hv + h) * Dv * Dk, S, sizeof(float) * (size_t)(Dv * Dk));
        tr_delta_step(S, s->gkn + (i * Hk + hk) * Dk, s->gqn + (i * Hk + hk) * Dk,
                      s->gcv + i * C + 2 * Hk * Dk + h * Dv, (int)Dv, (int)Dk, s->gg[i * Hv + h], s->gbeta[i * Hv + h],
                      s->gy + (i * Hv + h) * Dv);
    }
}

/* its backward from dy (t->gd_y): dq, dk (this value head's, [T, Hv, Dk]), dv, dg, dbeta */
static void gdn_bwd_head(void *vc, int task, int thread) {
    (void)thread;
    const gdn_job *j = vc;
    trainer *t = j->t;
    const acts *s = j->s;
    int64_t h = task, Dk = t->Dk, Dv = t->Dv, Hk = t->Hk, Hv = t->Hv, C = t->Cc, hk = gdn_hk(t, task), SD = Dv * Dk;
    float *St = t->gdn_work + h * t->gdn_per, *dS = St + (GDN_CK + 1) * SD, *work = dS + SD;
    memset(dS, 0, sizeof(float) * (size_t)SD);
    for (int64_t c0 = (j->T - 1) / GDN_CK * GDN_CK; c0 >= 0; c0 -= GDN_CK) {
        int64_t n = j->T - c0 < GDN_CK ? j->T - c0 : GDN_CK;
        memcpy(St, s->gck + ((c0 / GDN_CK) * Hv + h) * SD, sizeof(float) * (size_t)SD);
        for (int64_t m = 0; m < n; m++) { /* St[m + 1]: the state after token c0 + m */
            int64_t i = c0 + m;
            memcpy(St + (m + 1) * SD, St + m * SD, sizeof(float) * (size_t)SD);
            tr_delta_step(St + (m + 1) * SD, s->gkn + (i * Hk + hk) * Dk, NULL, s->gcv + i * C + 2 * Hk * Dk + h * Dv,
                          (int)Dv, (int)Dk, s->gg[i * Hv + h], s->gbeta[i * Hv + h], NULL);
        }
        for (int64_t m = n - 1; m >= 0; m--) {
            int64_t i = c0 + m;
            tr_delta_step_bwd(St + m * SD, St + (m + 1) * SD, s->gkn + (i * Hk + hk) * Dk, s->gqn + (i * Hk + hk) * Dk,
                              s->gcv + i * C + 2 * Hk * Dk + h * Dv, (int)Dv, (int)Dk, s->gg[i * Hv + h],
                              s->gbeta[i * Hv + h], t->gd_y + (i * Hv + h) * Dv, dS, t->gd_q + (i * Hv + h) * Dk,
                              t->gd_k + (i * Hv + h) * Dk, t->gd_v + (i * Hv + h) * Dv, &t->gd_g[i * Hv + h],
                              &t->gd_beta[i * Hv + h], work);
        }
    }
}

/* The layer's mixer on s->h1 (its input norm done) into t->tmp. */
static void gdn_forward(trainer *t, const tlayer *y, acts *s, int64_t T, const tr_lora *lo) {
    int64_t D = t->D, Dk = t->Dk, Dv = t->Dv, Hk = t->Hk, Hv = t->Hv, C = t->Cc, Kc = t->Kc, VD = Hv * Dv;
#define GLORA(p) (lo ? lora_of(lo, p) : NULL)
    tr_linear_fwd(t->tp, s->h1, T, D, y->gqkv, C, NULL, GLORA(P_GQKV), s->xa[P_GQKV], s->graw);
    tr_linear_fwd(t->tp, s->h1, T, D, y->gz, VD, NULL, GLORA(P_GZ), s->xa[P_GZ], s->gz);
    tr_linear_fwd(t->tp, s->h1, T, D, y->gbw, Hv, NULL, GLORA(P_GB), s->xa[P_GB], s->gb);
    tr_linear_fwd(t->tp, s->h1, T, D, y->gaw, Hv, NULL, GLORA(P_GA), s->xa[P_GA], s->ga);
    for (int64_t i = 0; i < T; i++) /* the causal conv from a zero history, then SiLU */
        for (int64_t c = 0; c < C; c++) {
            float acc = 0;
            for (int64_t k = 0; k < Kc; k++) {
                int64_t src = i - (Kc - 1) + k;
                if (src >= 0) acc += y->conv[c * Kc + k] * s->graw[src * C + c];
            }
            s->gpre[i * C + c] = acc;
            s->gcv[i * C + c] = acc * gdn_sigmoid(acc);
        }
    float inv = 1.0f / sqrtf((float)Dk), eps = 1e-6f * inv * inv;
    for (int64_t i = 0; i < T; i++) {
        tr_rmsnorm_fwd(s->gcv + i * C, Hk, Dk, NULL, eps, s->gqn + i * Hk * Dk, s->grq + i * Hk);
        tr_rmsnorm_fwd(s->gcv + i * C + Hk * Dk, Hk, Dk, NULL, eps, s->gkn + i * Hk * Dk, s->grk + i * Hk);
        for (int64_t d = 0; d < Hk * Dk; d++) s->gqn[i * Hk * Dk + d] *= inv * inv, s->gkn[i * Hk * Dk + d] *= inv;
        for (int64_t h = 0; h < Hv; h++) {
            s->gbeta[i * Hv + h] = gdn_sigmoid(s->gb[i * Hv + h]);
            s->gg[i * Hv + h] = expf(-expf(y->A_log[h]) * gdn_softplus(s->ga[i * Hv + h] + y->dt_bias[h]));
        }
    }
    gdn_job j = {.t = t, .s = s, .T = T};
    tp_run(t->tp, (int)Hv, gdn_fwd_head, &j);
    tr_rmsnorm_fwd(s->gy, T * Hv, Dv, y->gnorm, t->eps, s->gyn, s->gry);
    for (int64_t i = 0; i < T * VD; i++) s->ggo[i] = s->gz[i] * gdn_sigmoid(s->gz[i]) * s->gyn[i]; /* silu(z) yw */
    tr_linear_fwd(t->tp, s->ggo, T, VD, y->gout, D, NULL, GLORA(P_GOUT), s->xa[P_GOUT], t->tmp);
#undef GLORA
}

/* Its backward: from dr (the mixer output's gradient) into dh1 (overwritten: the gradient of
 * the normed input). */
/* dh1 NULL: the input's gradient is not wanted (the lowest trained layer), the pairs' still are. */
static void gdn_backward(trainer *t, const tlayer *y, const acts *s, int64_t T, const float *dr, float *dh1) {
    int64_t D = t->D, Dk = t->Dk, Dv = t->Dv, Hk = t->Hk, Hv = t->Hv, C = t->Cc, Kc = t->Kc, VD = Hv * Dv;
    float *dout = t->gd_out, *dz = t->gd_z, *dc = t->gd_c, *dqkv = t->gd_qkv, *sc = t->lin_scratch;
    memset(dout, 0, sizeof(float) * (size_t)(T * VD));
    tr_linear_bwd(t->tp, s->ggo, T, VD, y->gout, D, lora_of(y->lora, P_GOUT), s->xa[P_GOUT], dr, dout, sc);
    for (int64_t i = 0; i < T * VD; i++) { /* out = silu(z) yw, yw = rmsnorm(y) w */
        float z = s->gz[i], sg = gdn_sigmoid(z);
        dz[i] = dout[i] * s->gyn[i] * sg * (1.0f + z * (1.0f - sg));
        dout[i] *= z * sg;
    }
    memset(t->gd_y, 0, sizeof(float) * (size_t)(T * VD));
    tr_rmsnorm_bwd(s->gy, T * Hv, Dv, y->gnorm, s->gry, dout, t->gd_y);
    gdn_job j = {.t = t, .s = s, .T = T};
    tp_run(t->tp, (int)Hv, gdn_bwd_head, &j);
    float inv = 1.0f / sqrtf((float)Dk);
    memset(dc, 0, sizeof(float) * (size_t)(T * C));
    for (int64_t i = 0; i < T; i++) {
        float *dqn = t->gd_qn, *dkn = t->gd_qn + Hk * Dk; /* this token's, summed over value heads */
        memset(dqn, 0, sizeof(float) * (size_t)(2 * Hk * Dk));
        for (int64_t h = 0; h < Hv; h++) {
            int64_t hk = gdn_hk(t, (int)h);
            for (int64_t d = 0; d < Dk; d++) {
                dqn[hk * Dk + d] += t->gd_q[(i * Hv + h) * Dk + d] * inv * inv;
                dkn[hk * Dk + d] += t->gd_k[(i * Hv + h) * Dk + d] * inv;
            }
        }
        tr_rmsnorm_bwd(s->gcv + i * C, Hk, Dk, NULL, s->grq + i * Hk, dqn, dc + i * C);
        tr_rmsnorm_bwd(s->gcv + i * C + Hk * Dk, Hk, Dk, NULL, s->grk + i * Hk, dkn, dc + i * C + Hk * Dk);
        memcpy(dc + i * C + 2 * Hk * Dk, t->gd_v + i * VD, sizeof(float) * (size_t)VD);
        for (int64_t h = 0; h < Hv; h++) { /* beta = sigmoid(b); g = exp(-exp(A_log) softplus(a + dt_bias)) */
            float beta = s->gbeta[i * Hv + h], g = s->gg[i * Hv + h];
            t->gd_b[i * Hv + h] = t->gd_beta[i * Hv + h] * beta * (1.0f - beta);
            t->gd_a[i * Hv + h] =
                t->gd_g[i * Hv + h] * g * -expf(y->A_log[h]) * gdn_sigmoid(s->ga[i * Hv + h] + y->dt_bias[h]);
        }
    }
    for (int64_t i = 0; i < T * C; i++) { /* through the SiLU */
        float x = s->gpre[i], sg = gdn_sigmoid(x);
        dc[i] *= sg * (1.0f + x * (1.0f - sg));
    }
    memset(dqkv, 0, sizeof(float) * (size_t)(T * C));
    for (int64_t i = 0; i < T; i++) /* the conv's transpose */
        for (int64_t k = 0; k < Kc; k++) {
            int64_t src = i - (Kc - 1) + k;
            if (src < 0) continue;
            for (int64_t c = 0; c < C; c++) dqkv[src * C + c] += y->conv[c * Kc + k] * dc[i * C + c];
        }
    if (dh1) memset(dh1, 0, sizeof(float) * (size_t)(T * D));
    tr_linear_bwd(t->tp, s->h1, T, D, y->gqkv, C, lora_of(y->lora, P_GQKV), s->xa[P_GQKV], dqkv, dh1, sc);
    tr_linear_bwd(t->tp, s->h1, T, D, y->gz, VD, lora_of(y->lora, P_GZ), s->xa[P_GZ], dz, dh1, sc);
    tr_linear_bwd(t->tp, s->h1, T, D, y->gbw, Hv, lora_of(y->lora, P_GB), s->xa[P_GB], t->gd_b, dh1, sc);
    tr_linear_bwd(t->tp, s->h1, T, D, y->gaw, Hv, lora_of(y->lora, P_GA), s->xa[P_GA], t->gd_a, dh1, sc);
}

/* Layer y's attention on s->h1 (its input norm done) into t->tmp (its output, Gemma's post-norm
 * applied); lo: its LoRA pairs or NULL. */
static void attn_forward(trainer *t, const tlayer *y, acts *s, int64_t T, const tr_lora *lo) {
    int64_t D = t->D, hd = y->hd, qd = (int64_t)t->Hq * hd, kd = (int64_t)y->Hkv * hd;
#define LORA(p) (lo ? lora_of(lo, p) : NULL)
    tr_linear_fwd(t->tp, s->h1, T, D, y->w[P_Q], y->n[P_Q], y->bias[0], LORA(P_Q), s->xa[P_Q], s->ql);
    const float *qsrc = s->ql;
    if (t->gated) { /* each head's rows: hd of queries, then hd of its output gate */
        for (int64_t i = 0; i < T * t->Hq; i++) {
            memcpy(s->qs + i * hd, s->ql + i * 2 * hd, sizeof(float) * (size_t)hd);
            memcpy(s->qgate + i * hd, s->ql + i * 2 * hd + hd, sizeof(float) * (size_t)hd);
        }
        qsrc = s->qs;
    }
    if (y->q_norm)
        tr_rmsnorm_fwd(qsrc, T * t->Hq, hd, y->q_norm, t->eps, s->qr, s->rstdq);
    else
        memcpy(s->qr, qsrc, sizeof(float) * (size_t)(T * qd));
    tr_rope(s->qr, T, t->Hq, hd, y->rd, 0, y->inv_freq, t->adjacent, 1);
    const float *K = s->kr, *V = s->v;
    if (y->src >= 0) { /* a shared-KV layer: the keys and values of the layer it reads */
        K = t->layers[y->src].kk, V = t->layers[y->src].kv;
    } else {
        tr_linear_fwd(t->tp, s->h1, T, D, y->w[P_K], kd, y->bias[1], LORA(P_K), s->xa[P_K], s->kl);
        float *vl = y->v_norm ? s->vl : s->v; /* the values before their norm */
        if (y->k_eq_v)
            vl = s->kl;
        else
            tr_linear_fwd(t->tp, s->h1, T, D, y->w[P_V], kd, y->bias[2], LORA(P_V), s->xa[P_V], vl);
        if (y->k_norm)
            tr_rmsnorm_fwd(s->kl, T * y->Hkv, hd, y->k_norm, t->eps, s->kr, s->rstdk);
        else
            memcpy(s->kr, s->kl, sizeof(float) * (size_t)(T * kd));
        tr_rope(s->kr, T, y->Hkv, hd, y->rd, 0, y->inv_freq, t->adjacent, 1);
        if (y->v_norm) tr_rmsnorm_fwd(vl, T * y->Hkv, hd, NULL, t->eps, s->v, s->rstdv);
        if (y->kk) { /* read by shared-KV layers above */
            memcpy(y->kk, s->kr, sizeof(float) * (size_t)(T * kd));
            memcpy(y->kv, s->v, sizeof(float) * (size_t)(T * kd));
        }
    }
    tr_attn_fwd(t->tp, s->qr, K, V, T, t->Hq, y->Hkv, (int)hd, t->attn_scale, y->window, s->p, s->a);
    if (t->gated)
        for (int64_t i = 0; i < T * qd; i++) s->ag[i] = s->a[i] * gdn_sigmoid(s->qgate[i]);
    tr_linear_fwd(t->tp, t->gated ? s->ag : s->a, T, qd, y->w[P_O], D, NULL, LORA(P_O), s->xa[P_O],
                  t->post_norms ? s->ro : t->tmp);
    if (t->post_norms) tr_rmsnorm_fwd(s->ro, T, D, y->post_attn_norm, t->eps, t->tmp, s->rstd_pa);
#undef LORA
}

/* Layer l of the forward on t->x (T rows, in place), its activations into s; lo: its LoRA
 * pairs or NULL. */
static void layer_forward(trainer *t, const tlayer *y, acts *s, int64_t T, const tr_lora *lo) {
    int64_t D = t->D, F = y->F;
#define LORA(p) (lo ? lora_of(lo, p) : NULL)
    memcpy(s->x_in, t->x, sizeof(float) * (size_t)(T * D));
    tr_rmsnorm_fwd(t->x, T, D, y->attn_norm, t->eps, s->h1, s->rstd1);
    if (y->linear)
        gdn_forward(t, y, s, T, lo);
    else
        attn_forward(t, y, s, T, lo);
    for (int64_t i = 0; i < T * D; i++) t->x[i] += t->tmp[i] * t->res_scale;
    memcpy(s->x_mid, t->x, sizeof(float) * (size_t)(T * D));
    tr_rmsnorm_fwd(t->x, T, D, y->ffn_norm, t->eps, s->h2, s->rstd2);
    if (y->moe && !t->gelu) { /* Qwen3-MoE, Qwen3.5-MoE: the experts are the MLP */
        moe_forward(t, y, s, T, s->h2, s->h2, t->tmp, lo);
        for (int64_t i = 0; i < T * D; i++) t->x[i] += t->tmp[i];
        return;
    }
    tr_linear_fwd(t->tp, s->h2, T, D, y->w[P_GATE], F, NULL, LORA(P_GATE), s->xa[P_GATE], s->g);
    tr_linear_fwd(t->tp, s->h2, T, D, y->w[P_UP], F, NULL, LORA(P_UP), s->xa[P_UP], s->u);
    (t->gelu ? tr_gelu_mul_fwd : tr_silu_mul_fwd)(t->tp, s->g, s->u, T * F, s->mm);
    tr_linear_fwd(t->tp, s->mm, T, F, y->w[P_DOWN], D, NULL, LORA(P_DOWN), s->xa[P_DOWN],
                  y->moe          ? s->rd1
                  : t->post_norms ? s->rd
                                  : t->tmp);
    if (y->moe) { /* Gemma 4: rd = post_1(MLP) + post_2(experts(pre_2(x)), routed from x) */
        tr_rmsnorm_fwd(s->rd1, T, D, y->post_ffn_norm_1, t->eps, s->rd, s->rstd_p1);
        tr_rmsnorm_fwd(s->x_mid, T, D, y->router_w, t->eps, s->rx, s->rstd_r);
        tr_rmsnorm_fwd(s->x_mid, T, D, y->ffn_norm_2, t->eps, s->h2b, s->rstd_b);
        moe_forward(t, y, s, T, s->h2b, s->rx, s->eo, lo);
        tr_rmsnorm_fwd(s->eo, T, D, y->post_ffn_norm_2, t->eps, t->tmp, s->rstd_p2);
        for (int64_t i = 0; i < T * D; i++) s->rd[i] += t->tmp[i];
    }
    if (t->post_norms) tr_rmsnorm_fwd(s->rd, T, D, y->post_ffn_norm, t->eps, t->tmp, s->rstd_pf);
    for (int64_t i = 0; i < T * D; i++) t->x[i] += t->tmp[i] * t->res_scale;
    if (t->P) { /* x += pl_norm(pl_proj(gelu(pl_gate(x)) * this layer's per-layer input)) */
        int64_t P = t->P, l = y - t->layers;
        memcpy(s->x_pl, t->x, sizeof(float) * (size_t)(T * D));
        tr_linear_fwd(t->tp, s->x_pl, T, D, y->w[P_PLG], P, NULL, LORA(P_PLG), s->xa[P_PLG], s->pg);
        tr_gelu_mul_fwd(t->tp, s->pg, t->pl_in + l * T * P, T * P, s->pm);
        tr_linear_fwd(t->tp, s->pm, T, P, y->w[P_PLP], D, NULL, LORA(P_PLP), s->xa[P_PLP], s->pp);
        tr_rmsnorm_fwd(s->pp, T, D, y->pl_norm, t->eps, t->tmp, s->rstd_pl);
        for (int64_t i = 0; i < T * D; i++) t->x[i] += t->tmp[i];
    }
    if (y->layer_scalar != 1.0f)
        for (int64_t i = 0; i < T * D; i++) t->x[i] *= y->layer_scalar;
#undef LORA
}

/* Gemma 4's per-layer inputs of ids[0..T) into t->pl_in ([L][T][P]), from the scaled
 * embeddings in t->x, as mlx-lm's _get_per_layer_inputs and _project_per_layer_inputs make
 * them: (norm(x W^T / sqrt(D)) + table[id] sqrt(P)) / sqrt(2), per layer's slice of P. */
static void per_layer_inputs(trainer *t, const int32_t *ids, int64_t T) {
    const model *m = t->m;
    int64_t P = t->P, L = t->L, D = t->D, LP = L * P;
    float ts = (float)sqrt((double)P), ps = (float)(1.0 / sqrt((double)D)), is = (float)(1.0 / sqrt(2.0));
    tr_matmul_nt(t->tp, t->x, T, D, t->pl_proj, LP, t->pl_tmp, 0);
    for (int64_t i = 0; i < T * LP; i++) t->pl_tmp[i] *= ps;
    float *row = t->dpl; /* a free row of P floats (the backward's buffer) */
    for (int64_t i = 0; i < T; i++) {
        float *proj = t->pl_tmp + i * LP, rstd;
        for (int64_t l = 0; l < L; l++) {
            tr_rmsnorm_fwd(proj + l * P, 1, P, m->per_layer_proj_norm, t->eps, row, &rstd);
            memcpy(proj + l * P, row, sizeof(float) * (size_t)P);
        }
        float *emb = t->pl_row; /* the table's row */
        op_weight_dequant_row(&m->embed_per_layer, ids[i], emb);
        for (int64_t l = 0; l < L; l++)
            for (int64_t k = 0; k < P; k++)
                t->pl_in[(l * T + i) * P + k] = (proj[l * P + k] + emb[l * P + k] * ts) * is;
    }
}

/* Forward of one sequence of T tokens (ids) and the loss of its targets (weight[i] each);
 * returns sum weight[i] * ce_i and, with grad, leaves the gradient of that sum wrt the
 * final normed hidden state in t->dh. The layers below the LoRA ones are the same with the
 * adapter on or off: keep (T x D floats, or NULL) gets the input of the lowest LoRA layer,
 * and from (NULL: run them) gives it instead of running them. */
static double forward(trainer *t, const int32_t *ids, int64_t T, int grad, float *keep, const float *from) {
    int64_t D = t->D;
    if (!from || t->P) { /* the embeddings (Gemma 4's per-layer inputs are made from them) */
        for (int64_t i = 0; i < T; i++) op_weight_dequant_row(&t->m->embed, ids[i], t->x + i * D);
        if (t->emb_scale != 1)
            for (int64_t i = 0; i < T * D; i++) t->x[i] *= t->emb_scale;
        if (t->P) per_layer_inputs(t, ids, T);
    }
    if (from) memcpy(t->x, from, sizeof(float) * (size_t)(T * D));
    for (int l = from ? t->first_lora : 0; l < t->L; l++) {
        if (keep && l == t->first_lora) memcpy(keep, t->x, sizeof(float) * (size_t)(T * D));
        tlayer *y = &t->layers[l];
        acts *s = y->has_lora && !t->ckpt ? &y->s : &t->shared;
        if (t->ckpt && y->has_lora) memcpy(y->ck, t->x, sizeof(float) * (size_t)(T * D));
        layer_forward(t, y, s, T, y->has_lora && !t->lora_off ? y->lora : NULL);
    }
    memcpy(t->xf, t->x, sizeof(float) * (size_t)(T * D));
    tr_rmsnorm_fwd(t->xf, T, D, t->final_norm, t->eps, t->hf, t->rstdf);
    if (t->logit_div != 1) /* MiniCPM: lm_head(out / (hidden / dim_model_base)) */
        for (int64_t i = 0; i < T * D; i++) t->hf[i] /= t->logit_div;
    return tr_xent(t->tp, t->hf, T, D, t->lm_head, t->V, t->softcap, t->targets, t->weight, grad ? t->dh : NULL, t->ce,
                   t->xent_scratch);
}

/* The gradient of a block's output (attention or MLP) from the residual's: the same, or
 * times res_scale (MiniCPM adds its blocks' outputs scaled). */
static const float *block_grad(trainer *t, int64_t T) {
    if (t->res_scale == 1) return t->dx;
    for (int64_t i = 0; i < T * t->D; i++) t->dxs[i] = t->dx[i] * t->res_scale;
    return t->dxs;
}

/* The gradient of a block's projection output (attention's o_proj, the MLP's down_proj):
 * the block output's (block_grad), through Gemma's post-norm of r (rstd: its 1 / rms) when
 * the model has them. Uses t->dtmp, which the caller's next use overwrites. */
static const float *post_norm_grad(trainer *t, int64_t T, const float *r, const float *w, const float *rstd) {
    const float *d = block_grad(t, T);
    if (!t->post_norms) return d;
    memset(t->dtmp, 0, sizeof(float) * (size_t)(T * t->D));
    tr_rmsnorm_bwd(r, T, t->D, w, rstd, d, t->dtmp);
    return t->dtmp;
}

/* Layer y's attention backward from t->dx (the residual's gradient): the LoRA gradients of
 * its projections, and into dh1 (NULL: not wanted) the gradient of its normed input. */
static void attn_backward(trainer *t, tlayer *y, const acts *s, int64_t T, float *dh1) {
    int64_t D = t->D, hd = y->hd, qd = (int64_t)t->Hq * hd, kd = (int64_t)y->Hkv * hd;
    float *sc = t->lin_scratch;
    memset(t->da, 0, sizeof(float) * (size_t)(T * qd));
    tr_linear_bwd(t->tp, t->gated ? s->ag : s->a, T, qd, y->w[P_O], D, lora_of(y->lora, P_O), s->xa[P_O],
                  post_norm_grad(t, T, s->ro, y->post_attn_norm, s->rstd_pa), t->da, sc);
    if (t->gated) /* o_proj read a * sigmoid(gate) */
        for (int64_t i = 0; i < T * qd; i++) {
            float sg = gdn_sigmoid(s->qgate[i]);
            t->dqg[i] = t->da[i] * s->a[i] * sg * (1.0f - sg);
            t->da[i] *= sg;
        }
    const tlayer *kvl = y->src >= 0 ? &t->layers[y->src] : NULL; /* whose keys and values it read */
    tr_attn_bwd(t->tp, s->qr, kvl ? kvl->kk : s->kr, kvl ? kvl->kv : s->v, s->p, t->da, T, t->Hq, y->Hkv, (int)hd,
                t->attn_scale, t->dq, t->dk, t->dv, t->attn_scratch);
    tr_rope(t->dq, T, t->Hq, (int)hd, y->rd, 0, y->inv_freq, t->adjacent, -1);
    const float *dq = t->dq, *dk = t->dk, *dv = t->dv;
    if (kvl) { /* the keys' and values' gradients go to the layer that made them */
        for (int64_t i = 0; i < T * kd; i++) kvl->dks[i] += t->dk[i], kvl->dvs[i] += t->dv[i];
    } else {
        if (y->dks)
            for (int64_t i = 0; i < T * kd; i++) t->dk[i] += y->dks[i], t->dv[i] += y->dvs[i];
        tr_rope(t->dk, T, y->Hkv, (int)hd, y->rd, 0, y->inv_freq, t->adjacent, -1);
        if (y->k_norm) {
            memset(t->dkl, 0, sizeof(float) * (size_t)(T * kd));
            tr_rmsnorm_bwd(s->kl, T * y->Hkv, hd, y->k_norm, s->rstdk, t->dk, t->dkl);
            dk = t->dkl;
        }
        if (y->v_norm) {
            memset(t->dvl, 0, sizeof(float) * (size_t)(T * kd));
            tr_rmsnorm_bwd(y->k_eq_v ? s->kl : s->vl, T * y->Hkv, hd, NULL, s->rstdv, t->dv, t->dvl);
            dv = t->dvl;
        }
        if (y->k_eq_v) { /* values = the keys' projection: both gradients go through it */
            if (dk != t->dkl) memcpy(t->dkl, dk, sizeof(float) * (size_t)(T * kd));
            for (int64_t i = 0; i < T * kd; i++) t->dkl[i] += dv[i];
            dk = t->dkl;
        }
    }
    if (y->q_norm) {
        memset(t->dql, 0, sizeof(float) * (size_t)(T * qd));
        tr_rmsnorm_bwd(t->gated ? s->qs : s->ql, T * t->Hq, hd, y->q_norm, s->rstdq, t->dq, t->dql);
        dq = t->dql;
    }
    if (t->gated) { /* q_proj's rows: each head's queries, then its gate */
        for (int64_t i = 0; i < T * t->Hq; i++) {
            memcpy(t->dqf + i * 2 * hd, dq + i * hd, sizeof(float) * (size_t)hd);
            memcpy(t->dqf + i * 2 * hd + hd, t->dqg + i * hd, sizeof(float) * (size_t)hd);
        }
        dq = t->dqf;
    }
    if (dh1) memset(dh1, 0, sizeof(float) * (size_t)(T * D));
    tr_linear_bwd(t->tp, s->h1, T, D, y->w[P_Q], y->n[P_Q], lora_of(y->lora, P_Q), s->xa[P_Q], dq, dh1, sc);
    if (!kvl) tr_linear_bwd(t->tp, s->h1, T, D, y->w[P_K], kd, lora_of(y->lora, P_K), s->xa[P_K], dk, dh1, sc);
    if (!kvl && !y->k_eq_v)
        tr_linear_bwd(t->tp, s->h1, T, D, y->w[P_V], kd, lora_of(y->lora, P_V), s->xa[P_V], dv, dh1, sc);
}

/* Gemma 4's experts beside its MLP, from drd (the gradient of post_1(MLP) + post_2(experts)):
 * the experts', router's and their norms' gradients added to t->dx (x's); returns the MLP
 * down projection's output gradient (through post_1). */
static const float *gemma4_experts_backward(trainer *t, const tlayer *y, const acts *s, int64_t T, const float *drd) {
    int64_t D = t->D;
    size_t n = sizeof(float) * (size_t)(T * D);
    memset(t->g4b, 0, n), memset(t->g4c, 0, n), memset(t->g4x, 0, n), memset(t->g4r, 0, n);
    tr_rmsnorm_bwd(s->rd1, T, D, y->post_ffn_norm_1, s->rstd_p1, drd, t->g4b);
    tr_rmsnorm_bwd(s->eo, T, D, y->post_ffn_norm_2, s->rstd_p2, drd, t->g4c);
    moe_backward(t, y, s, T, s->h2b, s->rx, t->g4c, t->g4x, t->g4r);
    tr_rmsnorm_bwd(s->x_mid, T, D, y->ffn_norm_2, s->rstd_b, t->g4x, t->dx);
    tr_rmsnorm_bwd(s->x_mid, T, D, y->router_w, s->rstd_r, t->g4r, t->dx);
    return t->g4b;
}

/* Backward from t->dh down to the lowest LoRA layer, adding to every LoRA gradient. */
static void backward(trainer *t, int64_t T) {
    int64_t D = t->D;
    float *sc = t->lin_scratch;
    memset(t->dx, 0, sizeof(float) * (size_t)(T * D));
    if (t->logit_div != 1)
        for (int64_t i = 0; i < T * D; i++) t->dh[i] /= t->logit_div;
    tr_rmsnorm_bwd(t->xf, T, D, t->final_norm, t->rstdf, t->dh, t->dx);
    for (int l = 0; l < t->L; l++)
        if (t->layers[l].dks) { /* what shared-KV layers add to the keys and values they read */
            size_t n = sizeof(float) * (size_t)(T * t->layers[l].Hkv * t->layers[l].hd);
            memset(t->layers[l].dks, 0, n), memset(t->layers[l].dvs, 0, n);
        }
    for (int l = t->L - 1; l >= t->first_lora; l--) {
        tlayer *y = &t->layers[l];
        int64_t F = y->F;
        acts *s = &y->s;
        if (t->ckpt) { /* the layer again from its input, its activations into shared */
            memcpy(t->x, y->ck, sizeof(float) * (size_t)(T * D));
            s = &t->shared;
            layer_forward(t, y, s, T, y->lora);
        }
        int below = l > t->first_lora; /* the input's gradient is needed further down */
        if (y->layer_scalar != 1.0f)
            for (int64_t i = 0; i < T * D; i++) t->dx[i] *= y->layer_scalar;
        if (t->P) { /* the per-layer input's gate: its projection's norm, the projection, the product, the gate */
            int64_t P = t->P;
            memset(t->dtmp, 0, sizeof(float) * (size_t)(T * D));
            tr_rmsnorm_bwd(s->pp, T, D, y->pl_norm, s->rstd_pl, t->dx, t->dtmp);
            memset(t->dpl, 0, sizeof(float) * (size_t)(T * P));
            tr_linear_bwd(t->tp, s->pm, T, P, y->w[P_PLP], D, lora_of(y->lora, P_PLP), s->xa[P_PLP], t->dtmp, t->dpl,
                          sc);
            tr_gelu_mul_bwd(t->tp, s->pg, t->pl_in + (int64_t)l * T * P, t->dpl, T * P, t->dg, t->du);
            tr_linear_bwd(t->tp, s->x_pl, T, D, y->w[P_PLG], P, lora_of(y->lora, P_PLG), s->xa[P_PLG], t->dg, t->dx,
                          sc);
        }
        if (y->moe && !t->gelu) {
            memset(t->dtmp, 0, sizeof(float) * (size_t)(T * D));
            moe_backward(t, y, s, T, s->h2, s->h2, block_grad(t, T), t->dtmp, t->dtmp);
        } else {
            const float *ddown = post_norm_grad(t, T, s->rd, y->post_ffn_norm, s->rstd_pf);
            if (y->moe) ddown = gemma4_experts_backward(t, y, s, T, ddown);
            memset(t->dmm, 0, sizeof(float) * (size_t)(T * F));
            tr_linear_bwd(t->tp, s->mm, T, F, y->w[P_DOWN], D, lora_of(y->lora, P_DOWN), s->xa[P_DOWN], ddown, t->dmm,
                          sc);
            (t->gelu ? tr_gelu_mul_bwd : tr_silu_mul_bwd)(t->tp, s->g, s->u, t->dmm, T * F, t->dg, t->du);
            memset(t->dtmp, 0, sizeof(float) * (size_t)(T * D));
            tr_linear_bwd(t->tp, s->h2, T, D, y->w[P_GATE], F, lora_of(y->lora, P_GATE), s->xa[P_GATE], t->dg, t->dtmp,
                          sc);
            tr_linear_bwd(t->tp, s->h2, T, D, y->w[P_UP], F, lora_of(y->lora, P_UP), s->xa[P_UP], t->du, t->dtmp, sc);
        }
        tr_rmsnorm_bwd(s->x_mid, T, D, y->ffn_norm, s->rstd2, t->dtmp, t->dx);
        float *dh1 = below ? t->dtmp : NULL;
        if (y->linear) { /* the Gated DeltaNet mixer: the input's gradient where wanted, its pairs' */
            if (dh1 || trained(y, P_GQKV)) gdn_backward(t, y, s, T, block_grad(t, T), dh1);
        } else {
            attn_backward(t, y, s, T, dh1);
        }
        if (dh1) tr_rmsnorm_bwd(s->x_in, T, D, y->attn_norm, s->rstd1, dh1, t->dx);
    }
}

/* One batch (examples idx[0..bs)), as mlx-lm's iterate_batches pads it and default_loss
 * masks it: L = min(1 + 32 * ceil(longest / 32), max_seq_length) columns; a sequence of n
 * tokens (cut to max_seq_length) has targets at columns offset - 1 .. n - 1, so when n < L
 * its last target is the padding id 0 after its last token (mlx-lm's mask counts it).
 * Returns the loss (mean over targets) and *ntoks; with train, adds the gradients. */
static double run_batch(trainer *t, const tr_dataset *d, const int *idx, int bs, int max_seq, int train,
                        long long *ntoks) {
    int longest = 0;
    for (int b = 0; b < bs; b++) longest = d->ex[idx[b]].n > longest ? d->ex[idx[b]].n : longest;
    int L = 1 + 32 * ((longest + 31) / 32);
    L = L < max_seq ? L : max_seq;
    long long total = 0;
    for (int b = 0; b < bs; b++) {
        const tr_example *e = &d->ex[idx[b]];
        int n = e->n < max_seq ? e->n : max_seq, T = n < L ? n : L - 1;
        for (int i = 0; i < T; i++) total += i + 1 >= e->offset;
    }
    double loss = 0;
    for (int b = 0; b < bs; b++) {
        const tr_example *e = &d->ex[idx[b]];
        int n = e->n < max_seq ? e->n : max_seq, T = n < L ? n : L - 1;
        if (T <= 0) continue;
        for (int i = 0; i < T; i++) {
            t->targets[i] = i + 1 < n ? e->ids[i + 1] : 0;
            t->weight[i] = i + 1 >= e->offset && total ? 1.0f / (float)total : 0.0f;
        }
        loss += forward(t, e->ids, T, train, NULL, NULL);
        if (train) backward(t, T);
    }
    *ntoks = total;
    return loss;
}

/* ---- preference training (dpo, orpo), as TRL's DPOTrainer and ORPOTrainer define them ----
 * Each sequence of a pair runs alone (no padding): its T = n - 1 inputs predict ids[1..n).
 * The chosen sequence's activations stay in one slot while the rejected one runs in the
 * other; once both log-probs are known the loss's gradient wrt each row's cross-entropy is
 * a number per row, so each slot's dh rows are scaled by it and both run backward. */

static void swap_slot(trainer *t) {
    for (int l = t->first_lora; l < t->L; l++) {
        tlayer *y = &t->layers[l];
        acts a = y->s;
        y->s = y->s2, y->s2 = a;
        float *c = y->ck;
        y->ck = y->ck2, y->ck2 = c;
    }
    for (int l = 0; l < t->L; l++) { /* kept keys and values (every layer: some are below the LoRA ones) */
        tlayer *y = &t->layers[l];
        float *c = y->kk;
        y->kk = y->kk2, y->kk2 = c;
        c = y->kv, y->kv = y->kv2, y->kv2 = c;
    }
    float *f;
    f = t->xf, t->xf = t->xf2, t->xf2 = f;
    f = t->hf, t->hf = t->hf2, t->hf2 = f;
    f = t->rstdf, t->rstdf = t->rstdf2, t->rstdf2 = f;
    f = t->dh, t->dh = t->dh2, t->dh2 = f;
    f = t->pl_in, t->pl_in = t->pl_in2, t->pl_in2 = f;
}

/* Forward of ids[0..n) with the response's target rows (targets at offset..n-1), or every
 * row when all_rows, counted: with grad, dh then holds each counted row's own gradient (0
 * for the others); *resp: the cross-entropy summed over the response's rows, *all: over
 * every counted row. keep, from: as forward's. */
static void seq_forward(trainer *t, const int32_t *ids, int n, int offset, int all_rows, int grad, float *keep,
                        const float *from, double *resp, double *all) {
    int T = n - 1;
    for (int i = 0; i < T; i++) t->targets[i] = ids[i + 1], t->weight[i] = all_rows || i + 1 >= offset ? 1.0f : 0.0f;
    forward(t, ids, T, grad, keep, from);
    *resp = *all = 0;
    for (int i = 0; i < T; i++) {
        *all += t->ce[i];
        if (i + 1 >= offset) *resp += t->ce[i];
    }
}

/* Scales the current slot's dh rows (T = n - 1 of them) by the loss's gradient wrt each
 * row's cross-entropy (w_all on every row, w_resp more on the response's) and runs backward. */
static void seq_backward(trainer *t, int n, int offset, double w_all, double w_resp) {
    int64_t T = n - 1, D = t->D;
    for (int64_t i = 0; i < T; i++) {
        float w = (float)(w_all + (i + 1 >= offset ? w_resp : 0));
        for (int64_t k = 0; k < D; k++) t->dh[i * D + k] *= w;
    }
    backward(t, T);
}

static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

typedef struct pref_stats {
    double loss, reward_c, reward_r, accuracy, margin, logp_c, logp_r, nll, log_odds_ratio, log_odds_chosen;
    long long tokens;
} pref_stats;

/* One batch of bs pairs (examples idx[0..bs)): the loss (DPO: mean over pairs of
 * -log sigmoid(beta ((c - r) - (ref_c - ref_r))) with c, r the summed response log-probs;
 * ORPO: the chosen sequences' mean cross-entropy over every target token of the batch
 * minus lambda times the mean of log sigmoid(log odds ratio) of the mean response
 * log-probs) and TRL's batch metrics; with train, adds the gradients. The reference's
 * log-probs (dpo) come from the same weights with the LoRA pairs off, once per example. */
static void pref_batch(trainer *t, tr_dataset *d, const int *idx, int bs, int max_seq, int orpo, double beta,
                       int train, pref_stats *ps) {
    memset(ps, 0, sizeof *ps);
    long long nll_rows = 0;
    for (int b = 0; b < bs; b++) nll_rows += (d->ex[idx[b]].n < max_seq ? d->ex[idx[b]].n : max_seq) - 1;
    for (int b = 0; b < bs; b++) {
        tr_example *e = &d->ex[idx[b]];
        int nc = e->n < max_seq ? e->n : max_seq, nr = e->n2 < max_seq ? e->n2 : max_seq, off = e->offset;
        double rc, rr, all_c, all_r;
        /* the reference's pass (no gradient) keeps what the layers below the LoRA ones give
         * each sequence, and the adapter's passes start from it */
        float *pre_c = NULL, *pre_r = NULL;
        if (!orpo && !e->has_ref) {
            pre_c = t->prefix, pre_r = t->prefix2; /* NULL: run every layer each time */
            t->lora_off = 1;
            seq_forward(t, e->ids, nc, off, 0, 0, pre_c, NULL, &rc, &all_c);
            seq_forward(t, e->ids2, nr, off, 0, 0, pre_r, NULL, &rr, &all_r);
            t->lora_off = 0;
            e->ref_chosen = -rc, e->ref_rejected = -rr, e->has_ref = 1;
        }
        seq_forward(t, e->ids, nc, off, orpo, train, NULL, pre_c, &rc, &all_c); /* orpo's NLL counts every chosen row */
        swap_slot(t);
        seq_forward(t, e->ids2, nr, off, 0, train, NULL, pre_r, &rr, &all_r);
        ps->tokens += nc - 1 + nr - 1;
        double wc, wr, wc_all = 0, reward_c, reward_r;
        if (!orpo) {
            double lc = -rc, lr = -rr, z = beta * ((lc - lr) - (e->ref_chosen - e->ref_rejected));
            double g = beta / (1 + exp(z)) / bs; /* -dL/d(lc) = dL/d(ce of a chosen response row) */
            ps->loss += softplus(-z) / bs;
            wc = g, wr = -g;
            reward_c = beta * (lc - e->ref_chosen), reward_r = beta * (lr - e->ref_rejected);
            ps->logp_c += lc / bs, ps->logp_r += lr / bs;
        } else {
            int kc = nc - (off > 0 ? off : 1), kr = nr - (off > 0 ? off : 1); /* response rows */
            double mc = -rc / kc, mr = -rr / kr;             /* mean response log-probs */
            double oc = -expm1(mc), orr = -expm1(mr);         /* 1 - p */
            double lo = (mc - mr) - (log(oc) - log(orr)), ratio = -softplus(-lo);
            double dlo = -beta / (1 + exp(lo)) / bs;          /* dL/d(log odds) */
            ps->loss += all_c / (double)nll_rows - beta * ratio / bs;
            ps->nll += all_c / (double)nll_rows;
            ps->log_odds_ratio += ratio / bs, ps->log_odds_chosen += lo / bs;
            wc_all = 1.0 / (double)nll_rows;
            wc = -dlo / oc / kc; /* dL/dmc = dlo / (1 - p_c); dmc/dce = -1/kc */
            wr = dlo / orr / kr;  /* dL/dmr = -dlo / (1 - p_r); dmr/dce = -1/kr */
            reward_c = beta * mc, reward_r = beta * mr;
            ps->logp_c += mc / bs, ps->logp_r += mr / bs;
        }
        ps->reward_c += reward_c / bs, ps->reward_r += reward_r / bs, ps->margin += (reward_c - reward_r) / bs;
        ps->accuracy += (reward_c > reward_r) / (double)bs;
        if (train) seq_backward(t, nr, off, 0, wr);
        swap_slot(t);
        if (train) seq_backward(t, nc, off, wc_all, wc);
    }
}

static void zero_grads(trainer *t) {
    for (int l = t->first_lora; l < t->L; l++)
        for (int p = 0; p < N_P; p++) {
            tlayer *y = &t->layers[l];
            if (!trained(y, p)) continue;
            memset(y->lora[p].ga, 0, sizeof(float) * (size_t)(y->ne[p] * y->k[p] * t->r));
            memset(y->lora[p].gb, 0, sizeof(float) * (size_t)(y->ne[p] * t->r * y->n[p]));
            if (t->dora) memset(y->lora[p].gm, 0, sizeof(float) * (size_t)y->n[p]);
        }
}

/* The learning rate of update number step (from 0) as MLX's schedulers compute it in float32
 * (mlx_lm's build_schedule: a linear warmup joined before the schedule at warmup + 1). */
static float sched_lr(const hearth_train_options *o, long long step) {
    const char *n = o->lr_schedule;
    const double *a = o->lr_schedule_args;
    if (!n) return (float)o->learning_rate;
    if (o->warmup > 0) {
        if (step < o->warmup + 1) {
            long long s = step < o->warmup ? step : o->warmup;
            return (float)s * (float)((a[0] - o->warmup_init) / o->warmup) + (float)o->warmup_init;
        }
        step -= o->warmup + 1;
    }
    if (!strcmp(n, "cosine_decay")) {
        double end = o->n_lr_schedule_args > 2 ? a[2] : 0.0;
        long long s = step < (long long)a[1] ? step : (long long)a[1];
        float decay = 0.5f * (1.0f + cosf((float)(M_PI / a[1]) * (float)s));
        return (float)end + decay * (float)(a[0] - end);
    }
    if (!strcmp(n, "linear_schedule")) {
        long long s = step < (long long)a[2] ? step : (long long)a[2];
        return (float)s * (float)((a[1] - a[0]) / a[2]) + (float)a[0];
    }
    if (!strcmp(n, "exponential_decay")) return (float)a[0] * powf((float)a[1], (float)step);
    if (!strcmp(n, "step_decay") && a[2] >= 1) return (float)a[0] * powf((float)a[1], (float)(step / (long long)a[2]));
    return (float)o->learning_rate; /* not reached: train_setup refuses other names and steps */
}

/* Muon's update of one [rows, cols] tensor (MLX's Muon with its defaults: momentum 0.95,
 * Nesterov, 5 Newton-Schulz steps): g += wd p; v = 0.95 v + 0.05 g; u = 0.05 g + 0.95 v;
 * u orthogonalized the wide way round (a tall one transposed), after dividing it by its
 * Frobenius norm + 1e-7: 5 times X = a X + (b A + c A A) X with A = X X^T, (a, b, c) =
 * (3.4445, -4.7750, 2.0315); then p -= lr max(1, rows / cols)^0.5 u.
 * work: 2 rows cols + 2 min(rows, cols)^2 floats. */
static void muon_tensor(float *par, const float *g, float *v, int64_t rows, int64_t cols, float lr, float wd,
                        float *work) {
    const float mom = 0.95f, a = 3.4445f, b = -4.7750f, c = 2.0315f;
    size_t n = (size_t)(rows * cols);
    int tr = rows > cols;
    int64_t R = tr ? cols : rows, C = tr ? rows : cols;
    float *X = work, *Y = X + n, *A = Y + n, *B = A + R * R;
    float ss = 0;
    for (size_t i = 0; i < n; i++) {
        float gi = wd != 0 ? g[i] + wd * par[i] : g[i];
        v[i] = mom * v[i] + (1 - mom) * gi;
        float u = gi * (1 - mom) + v[i] * mom;
        int64_t r = (int64_t)i / cols, q = (int64_t)i % cols;
        X[tr ? q * C + r : (int64_t)i] = u;
        ss += u * u;
    }
    float inv = 1.0f / (sqrtf(ss) + 1e-7f);
    for (size_t i = 0; i < n; i++) X[i] *= inv;
    for (int step = 0; step < 5; step++) {
        for (int64_t i = 0; i < R; i++) /* A = X X^T */
            for (int64_t j = 0; j < R; j++) {
                float acc = 0;
                for (int64_t k = 0; k < C; k++) acc += X[i * C + k] * X[j * C + k];
                A[i * R + j] = acc;
            }
        for (int64_t i = 0; i < R; i++) /* B = b A + c A A */
            for (int64_t j = 0; j < R; j++) {
                float acc = 0;
                for (int64_t k = 0; k < R; k++) acc += A[i * R + k] * A[k * R + j];
                B[i * R + j] = b * A[i * R + j] + c * acc;
            }
        for (int64_t i = 0; i < R; i++) /* Y = a X + B X */
            for (int64_t j = 0; j < C; j++) {
                float acc = 0;
                for (int64_t k = 0; k < R; k++) acc += B[i * R + k] * X[k * C + j];
                Y[i * C + j] = a * X[i * C + j] + acc;
            }
        float *sw = X;
        X = Y, Y = sw;
    }
    float step_lr = lr * (rows > cols ? sqrtf((float)rows / (float)cols) : 1.0f);
    for (size_t i = 0; i < n; i++) {
        int64_t r = (int64_t)i / cols, q = (int64_t)i % cols;
        par[i] -= step_lr * X[tr ? q * C + r : (int64_t)i];
    }
}

/* Adafactor's step size at update step for the parameter par (n floats), relative and
 * scaled by the parameter (min(1e-2, step^-0.5) max(1e-3, rms(p))), and its second-moment
 * decay 1 - step^-0.8. */
static void adafactor_rates(const float *par, size_t n, long long step, float *lr_t, float *beta2) {
    float ps = 0, st = (float)step;
    for (size_t i = 0; i < n; i++) ps += par[i] * par[i];
    *lr_t = fmaxf(1e-3f, sqrtf(ps / (float)n)) * fminf(1e-2f, 1.0f / sqrtf(st));
    *beta2 = 1.0f - powf(st, -0.8f);
}

/* Adafactor's update u (in work) applied: clipped to rms 1, times lr_t, after the decay
 * p += p (-wd lr_t). */
static void adafactor_apply(float *par, const float *work, size_t n, float lr_t, float wd) {
    float us = 0;
    for (size_t i = 0; i < n; i++) us += work[i] * work[i];
    float clip = fmaxf(1.0f, sqrtf(us / (float)n));
    for (size_t i = 0; i < n; i++) {
        if (wd != 0) par[i] += par[i] * (-wd * lr_t);
        par[i] -= lr_t * (work[i] / clip);
    }
}

/* Adafactor's update of one [rows, cols] tensor (MLX's Adafactor with its defaults, as
 * mlx_lm.lora builds it: relative steps, so the learning rate is not used; parameter
 * scaling; eps 1e-30 and 1e-3; clipping at 1; decay -0.8; no first moment): at update step,
 * lr_t = min(1e-2, step^-0.5) max(1e-3, rms(p)); beta2 = 1 - step^-0.8; row / col = the
 * running means of g^2 + 1e-30 over each row / column; u = g / sqrt(row / mean(row)) /
 * sqrt(col), divided by max(1, rms(u)), times lr_t; p += p (-wd lr_t); p -= u.
 * work: rows cols floats. */
static void adafactor_tensor(float *par, const float *g, float *row, float *col, int64_t rows, int64_t cols,
                             long long step, float wd, float *work) {
    size_t n = (size_t)(rows * cols);
    float lr_t, beta2;
    adafactor_rates(par, n, step, &lr_t, &beta2);
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0;
        for (int64_t q = 0; q < cols; q++) acc += g[r * cols + q] * g[r * cols + q] + 1e-30f;
        row[r] = beta2 * row[r] + (1 - beta2) * (acc / (float)cols);
    }
    for (int64_t q = 0; q < cols; q++) {
        float acc = 0;
        for (int64_t r = 0; r < rows; r++) acc += g[r * cols + q] * g[r * cols + q] + 1e-30f;
        col[q] = beta2 * col[q] + (1 - beta2) * (acc / (float)rows);
    }
    float rm = 0;
    for (int64_t r = 0; r < rows; r++) rm += row[r];
    rm /= (float)rows;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t q = 0; q < cols; q++)
            work[r * cols + q] = (1.0f / sqrtf(row[r] / rm)) * (1.0f / sqrtf(col[q])) * g[r * cols + q];
    adafactor_apply(par, work, n, lr_t, wd);
}

/* Muon and Adafactor on a vector (DoRA's m), as MLX treats a 1-D parameter: Muon's
 * momentum update without the orthogonalization; Adafactor's unfactored second moment. */
static void muon_vector(float *par, const float *g, float *v, size_t n, float lr, float wd) {
    const float mom = 0.95f;
    for (size_t i = 0; i < n; i++) {
        float gi = wd != 0 ? g[i] + wd * par[i] : g[i];
        v[i] = mom * v[i] + (1 - mom) * gi;
        par[i] -= lr * (gi * (1 - mom) + v[i] * mom);
    }
}

static void adafactor_vector(float *par, const float *g, float *sq, size_t n, long long step, float wd, float *work) {
    float lr_t, beta2;
    adafactor_rates(par, n, step, &lr_t, &beta2);
    for (size_t i = 0; i < n; i++) {
        sq[i] = beta2 * sq[i] + (1 - beta2) * (g[i] * g[i] + 1e-30f);
        work[i] = g[i] / sqrtf(sq[i]);
    }
    adafactor_apply(par, work, n, lr_t, wd);
}

/* One update with the accumulated gradients divided by accum (mlx-lm's gradient
 * accumulation), as MLX's optimizers compute it in float32 (no bias correction):
 * Adam: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr m / (sqrt(v) + eps);
 * AdamW: p *= 1 - lr wd first; SGD: p -= lr (g + wd p) (wd term only when wd != 0);
 * Muon: muon_tensor; Adafactor: adafactor_tensor. step: the update's number from 1. */
static void opt_step(trainer *t, float lr, int accum, long long step) {
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = t->weight_decay, keep = 1.0f - lr * wd;
    size_t off = 0;
    for (int l = t->first_lora; l < t->L; l++)
        for (int p = 0; p < N_P; p++) {
            tlayer *y = &t->layers[l];
            for (int64_t e = 0; trained(y, p) && e < y->ne[p]; e++) { /* each expert's pair as a projection's */
                tr_lora lo = expert_lora(y, p, e);
                /* A, B, and DoRA's m (a vector) */
                float *par[3] = {lo.a, lo.b, lo.m}, *g[3] = {lo.ga, lo.gb, lo.gm};
                size_t n[3] = {(size_t)(y->k[p] * t->r), (size_t)(t->r * y->n[p]), (size_t)y->n[p]};
                int64_t rows[2] = {y->k[p], t->r}, cols[2] = {t->r, y->n[p]};
                for (int j = 0; j < (t->dora ? 3 : 2); j++) {
                    if (accum > 1)
                        for (size_t i = 0; i < n[j]; i++) g[j][i] /= (float)accum;
                    if (j == 2 && (t->opt == OPT_MUON || t->opt == OPT_ADAFACTOR)) {
                        if (t->opt == OPT_MUON)
                            muon_vector(par[j], g[j], t->adam_m + off, n[j], lr, wd);
                        else
                            adafactor_vector(par[j], g[j], t->adam_m + off, n[j], step, wd, t->opt_work);
                        off += n[j];
                        continue;
                    }
                    if (t->opt == OPT_MUON || t->opt == OPT_ADAFACTOR) {
                        if (t->opt == OPT_MUON)
                            muon_tensor(par[j], g[j], t->adam_m + off, rows[j], cols[j], lr, wd, t->opt_work);
                        else
                            adafactor_tensor(par[j], g[j], t->adam_m + off, t->adam_v + off, rows[j], cols[j], step, wd,
                                             t->opt_work);
                        off += n[j];
                        continue;
                    }
                    if (t->opt == OPT_SGD) {
                        for (size_t i = 0; i < n[j]; i++)
                            par[j][i] -= lr * (wd != 0 ? g[j][i] + wd * par[j][i] : g[j][i]);
                        continue;
                    }
                    float *m = t->adam_m + off, *v = t->adam_v + off;
                    for (size_t i = 0; i < n[j]; i++) {
                        m[i] = b1 * m[i] + (1 - b1) * g[j][i];
                        v[i] = b2 * v[i] + (1 - b2) * g[j][i] * g[j][i];
                        if (t->opt == OPT_ADAMW) par[j][i] *= keep;
                        par[j][i] -= lr * m[i] / (sqrtf(v[i]) + eps);
                    }
                    off += n[j];
                }
            }
        }
}

/* The trained pairs in one of two layouts: MLX's (mlx-lm's names, A [in, rank], B [rank, out],
 * as hearth trains them) or PEFT's (save_pretrained's names under "base_model.model.",
 * lora_A.weight [rank, in] and lora_B.weight [out, rank]: each transposed on the way out).
 * Either way B's columns (PEFT: rows) are in HF order. */
static hearth_status save_adapters(trainer *t, const char *path, int peft, hearth_error *err) {
    int per = t->dora ? 3 : 2, n = 0; /* A, B (and DoRA's m) per projection */
    for (int l = t->first_lora; l < t->L; l++)
        for (int p = 0; p < N_P; p++) n += trained(&t->layers[l], p) && !(peft && is_expert(p)) ? per : 0;
    st_out_tensor *h = calloc((size_t)n ? (size_t)n : 1, sizeof *h);
    char (*names)[160] = calloc((size_t)n, 160);
    const float **data = calloc((size_t)n, sizeof *data);
    float *tmp = NULL, *tmp2 = NULL;
    if (!h || !names || !data) return free(h), free(names), free(data), err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    int i = 0;
    int *proj = calloc((size_t)n + 1, sizeof *proj); /* each tensor's projection */
    if (!proj) return free(h), free(names), free(data), err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int l = t->first_lora; l < t->L; l++)
        for (int p = 0; p < N_P; p++)
            for (int b = 0; b < per && trained(&t->layers[l], p) && !(peft && is_expert(p)); b++, i++) {
                tlayer *y = &t->layers[l];
                proj[i] = p;
                if (b == 2) { /* m [N]: MLX's DoRALinear.m, PEFT's lora_magnitude_vector */
                    if (peft)
                        snprintf(names[i], 160, "%slayers.%d.%s.lora_magnitude_vector.weight", peft_prefix(t), l,
                                 pname(t, p));
                    else
                        snprintf(names[i], 160, "%slayers.%d.%s.m", mlx_prefix(t), l, pname(t, p));
                    h[i] = (st_out_tensor){.name = names[i], .dtype = DT_F32, .ndim = 1, .shape = {y->n[p]}};
                    data[i] = y->lora[p].m;
                    continue;
                }
                int64_t rows = b ? t->r : y->k[p], cols = b ? y->n[p] : t->r; /* hearth's layout */
                if (peft)
                    snprintf(names[i], 160, "%slayers.%d.%s.lora_%c.weight", peft_prefix(t), l, pname(t, p),
                             b ? 'B' : 'A');
                else
                    lora_tensor_name(t, names[i], 160, l, p, b);
                h[i] = (st_out_tensor){.name = names[i], .dtype = DT_F32, .ndim = 2,
                                       .shape = {peft ? cols : rows, peft ? rows : cols}};
                if (is_expert(p)) /* mlx-lm's LoRASwitchLinear: lora_a [E, r, in], lora_b [E, out, r] */
                    h[i] =
                        (st_out_tensor){.name = names[i], .dtype = DT_F32, .ndim = 3, .shape = {y->ne[p], cols, rows}};
                data[i] = b ? y->lora[p].b : y->lora[p].a;
            }
    FILE *f = fopen(path, "wb");
    uint64_t bytes = 0;
    hearth_status st = f ? st_write_header(f, path, h, (size_t)n, &bytes, err)
                         : err_set(err, HEARTH_ERR_IO, "%s: %s", path, strerror(errno));
    for (i = 0; !st && i < n; i++) {
        int p = proj[i], part = i % per;
        const float *d = data[i];
        free(tmp), free(tmp2);
        tmp = tmp2 = NULL;
        if (part == 2) { /* a vector in the base's output order: as B's columns, permuted where they are */
            int64_t N = h[i].shape[0];
            if (permuted(t, p)) {
                if (!(tmp = malloc(sizeof(float) * (size_t)N))) {
                    st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                    break;
                }
                permute_b(d, tmp, 1, N, heads_of(t, p), 1);
                d = tmp;
            }
            if (fwrite(d, 1, st_out_nbytes(&h[i]), f) != st_out_nbytes(&h[i]))
                st = err_set(err, HEARTH_ERR_IO, "%s: write failed", path);
            continue;
        }
        if (is_expert(p)) { /* each expert's block transposed */
            int64_t E = h[i].shape[0], rows = h[i].shape[2], cols = h[i].shape[1];
            if (!(tmp = malloc(st_out_nbytes(&h[i])))) {
                st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                break;
            }
            for (int64_t e = 0; e < E; e++)
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++) tmp[(e * cols + c) * rows + r] = d[(e * rows + r) * cols + c];
            if (fwrite(tmp, 1, st_out_nbytes(&h[i]), f) != st_out_nbytes(&h[i]))
                st = err_set(err, HEARTH_ERR_IO, "%s: write failed", path);
            continue;
        }
        int64_t rows = peft ? h[i].shape[1] : h[i].shape[0], cols = peft ? h[i].shape[0] : h[i].shape[1];
        if ((part == 1 && permuted(t, p)) || peft) {
            if (!(tmp = malloc(st_out_nbytes(&h[i]))) || (peft && !(tmp2 = malloc(st_out_nbytes(&h[i]))))) {
                st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
                break;
            }
        }
        if (part == 1 && permuted(t, p)) {
            permute_b(d, tmp, t->r, cols, heads_of(t, p), 1);
            d = tmp;
        }
        if (peft) {
            float *o = d == tmp ? tmp2 : tmp;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) o[c * rows + r] = d[r * cols + c];
            d = o;
        }
        if (fwrite(d, 1, st_out_nbytes(&h[i]), f) != st_out_nbytes(&h[i]))
            st = err_set(err, HEARTH_ERR_IO, "%s: write failed", path);
    }
    free(tmp), free(tmp2), free(proj);
    if (f && fclose(f) && !st) st = err_set(err, HEARTH_ERR_IO, "%s: write failed", path);
    free(h), free(names), free(data);
    return st;
}

/* PEFT's adapter_config.json for the same pairs: lora_alpha = scale * r, so PEFT's scaling
 * alpha / r is hearth's scale; layers_to_transform when only the last layers are trained. */
static hearth_status write_peft_config(const trainer *t, const char *model, double scale, const char *dir,
                                       hearth_error *err) {
    /* the projections trained (their last name part), sorted, as a set's list */
    static const int sorted[] = {P_DOWN, P_GATE, P_GA,  P_GB,  P_GQKV, P_GZ, P_K,
                                 P_O,    P_GOUT, P_PLG, P_PLP, P_Q,    P_UP, P_V};
    json_t *j = json_object(), *tm = json_array(), *layers = json_null();
    if (!j || !tm) return json_decref(j), json_decref(tm), err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    for (int i = 0; i < (int)(sizeof sorted / sizeof *sorted); i++) {
        int p = sorted[i], any = 0;
        for (int l = t->first_lora; l < t->L; l++) any |= trained(&t->layers[l], p);
        const char *dot = strrchr(pname(t, p), '.');
        if (any) json_array_append_new(tm, json_string(dot ? dot + 1 : pname(t, p)));
    }
    if (t->first_lora > 0) {
        layers = json_array();
        for (int l = t->first_lora; l < t->L; l++) json_array_append_new(layers, json_integer(l));
    }
    double alpha = scale * t->r; /* the flag's double: alpha / r rounds to the float32 scale trained with */
    json_object_set_new(j, "peft_type", json_string("LORA"));
    json_object_set_new(j, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(j, "base_model_name_or_path", json_string(model));
    json_object_set_new(j, "r", json_integer(t->r));
    json_object_set_new(j, "lora_alpha", alpha == floor(alpha) && fabs(alpha) < 1e15 ? json_integer((json_int_t)alpha)
                                                                                      : json_real(alpha));
    json_object_set_new(j, "lora_dropout", json_real(0.0));
    json_object_set_new(j, "target_modules", tm);
    json_object_set_new(j, "layers_to_transform", layers);
    json_object_set_new(j, "layers_pattern", t->first_lora > 0 ? json_string("layers") : json_null());
    json_object_set_new(j, "fan_in_fan_out", json_false());
    json_object_set_new(j, "bias", json_string("none"));
    json_object_set_new(j, "use_rslora", json_false());
    json_object_set_new(j, "use_dora", json_boolean(t->dora));
    json_object_set_new(j, "inference_mode", json_true());
    json_object_set_new(j, "init_lora_weights", json_true());
    json_object_set_new(j, "modules_to_save", json_null());
    json_object_set_new(j, "rank_pattern", json_object());
    json_object_set_new(j, "alpha_pattern", json_object());
    json_object_set_new(j, "revision", json_null());
    char path[4096 + 32]; /* dir is a 4096-byte path of save_all */
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int bad = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    return bad ? err_set(err, HEARTH_ERR_IO, "%s: could not write", path) : HEARTH_OK;
}

/* The adapter in both formats: <dir>/adapters.safetensors (MLX) and <dir>/peft/ (PEFT's
 * adapter_model.safetensors and its adapter_config.json: PEFT and MLX both name their
 * config adapter_config.json, so PEFT's gets a folder of its own). */
static hearth_status save_all(trainer *t, const char *model, double scale, const char *dir, hearth_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapters.safetensors", dir);
    hearth_status st = save_adapters(t, path, 0, err);
    if (!st && t->moe_lora)
        return HEARTH_OK; /* PEFT has no layout for the routed experts' pairs (train_setup says so) */
    snprintf(path, sizeof path, "%s/peft", dir);
    if (!st && mkdir(path, 0777) && errno != EEXIST) st = err_set(err, HEARTH_ERR_IO, "%s: %s", path, strerror(errno));
    if (!st) st = write_peft_config(t, model, scale, path, err);
    snprintf(path, sizeof path, "%s/peft/adapter_model.safetensors", dir);
    return st ? st : save_adapters(t, path, 1, err);
}

static json_t *keys_json(const hearth_train_options *o) {
    json_t *a = json_array();
    for (int i = 0; a && i < o->n_lora_keys; i++) json_array_append_new(a, json_string(o->lora_keys[i]));
    return a;
}

/* The run's settings as mlx_lm.lora's adapter_config.json has them (NULL: out of memory). */
static json_t *config_json(const char *model, const hearth_train_options *o, const char *dir) {
    json_t *j = json_pack(
        "{s:s,s:s?,s:s,s:b,s:s,s:s,s:i,s:i,s:i,s:f,s:{s:i,s:f,s:f},s:b,s:i,s:i,s:i,s:i,s:i,s:i,s:I,"
        "s:b,s:i,s:b}",
        "model", model, "data", o->data, "adapter_path", dir, "train", 1, "fine_tune_type", o->dora ? "dora" : "lora",
        "optimizer", o->optimizer, "num_layers", o->num_layers, "batch_size", o->batch_size, "iters", o->iters,
        "learning_rate", o->learning_rate, "lora_parameters", "rank", o->lora_rank, "dropout", 0.0, "scale",
        o->lora_scale, "mask_prompt", o->mask_prompt, "max_seq_length", o->max_seq_length, "steps_per_report",
        o->steps_per_report, "steps_per_eval", o->steps_per_eval, "save_every", o->save_every, "val_batches",
        o->val_batches, "grad_accumulation_steps", o->grad_accumulation_steps, "seed", (json_int_t)o->seed,
        "grad_checkpoint", o->grad_checkpoint != 0, "test_batches", 500, "test", 0);
    if (!j) return NULL;
    if (o->n_lora_keys) json_object_set_new(json_object_get(j, "lora_parameters"), "keys", keys_json(o));
    json_object_set_new(j, "resume_adapter_file",
                        o->resume_adapter_file ? json_string(o->resume_adapter_file) : json_null());
    json_object_set_new(j, "method", json_string(o->method ? o->method : "sft"));
    if (o->lr_schedule) { /* mlx-lm's lr_schedule */
        json_t *args = json_array();
        for (int i = 0; i < o->n_lr_schedule_args; i++) json_array_append_new(args, json_real(o->lr_schedule_args[i]));
        json_t *ls = json_pack("{s:s,s:o}", "name", o->lr_schedule, "arguments", args);
        if (ls && o->warmup > 0) {
            json_object_set_new(ls, "warmup", json_integer(o->warmup));
            json_object_set_new(ls, "warmup_init", json_real(o->warmup_init));
        }
        if (ls) json_object_set_new(j, "lr_schedule", ls);
    }
    if (o->weight_decay > 0) /* mlx-lm's optimizer_config, for the optimizer in use */
        json_object_set_new(j, "optimizer_config",
                            json_pack("{s:{s:f}}", o->optimizer, "weight_decay", o->weight_decay));
    if (o->method && !strcmp(o->method, "dpo")) json_object_set_new(j, "beta", json_real(o->beta));
    if (o->method && !strcmp(o->method, "orpo")) json_object_set_new(j, "lambda", json_real(o->orpo_lambda));
    return j;
}

static hearth_status write_config(const char *model, const hearth_train_options *o, const char *dir,
                                  hearth_error *err) {
    json_t *j = config_json(model, o, dir);
    if (!j) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int bad = json_dump_file(j, path, JSON_INDENT(4) | JSON_SORT_KEYS);
    json_decref(j);
    return bad ? err_set(err, HEARTH_ERR_IO, "%s: could not write", path) : HEARTH_OK;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void emit(FILE *metrics, const hearth_train_options *o, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s) {
        fprintf(metrics, "%s\n", s);
        fflush(metrics);
        if (o->on_metrics) o->on_metrics(o->ctx, s);
    }
    free(s);
    json_decref(j);
}

void hearth_train_defaults(hearth_train_options *o) {
    *o = (hearth_train_options){.adapter_path = "adapters",
                                .num_layers = 16,
                                .steps_per_report = 10,
                                .steps_per_eval = 200,
                                .save_every = 100,
                                .val_batches = 25,
                                .learning_rate = -1,
                                .lora_scale = -1,
                                .beta = 0.1,
                                .orpo_lambda = 0.1,
                                .seed = 0,
                                .weight_decay = -1,
                                .grad_accumulation_steps = 1};
}

/* The method's defaults for what o leaves unset (hearth_train_defaults). */
static void resolve_defaults(hearth_train_options *o, int pref, int orpo) {
    if (!o->iters) o->iters = pref ? 100 : 1000;
    if (!o->batch_size) o->batch_size = pref ? 1 : 4;
    if (!o->lora_rank) o->lora_rank = orpo ? 16 : 8;
    if (!o->max_seq_length) o->max_seq_length = pref ? 4096 : 2048;
    if (o->learning_rate < 0) o->learning_rate = !pref ? 1e-5 : orpo ? 1e-5 : 5e-5;
    if (o->lora_scale < 0) o->lora_scale = !pref ? 20.0 : orpo ? 2.0 : 1.0;
}

static double val_loss(trainer *t, const tr_dataset *vd, const int *vidx, int n_vb, tr_mt *rng,
                       const hearth_train_options *o, int *perm) {
    tr_mt_permutation(rng, perm, n_vb); /* mlx-lm's evaluate draws from the same generator */
    int nb = o->val_batches < 0 || o->val_batches > n_vb ? n_vb : o->val_batches;
    double sum = 0;
    long long toks = 0;
    for (int b = 0; b < nb; b++) {
        long long nt;
        double l = run_batch(t, vd, vidx + perm[b] * o->batch_size, o->batch_size, o->max_seq_length, 0, &nt);
        sum += l * (double)nt, toks += nt;
    }
    return toks ? sum / (double)toks : 0;
}

/* the preference methods' validation loss: the mean of the batches' losses, the batches
 * drawn as for sft */
static double pref_val_loss(trainer *t, tr_dataset *vd, const int *vidx, int n_vb, tr_mt *rng,
                            const hearth_train_options *o, int orpo, double beta, int *perm) {
    tr_mt_permutation(rng, perm, n_vb);
    int nb = o->val_batches < 0 || o->val_batches > n_vb ? n_vb : o->val_batches;
    double sum = 0;
    for (int b = 0; b < nb; b++) {
        pref_stats ps;
        pref_batch(t, vd, vidx + perm[b] * o->batch_size, o->batch_size, o->max_seq_length, orpo, beta, 0, &ps);
        sum += ps.loss;
    }
    return nb ? sum / nb : 0;
}

/* every pair keeps at least one response token within max_seq tokens */
static hearth_status check_pairs(const tr_dataset *d, int max_seq, const char *path, hearth_error *err) {
    for (int i = 0; i < d->n; i++) {
        const tr_example *e = &d->ex[i];
        int first = e->offset > 0 ? e->offset : 1;
        if ((e->n < max_seq ? e->n : max_seq) <= first || (e->n2 < max_seq ? e->n2 : max_seq) <= first)
            return err_set(err, HEARTH_ERR_INVALID, "%s:%d: no response token%s (the prompt has %d tokens)", path,
                           i + 1, e->n > max_seq || e->n2 > max_seq ? " within --max-seq-length" : "", e->offset);
    }
    return HEARTH_OK;
}

/* What hearth_train and hearth_train_fit share before the trainer exists: the method
 * checked, the model opened (t->hm), train.jsonl and valid.jsonl read when o->data is set
 * (required when need_data), the method resolved from the data (sft without data), the
 * defaults filled in and checked, preference pairs checked, and *longest: the sequence
 * length the trainer is sized for (the longest example or response, cut to max_seq_length;
 * without data, max_seq_length). */
static hearth_status train_setup(const char *model_name, hearth_train_options *o, int need_data, trainer *t,
                                 tr_dataset *td, tr_dataset *vd, int *longest, hearth_error *err) {
    const char *method = o->method;
    if (method && strcmp(method, "sft") && strcmp(method, "dpo") && strcmp(method, "orpo"))
        return err_set(err, HEARTH_ERR_INVALID, "--method %s: unknown (sft, dpo or orpo)", method);
    if (need_data && !o->data) return err_set(err, HEARTH_ERR_INVALID, "need --data <dir> (with train.jsonl)");
    char path[4096];
    hearth_status st = hearth_model_open(model_name, &t->hm, err);
    if (!st && o->data) {
        snprintf(path, sizeof path, "%s/train.jsonl", o->data);
        st = tr_dataset_load(t->hm, path, 0, o->mask_prompt, td, err);
    }
    if (!st && o->data) {
        snprintf(path, sizeof path, "%s/valid.jsonl", o->data);
        st = tr_dataset_load(t->hm, path, 1, o->mask_prompt, vd, err);
    }
    if (!st && !method) method = td->pref ? "orpo" : "sft";
    int pref = method && strcmp(method, "sft"), orpo = method && !strcmp(method, "orpo");
    if (!st && o->data && pref != td->pref)
        st = err_set(err, HEARTH_ERR_INVALID,
                     pref ? "--method %s needs preference data: %s/train.jsonl lines with \"prompt\", \"chosen\" and "
                            "\"rejected\""
                          : "--method %s trains on \"text\", \"prompt\"/\"completion\" or \"messages\" data; "
                            "%s/train.jsonl holds preference pairs (--method dpo or orpo)",
                     method, o->data);
    if (!st && vd->n && vd->pref != td->pref)
        st = err_set(err, HEARTH_ERR_INVALID, "%s/valid.jsonl and train.jsonl are not in the same kind of format",
                     o->data);
    if (!st) o->method = method;
    resolve_defaults(o, pref, orpo);
    const char *opt = o->optimizer ? o->optimizer : "adam";
    t->opt = !strcmp(opt, "adamw")       ? OPT_ADAMW
             : !strcmp(opt, "sgd")       ? OPT_SGD
             : !strcmp(opt, "muon")      ? OPT_MUON
             : !strcmp(opt, "adafactor") ? OPT_ADAFACTOR
                                         : OPT_ADAM;
    if (!st && strcmp(opt, "adam") && strcmp(opt, "adamw") && strcmp(opt, "sgd") && strcmp(opt, "muon") &&
        strcmp(opt, "adafactor"))
        st = err_set(err, HEARTH_ERR_INVALID, "--optimizer %s: unknown (adam, adamw, sgd, muon or adafactor)", opt);
    o->optimizer = opt;
    if (o->weight_decay < 0) o->weight_decay = t->opt == OPT_ADAMW || t->opt == OPT_MUON ? 0.01 : 0.0;
    t->weight_decay = (float)o->weight_decay;
    if (o->grad_accumulation_steps == 0) o->grad_accumulation_steps = 1;
    if (!st && o->lr_schedule) {
        static const struct {
            const char *name;
            int lo, hi;
        } sch[] = {
            {"cosine_decay", 2, 3}, {"linear_schedule", 3, 3}, {"exponential_decay", 2, 2}, {"step_decay", 3, 3}};
        int k = -1, n = o->n_lr_schedule_args;
        for (int i = 0; i < 4; i++)
            if (!strcmp(o->lr_schedule, sch[i].name)) k = i;
        const double *a = o->lr_schedule_args;
        if (k < 0)
            st = err_set(err, HEARTH_ERR_INVALID,
                         "--lr-schedule %s: unknown (cosine_decay, linear_schedule, exponential_decay or step_decay)",
                         o->lr_schedule);
        else if (n < sch[k].lo || n > sch[k].hi)
            st = err_set(err, HEARTH_ERR_INVALID, "--lr-schedule %s takes %d%s values (--lr-schedule-args), got %d",
                         sch[k].name, sch[k].lo, sch[k].hi > sch[k].lo ? " or 3" : "", n);
        else if ((k == 0 && !(a[1] >= 1 && a[1] <= 1e12)) || ((k == 1 || k == 3) && !(a[2] >= 1 && a[2] <= 1e12)))
            st = err_set(err, HEARTH_ERR_INVALID,
                         "--lr-schedule %s: its step count must be at least 1 (and at most 1e12)", sch[k].name);
        else if (o->warmup < 0 || !(o->warmup_init >= 0))
            st = err_set(err, HEARTH_ERR_INVALID, "--warmup and --warmup-init must be non-negative");
        else
            o->learning_rate = a[0]; /* the schedule's init (adapter_config.json's learning_rate) */
    }
    t->ckpt = o->grad_checkpoint != 0;
    if (!st && (o->grad_accumulation_steps < 1 || !(o->weight_decay >= 0)))
        st = err_set(err, HEARTH_ERR_INVALID,
                     "--grad-accumulation-steps must be at least 1 and --weight-decay "
                     "non-negative");
    if (!st && (!(o->beta >= 0) || !(o->orpo_lambda >= 0)))
        st = err_set(err, HEARTH_ERR_INVALID, "--beta and --lambda must be non-negative numbers");
    if (!st && (o->iters < 1 || o->batch_size < 1 || o->lora_rank < 1 || o->max_seq_length < 2 || o->steps_per_report < 1 ||
        o->save_every < 1 || o->steps_per_eval < 1 || o->num_layers == 0 || o->num_layers < -1 ||
        !(o->learning_rate >= 0)))
        st = err_set(err, HEARTH_ERR_INVALID,
                     "--iters, --batch-size, --lora-rank, --steps-per-report, --steps-per-eval and --save-every "
                     "must be at least 1, --max-seq-length at least 2, --num-layers positive or -1");
    if (!st && pref && o->data) {
        snprintf(path, sizeof path, "%s/train.jsonl", o->data);
        st = check_pairs(td, o->max_seq_length, path, err);
        snprintf(path, sizeof path, "%s/valid.jsonl", o->data);
        if (!st) st = check_pairs(vd, o->max_seq_length, path, err);
    }
    int n = 0, n2 = 0;
    for (int i = 0; i < td->n; i++) n = td->ex[i].n > n ? td->ex[i].n : n;
    for (int i = 0; i < vd->n; i++) n = vd->ex[i].n > n ? vd->ex[i].n : n;
    for (int i = 0; pref && i < td->n; i++) n2 = td->ex[i].n2 > n2 ? td->ex[i].n2 : n2;
    for (int i = 0; pref && i < vd->n; i++) n2 = vd->ex[i].n2 > n2 ? vd->ex[i].n2 : n2;
    t->pref = pref, t->dpo = pref && !orpo;
    t->T1 = !o->data || n > o->max_seq_length ? o->max_seq_length : n;
    t->T2 = !o->data || n2 > o->max_seq_length ? o->max_seq_length : n2;
    n = n2 > n ? n2 : n;
    *longest = !o->data || n > o->max_seq_length ? o->max_seq_length : n;
    return st;
}

/* ---- --resume: the whole training state at a step (resume.bin in the adapter folder) ----
 * "HEARTH-TRAIN-RESUME-1\n", a JSON line (the step, the settings that must match, sizes),
 * then raw: the data-order generator, the epoch's permutation, every LoRA tensor and its
 * gradient (layer and projection order: A, B, dA, dB) and the optimizer's two moments. */
_Static_assert(offsetof(pref_stats, tokens) == 10 * sizeof(double), "pref_stats starts with the ten sums");

typedef struct resume_point {
    int it, pos;
    long long updates, n_tokens, trained;
    double losses;
    int steps;
    double pref[10]; /* dpo / orpo: the report window's sums (pref_stats' first ten) */
} resume_point;

static json_t *resume_settings(const char *model, const hearth_train_options *o) {
    return json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:f,s:I,s:s,s:i,s:f,s:b}", "model", model, "data", o->data, "method",
                     o->method, "lora_rank", o->lora_rank, "num_layers", o->num_layers, "batch_size", o->batch_size,
                     "max_seq_length", o->max_seq_length, "lora_scale", o->lora_scale, "seed", (json_int_t)o->seed,
                     "optimizer", o->optimizer, "grad_accumulation_steps", o->grad_accumulation_steps, "weight_decay",
                     o->weight_decay, "mask_prompt", o->mask_prompt);
}

/* resume_settings, with DoRA named when it is on (files of LoRA runs stay as they were) */
static json_t *resume_settings_of(const char *model, const hearth_train_options *o) {
    json_t *j = resume_settings(model, o);
    if (j && o->dora) json_object_set_new(j, "fine_tune_type", json_string("dora"));
    if (j && o->n_lora_keys) json_object_set_new(j, "keys", keys_json(o));
    return j;
}

/* Each tensor of the state in order: f(ctx, pointer, bytes). */
static int resume_walk(trainer *t, tr_mt *rng, int *perm, int nb, int (*f)(void *, void *, size_t), void *ctx) {
    int bad = f(ctx, rng, sizeof *rng) || f(ctx, perm, sizeof(int) * (size_t)nb);
    for (int l = t->first_lora; !bad && l < t->L; l++)
        for (int p = 0; !bad && p < N_P; p++) {
            tlayer *y = &t->layers[l];
            if (!trained(y, p)) continue;
            size_t na = sizeof(float) * (size_t)(y->ne[p] * y->k[p] * t->r),
                   nb2 = sizeof(float) * (size_t)(y->ne[p] * t->r * y->n[p]);
            bad = f(ctx, y->lora[p].a, na) || f(ctx, y->lora[p].b, nb2) || f(ctx, y->lora[p].ga, na) ||
                  f(ctx, y->lora[p].gb, nb2);
            if (!bad && t->dora)
                bad = f(ctx, y->lora[p].m, sizeof(float) * (size_t)y->n[p]) ||
                      f(ctx, y->lora[p].gm, sizeof(float) * (size_t)y->n[p]);
        }
    if (!bad && t->opt != OPT_SGD)
        bad = f(ctx, t->adam_m, sizeof(float) * t->n_params) || f(ctx, t->adam_v, sizeof(float) * t->n_params);
    return bad;
}
static int write_part(void *f, void *p, size_t n) { return fwrite(p, 1, n, f) != n; }
static int read_part(void *f, void *p, size_t n) { return fread(p, 1, n, f) != n; }

static const char resume_magic[] = "HEARTH-TRAIN-RESUME-1\n";

/* Written to resume.bin.tmp, then renamed: a run stopped while writing keeps the last one. */
static hearth_status resume_save(trainer *t, const char *model, const hearth_train_options *o, const char *dir,
                                 const resume_point *rp, tr_mt *rng, int *perm, int nb, hearth_error *err) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/resume.bin", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_t *j = json_pack("{s:i,s:i,s:I,s:I,s:I,s:f,s:i,s:i,s:I,s:o}", "step", rp->it, "pos", rp->pos, "updates",
                          (json_int_t)rp->updates, "n_tokens", (json_int_t)rp->n_tokens, "trained",
                          (json_int_t)rp->trained, "losses", rp->losses, "steps", rp->steps, "batches", nb,
                          "parameters", (json_int_t)t->n_params, "settings", resume_settings_of(model, o));
    json_t *pr = json_array();
    for (int i = 0; i < 10; i++) json_array_append_new(pr, json_real(rp->pref[i]));
    if (j)
        json_object_set_new(j, "pref", pr);
    else
        json_decref(pr);
    char *line = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(j);
    FILE *f = line ? fopen(tmp, "wb") : NULL;
    int bad = !f || fputs(resume_magic, f) < 0 || fprintf(f, "%s\n", line) < 0 ||
              resume_walk(t, rng, perm, nb, write_part, f);
    free(line);
    if (f && fclose(f)) bad = 1;
    if (bad || rename(tmp, path)) {
        remove(tmp);
        return err_set(err, HEARTH_ERR_IO, "%s: could not write the resume state", path);
    }
    return HEARTH_OK;
}

static hearth_status resume_load(trainer *t, const char *model, const hearth_train_options *o, const char *dir,
                                 resume_point *rp, tr_mt *rng, int *perm, int nb, hearth_error *err) {
    char path[4096], head[sizeof resume_magic], line[65536];
    snprintf(path, sizeof path, "%s/resume.bin", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(err, HEARTH_ERR_IO, "--resume: %s: %s (a run writes it with each checkpoint)", path,
                       strerror(errno));
    hearth_status st = HEARTH_OK;
    json_t *j = NULL;
    if (!fgets(head, sizeof head, f) || strcmp(head, resume_magic) || !fgets(line, sizeof line, f) ||
        !(j = json_loads(line, 0, NULL)))
        st = err_set(err, HEARTH_ERR_FORMAT, "--resume: %s: not a hearth train resume file", path);
    json_t *want = st ? NULL : resume_settings_of(model, o), *have = j ? json_object_get(j, "settings") : NULL;
    const char *key;
    json_t *v;
    json_object_foreach(want, key, v) {
        json_t *h = json_object_get(have, key);
        if (!st && !json_equal(h, v)) {
            char *a = json_dumps(v, JSON_ENCODE_ANY), *b = h ? json_dumps(h, JSON_ENCODE_ANY) : NULL;
            st = err_set(err, HEARTH_ERR_INVALID, "--resume: %s was written with %s %s, this run has %s", path, key,
                         b ? b : "(none)", a ? a : "?");
            free(a), free(b);
        }
    }
    json_object_foreach(have, key, v) { /* a setting the file names and this run leaves out (DoRA) */
        if (!st && json_is_object(want) && !json_object_get(want, key)) {
            char *b = json_dumps(v, JSON_ENCODE_ANY);
            st = err_set(err, HEARTH_ERR_INVALID, "--resume: %s was written with %s %s, this run has none", path, key,
                         b ? b : "?");
            free(b);
        }
    }
    json_decref(want);
    if (!st) {
        *rp = (resume_point){.it = (int)json_integer_value(json_object_get(j, "step")),
                             .pos = (int)json_integer_value(json_object_get(j, "pos")),
                             .updates = json_integer_value(json_object_get(j, "updates")),
                             .n_tokens = json_integer_value(json_object_get(j, "n_tokens")),
                             .trained = json_integer_value(json_object_get(j, "trained")),
                             .losses = json_real_value(json_object_get(j, "losses")),
                             .steps = (int)json_integer_value(json_object_get(j, "steps"))};
        for (int i = 0; i < 10; i++)
            rp->pref[i] = json_real_value(json_array_get(json_object_get(j, "pref"), (size_t)i));
        if (json_integer_value(json_object_get(j, "batches")) != nb ||
            json_integer_value(json_object_get(j, "parameters")) != (json_int_t)t->n_params || rp->pos < 0 ||
            rp->pos > nb || rp->it < 0)
            st = err_set(err, HEARTH_ERR_INVALID, "--resume: %s: the data or the adapter's shapes changed", path);
        else if (rp->it >= o->iters)
            st = err_set(err, HEARTH_ERR_INVALID, "--resume: %s is at step %d already: ask for more --iters", path,
                         rp->it);
    }
    if (!st && resume_walk(t, rng, perm, nb, read_part, f))
        st = err_set(err, HEARTH_ERR_FORMAT, "--resume: %s: cut short", path);
    int ok = !st && rng->i >= 0 && rng->i <= 624; /* what the generator and the batch order index with */
    for (int i = 0; ok && i < nb; i++) ok = perm[i] >= 0 && perm[i] < nb;
    if (!st && !ok) st = err_set(err, HEARTH_ERR_FORMAT, "--resume: %s: damaged (data order out of range)", path);
    json_decref(j);
    fclose(f);
    return st;
}

hearth_status hearth_train(const char *model_name, const hearth_train_options *opts, hearth_error *err) {
    hearth_train_options ro = *opts, *o = &ro;
    trainer t = {0};
    tr_dataset td = {0}, vd = {0};
    char path[4096];
    int longest = 0;
    hearth_status st = train_setup(model_name, o, 1, &t, &td, &vd, &longest, err);
    if (st && !t.hm) return st;
    int pref = t.pref, orpo = o->method && !strcmp(o->method, "orpo");
    double beta = orpo ? o->orpo_lambda : o->beta;
    const char *dir = o->adapter_path ? o->adapter_path : "adapters";
    int *idx = NULL, *vidx = NULL, *perm = NULL, *vperm = NULL, nb = 0, n_vb = 0;
    FILE *metrics = NULL;
    if (!st) st = tr_batches(&td, o->batch_size, "train.jsonl", &idx, &nb, err);
    if (!st && vd.n) st = tr_batches(&vd, o->batch_size, "valid.jsonl", &vidx, &n_vb, err);
    if (!st) st = open_trainer(&t, model_name, o, longest > 0 ? longest : 1, err);
    if (!st && o->resume_adapter_file) st = load_adapter_weights(&t, o->resume_adapter_file, err);
    if (!st && mkdir(dir, 0777) && errno != EEXIST) st = err_set(err, HEARTH_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!st) st = write_config(model_name, o, dir, err);
    if (!st && (!(perm = malloc(sizeof(int) * (size_t)nb)) || !(vperm = malloc(sizeof(int) * (size_t)(n_vb + 1)))))
        st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    tr_mt rng;
    tr_mt_seed(&rng, (uint32_t)o->seed);
    resume_point rp = {.pos = nb}; /* pos: position in the current epoch's permutation */
    if (!st && o->resume) st = resume_load(&t, model_name, o, dir, &rp, &rng, perm, nb, err);
    if (!st) {
        snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
        if (!(metrics = fopen(path, o->resume ? "a" : "w")))
            st = err_set(err, HEARTH_ERR_IO, "%s: %s", path, strerror(errno));
    }
    int pos = rp.pos;
    double losses = rp.losses, train_time = 0;
    long long n_tokens = rp.n_tokens, trained = rp.trained;
    int steps = rp.steps, done_steps = rp.it;
    pref_stats acc = {0};
    memcpy(&acc.loss, rp.pref, sizeof rp.pref); /* the first ten doubles, in order */
    double started = now(); /* "elapsed" in metrics.jsonl: wall seconds since here, validation included */
    long long updates = rp.updates;                        /* optimizer updates so far: the schedule's step */
    float lr = sched_lr(o, updates > 0 ? updates - 1 : 0); /* the rate of the last update (before any: the first) */
    for (int it = rp.it + 1; !st && it <= o->iters; it++) {
        if (pos == nb) tr_mt_permutation(&rng, perm, nb), pos = 0;
        /* the run's closing validation draws from the generator too: a run continued past
         * it (--resume) goes on from the generator as it was before that validation */
        tr_mt rng_run = rng;
        double tic = now();
        if (vd.n && (it == 1 || it % o->steps_per_eval == 0 || it == o->iters)) {
            double vl = pref ? pref_val_loss(&t, &vd, vidx, n_vb, &rng, o, orpo, beta, vperm)
                             : val_loss(&t, &vd, vidx, n_vb, &rng, o, vperm);
            emit(metrics, o, json_pack("{s:i,s:f,s:f,s:i,s:f}", "step", it - 1, "val_loss", vl, "val_time",
                                       now() - tic, "iters", o->iters, "elapsed", now() - started));
            tic = now();
        }
        long long toks;
        int accum = o->grad_accumulation_steps;
        if ((it - 1) % accum == 0) zero_grads(&t); /* gradients summed over accum batches */
        double loss;
        if (pref) {
            pref_stats ps;
            pref_batch(&t, &td, idx + perm[pos++] * o->batch_size, o->batch_size, o->max_seq_length, orpo, beta, 1,
                       &ps);
            loss = ps.loss, toks = ps.tokens;
            double *a = &acc.loss, *b = &ps.loss;
            for (size_t k = 0; k < sizeof acc / sizeof(double) - 1; k++) a[k] += b[k];
        } else {
            loss = run_batch(&t, &td, idx + perm[pos++] * o->batch_size, o->batch_size, o->max_seq_length, 1, &toks);
        }
        if (it % accum == 0) { /* as mlx-lm: a last partial window is not applied */
            lr = sched_lr(o, updates++);
            opt_step(&t, lr, accum, updates); /* updates: this one's number from 1 */
        }
        losses += loss, n_tokens += toks, steps++, done_steps = it;
        train_time += now() - tic;
        if (it % o->steps_per_report == 0 || it == o->iters) {
            hearth_process_memory pm;
            hearth_process_memory_get(&pm);
            trained += n_tokens;
            json_t *j = json_pack("{s:i,s:f,s:f,s:f,s:f,s:I,s:f}", "step", it, "loss", losses / steps, "learning_rate",
                                  (double)lr, "iterations_per_second", steps / train_time, "tokens_per_second",
                                  n_tokens / train_time, "trained_tokens", (json_int_t)trained, "peak_memory_gb",
                                  pm.peak_resident_bytes / 1e9);
            json_object_set_new(j, "iters", json_integer(o->iters));
            json_object_set_new(j, "elapsed", json_real(now() - started));
            if (pref) { /* TRL's names for its batch metrics, averaged over the report's steps */
                static const char *const names[] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                                    "rewards/margins", "logps/chosen", "logps/rejected",
                                                    "nll_loss", "log_odds_ratio", "log_odds_chosen"};
                const double *a = &acc.reward_c;
                for (int k = 0; k < (orpo ? 9 : 6); k++) json_object_set_new(j, names[k], json_real(a[k] / steps));
                memset(&acc, 0, sizeof acc);
            }
            emit(metrics, o, j);
            losses = 0, n_tokens = 0, steps = 0, train_time = 0;
        }
        if (it % o->save_every == 0 || it == o->iters) { /* checkpoints, and the resume state with them */
            resume_point now_at = {it, pos, updates, n_tokens, trained, losses, steps, {0}};
            memcpy(now_at.pref, &acc.loss, sizeof now_at.pref);
            if (it % o->save_every == 0) {
                st = save_all(&t, model_name, o->lora_scale, dir, err);
                snprintf(path, sizeof path, "%s/%07d_adapters.safetensors", dir, it);
                if (!st) st = save_adapters(&t, path, 0, err);
            }
            int closing_only = it == o->iters && it != 1 && it % o->steps_per_eval != 0;
            if (!st) st = resume_save(&t, model_name, o, dir, &now_at, closing_only ? &rng_run : &rng, perm, nb, err);
        }
    }
    if (!st) st = save_all(&t, model_name, o->lora_scale, dir, err);
    if (metrics) { /* the run's last line: hearth train-watch stops at it */
        hearth_process_memory pm;
        hearth_process_memory_get(&pm);
        json_t *j = json_pack("{s:b,s:i,s:i,s:f,s:I,s:f}", "done", 1, "step", done_steps, "iters", o->iters,
                              "elapsed", now() - started, "trained_tokens", (json_int_t)(trained + n_tokens),
                              "peak_memory_gb", pm.peak_resident_bytes / 1e9);
        if (st) json_object_set_new(j, "error", json_string(err ? err->message : hearth_status_name(st)));
        emit(metrics, o, j);
        fclose(metrics);
    }
    free(idx), free(vidx), free(perm), free(vperm);
    tr_dataset_free(&td), tr_dataset_free(&vd);
    free_trainer(&t);
    return st;
}

hearth_train_record hearth_train_record_kind(const char *line, size_t len) {
    json_t *j = json_loadb(line, len, 0, NULL);
    hearth_train_record k = HEARTH_TRAIN_RECORD_NONE;
    if (json_is_object(j) && json_is_number(json_object_get(j, "step")))
        k = json_is_true(json_object_get(j, "done"))          ? HEARTH_TRAIN_RECORD_FINAL
            : json_is_number(json_object_get(j, "loss"))     ? HEARTH_TRAIN_RECORD_TRAIN
            : json_is_number(json_object_get(j, "val_loss")) ? HEARTH_TRAIN_RECORD_VAL
                                                              : HEARTH_TRAIN_RECORD_NONE;
    json_decref(j);
    return k;
}

/* The packing workspace of the largest product a step makes: attention's per-head products
 * (T x T and T x head_dim panels), every projection's forward, input-gradient and LoRA
 * products, and the cross-entropy's chunk against the LM head (TR_XENT_ROWS rows x vocab). */
static size_t gemm_workspace_bytes(const trainer *t) {
    int64_t T = t->T, xr = T < TR_XENT_ROWS ? T : TR_XENT_ROWS, th = t->threads;
    /* the vocabulary only meets the chunk's rows (above), never T */
    int64_t dims[] = {t->D, (int64_t)t->Hq * t->hd, (int64_t)t->Hkv * t->hd, t->F, t->r};
    size_t most = tr_gemm_workspace_floats(t->Hq, T, T, (int)th, TR_GEMM_K_LE_M);
    size_t c[] = {tr_gemm_workspace_floats(t->Hq, T, t->hd, (int)th, TR_GEMM_CAUSAL),
                  tr_gemm_workspace_floats(1, xr, t->D, (int)th, 0), tr_gemm_workspace_floats(1, xr, t->V, (int)th, 0)};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) most = c[i] > most ? c[i] : most;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        size_t a = tr_gemm_workspace_floats(1, T, dims[i], (int)th, 0);
        size_t b = tr_gemm_workspace_floats(1, dims[i], T, (int)th, 0);
        most = a > most ? a : most;
        most = b > most ? b : most;
    }
    return resident_of(((most + 15) & ~(size_t)15) * sizeof(float));
}

hearth_status hearth_train_fit(const char *model_name, const hearth_train_options *opts, char **report_json,
                               hearth_error *err) {
    hearth_train_options ro = *opts, *o = &ro;
    trainer t = {.dry = 1};
    tr_dataset td = {0}, vd = {0};
    int longest = 0;
    *report_json = NULL;
    hearth_status st = train_setup(model_name, o, 0, &t, &td, &vd, &longest, err);
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    size_t base = st ? 0 : fit_process_base(t.hm, threads > 0 ? threads : 1);
    if (!st) st = open_trainer(&t, model_name, o, longest > 0 ? longest : 1, err);
    if (!st) {
        size_t weights = model_weight_bytes(t.m), load = model_load_peak_bytes(t.m), ws = gemm_workspace_bytes(&t);
        size_t run = weights + ws;
        for (int i = 0; i < 5; i++) run += t.dry_bytes[i];
        size_t peak = base + (load > run ? load : run);
        hearth_process_memory pm;
        hearth_process_memory_get(&pm);
        json_t *parts = json_pack("{s:I,s:I,s:I}", "process", (json_int_t)base, "weights", (json_int_t)weights,
                                  "gemm_workspace", (json_int_t)ws);
        for (int i = 0; i < 5; i++) json_object_set_new(parts, part_name[i], json_integer((json_int_t)t.dry_bytes[i]));
        json_t *r = json_pack("{s:s,s:s,s:i,s:s,s:i,s:i,s:i,s:I,s:I,s:I,s:o}", "model", model_name, "method",
                              o->method, "sequence_length", longest, "sequence_length_source",
                              o->data ? "the longest example of --data, at most --max-seq-length" : "--max-seq-length",
                              "lora_rank", o->lora_rank, "layers_trained", t.L - t.first_lora, "threads", t.threads,
                              "trainable_parameters", (json_int_t)t.n_params, "predicted_peak_bytes", (json_int_t)peak,
                              "weights_load_peak_bytes", (json_int_t)(base + load), "parts", parts);
        json_t *cfg = config_json(model_name, o, o->adapter_path); /* what the run would train with */
        if (cfg) json_object_set_new(r, "config", cfg);
        if (pm.available_bytes >= 0) {
            long long room = pm.available_bytes + pm.resident_bytes; /* this process's own pages come back */
            json_object_set_new(r, "available_bytes", json_integer(room));
            json_object_set_new(r, "fits", json_boolean((long long)peak <= room));
        }
        if (!(*report_json = json_dumps(r, JSON_INDENT(1) | JSON_PRESERVE_ORDER)))
            st = err_set(err, HEARTH_ERR_NOMEM, "out of memory");
        json_decref(r);
    }
    tr_dataset_free(&td), tr_dataset_free(&vd);
    free_trainer(&t);
    return st;
}
