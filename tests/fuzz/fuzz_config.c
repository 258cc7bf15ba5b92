/* fuzz_config.c: libFuzzer target for config.json handling: arbitrary bytes parsed as
 * JSON, then MLX quantization config parsing and per-module lookup must never crash. */
#include "io/mlx_quant.h"
#include <jansson.h>
#include <stdint.h>
#include <stddef.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!j) return 0;
    mlxq_config c = {0};
    hearth_error err = {0};
    if (mlxq_config_parse(j, "config.json", &c, &err) == HEARTH_OK) {
        int bits, group;
        static const char *paths[] = {"model.layers.0.mlp.down_proj", "lm_head", "model.embed_tokens", ""};
        for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) mlxq_lookup(&c, paths[i], &bits, &group);
        mlxq_config_free(&c);
    }
    json_decref(j);
    return 0;
}
