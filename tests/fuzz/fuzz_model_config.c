/* fuzz_model_config.c: libFuzzer target for a decoder's config.json (model/config.c: every
 * family, the Qwen3.5 hybrid layout, MoE and RoPE keys): arbitrary bytes parsed as JSON,
 * summarized as a model folder with no tensors, then read into a model_config; it must
 * answer an error or a config, never crash or read out of bounds. */
#include "model/model.h"
#include "model/model_handle.h"
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

hearth_status model_config_read(const hearth_model *hm, model_config *c, hearth_error *err);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = json_loadb((const char *)data, size, 0, NULL);
    if (!j) return 0;
    hearth_model m = {0};
    m.entry.path = "fuzz";
    m.entry.format = MODEL_FORMAT_DIR;
    m.config = j;
    hearth_error err = {0};
    (void)model_summarize(&m, &err); /* fails without tensors; the summary's numbers are what matter */
    model_config c;
    if (model_config_read(&m, &c, &err) == HEARTH_OK || c.inv_freq_global) {
        if (c.inv_freq_local != c.inv_freq_global) free(c.inv_freq_local);
        free(c.inv_freq_global);
    }
    json_decref(j);
    return 0;
}
