/* fuzz_gguf_model.c: libFuzzer target for reading a model from GGUF metadata and tensor
 * infos: arbitrary bytes parsed as a GGUF file, summarized, read by model_config_read (every
 * GGUF architecture; gemma4's per-layer arrays, KV-sharing map and rope_freqs included) and
 * sized by model_plan (every tensor name and shape the loader checks, no copy). It must fail
 * with a message or succeed, never crash. Seeds: tiny files as tests/parity's GGUF writers
 * make them (test_gguf_gemma4.py's, shrunk to a few bytes per tensor). */
#include "model/model.h"
#include "model/model_handle.h"
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hearth_model hm;
    memset(&hm, 0, sizeof hm);
    hm.entry.path = (char *)"fuzz.gguf";
    hm.entry.format = MODEL_FORMAT_GGUF;
    hearth_error err = {0};
    if (gguf_parse(data, size, "fuzz.gguf", &hm.gguf, &err) != HEARTH_OK) return 0;
    /* layer counts up to the summary's 2^31 are valid input, but each costs memory and time in
     * proportion: the fuzzer explores the rest at small counts */
    if (model_summarize(&hm, &err) == HEARTH_OK && hm.sum.n_layers <= 256) {
        model *m = NULL;
        if (model_plan(&hm, 0, &m, &err) == HEARTH_OK) model_free(m);
    }
    gguf_close(&hm.gguf);
    return 0;
}
