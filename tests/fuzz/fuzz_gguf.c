/* fuzz_gguf.c: libFuzzer target for the GGUF reader. Parses arbitrary bytes, then
 * walks everything a caller could touch (metadata getters, the JSON view, every
 * tensor dequantized) so an unchecked length anywhere shows up under ASan/UBSan. */
#include "io/ggml_quant.h"
#include "io/gguf.h"
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file g;
    hearth_error err;
    if (gguf_parse(data, size, "fuzz.gguf", &g, &err) != HEARTH_OK) return 0;
    for (uint64_t i = 0; i < g.n_kv; i++) {
        const gguf_kv *kv = &g.kv[i];
        int64_t iv;
        double fv;
        int bv;
        gguf_get_i64(&g, kv->key, &iv);
        gguf_get_f64(&g, kv->key, &fv);
        gguf_get_bool(&g, kv->key, &bv);
        free(gguf_get_str(&g, kv->key));
        if (kv->type == GGUF_ARRAY && kv->v.arr.n) {
            gguf_arr_i64(kv, kv->v.arr.n - 1);
            gguf_arr_f64(kv, 0);
        }
    }
    json_decref(gguf_metadata_json(&g, 16));
    json_decref(gguf_metadata_json(&g, UINT64_MAX));
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const tensor_info *t = &g.tensors[i];
        uint64_t n = tensor_elems(t);
        if (gguf_find_tensor(&g, t->name) != t) abort(); /* names are unique */
        if (n > (1u << 20)) continue;  /* keep each run fast; sizes are already checked */
        float *out = malloc(n ? n * sizeof *out : 1);
        if (out) ggml_dequantize(t->dtype, t->data, t->nbytes, out, n, &err);
        free(out);
    }
    gguf_close(&g);
    return 0;
}
