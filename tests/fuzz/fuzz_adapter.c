/* fuzz_adapter.c: libFuzzer target for LoRA adapter folders (engine/adapter_load.c):
 * arbitrary bytes split into an adapter_config.json text and a safetensors image, read in
 * the MLX and the PEFT layout against a small float model (two llama layers, GGUF q/k row
 * order so the permutation runs too; the second one a mixture of experts with a shared expert
 * and per-layer input projections, so expert pairs parse too). Must never crash, leak or read
 * out of bounds; an adapter that loads must have every pair inside the model's shapes. */
#include "engine/adapter.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { L = 2, H = 8, F = 16, HEADS = 2, KV_HEADS = 1, HD = 4, E = 2, FM = 4 };
static float weights[F * H];

static op_weight matrix(int n, int k) { return (op_weight){.dtype = DT_F32, .data = weights, .n = n, .k = k}; }

static void fake_model(model *m, layer_weights *layers) {
    memset(m, 0, sizeof *m);
    m->cfg = (model_config){.family = FAMILY_LLAMA,
                            .n_layers = L,
                            .hidden = H,
                            .n_heads = HEADS,
                            .n_kv_heads = KV_HEADS,
                            .head_dim = HD,
                            .ffn = F,
                            .rope_adjacent = 1,
                            .n_experts = E,
                            .top_k_experts = 1,
                            .moe_ffn = FM};
    for (int i = 0; i < L; i++)
        layers[i] = (layer_weights){.q = matrix(HEADS * HD, H), .k = matrix(KV_HEADS * HD, H),
                                    .v = matrix(KV_HEADS * HD, H), .o = matrix(H, HEADS * HD),
                                    .gate = matrix(F, H), .up = matrix(F, H), .down = matrix(H, F)};
    /* layer 1 is a mixture of experts (router, stacked experts, a shared expert) beside its MLP,
     * with per-layer input projections: every kind of pair the loader reads */
    layers[1].moe = 1;
    layers[1].router = matrix(E, H);
    layers[1].experts_gate = matrix(E * FM, H), layers[1].experts_up = matrix(E * FM, H);
    layers[1].experts_down = matrix(E * H, FM);
    layers[1].shared_gate = matrix(FM, H), layers[1].shared_up = matrix(FM, H), layers[1].shared_down = matrix(H, FM);
    layers[1].shared_router = matrix(1, H);
    layers[1].pl_gate = matrix(FM, H), layers[1].pl_proj = matrix(H, FM);
    m->layers = layers;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t cfg_len = ((size_t)data[0] << 8 | data[1]) % (size - 1);
    const char *cfg = (const char *)data + 2;
    if (cfg_len > size - 2) cfg_len = size - 2;
    const uint8_t *st = data + 2 + cfg_len;
    size_t st_len = size - 2 - cfg_len;
    model m;
    layer_weights layers[L];
    fake_model(&m, layers);
    for (int peft = 0; peft < 2; peft++) {
        adapter *a = NULL;
        hearth_error err = {0};
        if (adapter_parse(&m, "fuzz", peft, cfg, cfg_len, st, st_len, &a, &err) == HEARTH_OK) {
            for (int i = 0; i < L * OP_N_PROJ; i++) {
                const op_lora *l = &a->proj[i];
                int p = i % OP_N_PROJ, expert = p >= OP_PROJ_EXP_GATE && p <= OP_PROJ_EXP_DOWN;
                if (l->a && (l->rank < 1 || l->rank > OP_LORA_MAX_RANK)) abort();
                /* the routed experts' pairs: one per expert of layer 1, nowhere else */
                if (l->a && (l->experts != (expert ? E : 0) || (expert && i / OP_N_PROJ != 1))) abort();
            }
            adapter_free(a);
        }
    }
    return 0;
}
