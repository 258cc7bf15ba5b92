/* fuzz_train_config.c: `hearth train -c`'s YAML reader and its mapping onto the training
 * options (src/cli/train_config.c, compiled in here: the CLI is not part of the library) on
 * arbitrary bytes. A document it reads must print as JSON that reads back to the same value
 * (JSON is YAML's flow form); settings it accepts must be in the ranges hearth train takes;
 * a refusal must say why. Nothing may crash, hang or leak. */
#include "../../src/cli/train_config.c"
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char msg[256], warn[512];
    json_t *v = yaml_parse((const char *)data, size, msg, sizeof msg);
    if (!v) {
        if (!msg[0]) abort();
        return 0;
    }
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (text) {
        json_t *back = yaml_parse(text, strlen(text), msg, sizeof msg);
        if (!back || !json_equal(v, back)) abort();
        json_decref(back);
        free(text);
    }
    hearth_train_options o;
    hearth_train_defaults(&o);
    const char *model = NULL;
    if (!train_config_apply(v, &o, &model, warn, sizeof warn, msg, sizeof msg)) {
        if (o.iters < 0 || o.batch_size < 0 || o.lora_rank < 0 || o.num_layers < -1 || o.n_lr_schedule_args > 3 ||
            o.grad_accumulation_steps < 1 || (o.lr_schedule && o.n_lr_schedule_args < 1))
            abort();
        if (train_config_optimizer(v, &o, msg, sizeof msg) && !msg[0]) abort();
    } else if (!msg[0]) {
        abort();
    }
    json_decref(v);
    return 0;
}
