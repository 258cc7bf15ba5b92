/* fuzz_model_config.c: libFuzzer target for the decoder configuration reader: arbitrary bytes
 * as the config.json of a model folder without tensors, summarized and then read by
 * model_config_read (every family; the Qwen3.5 hybrid layout, MoE and RoPE keys; Gemma 4's layer types, shared-KV sources, head sizes and
 * RoPE tables included). It must fail with a message or succeed, never crash. */
#include "model/model.h"
#include "model/model_handle.h"
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

hearth_status model_config_read(const hearth_model *hm, model_config *c, hearth_error *err);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = json_loadb((const char *)data, size, 0, NULL);
    if (!j) return 0;
    hearth_model hm;
    memset(&hm, 0, sizeof hm);
    hm.entry.path = (char *)"fuzz";
    hm.entry.format = MODEL_FORMAT_DIR;
    hm.config = j;
    hearth_error err = {0};
    /* layer counts up to the summary's 2^31 are valid input, but each costs memory and time in
     * proportion: the fuzzer explores the rest of the config at small counts */
    if (model_summarize(&hm, &err) == HEARTH_OK && hm.sum.n_layers <= 256) {
        model *m = calloc(1, sizeof *m);
        if (m) {
            model_config_read(&hm, &m->cfg, &err);
            model_free(m);
        }
    }
    json_decref(j);
    return 0;
}
