/* train_config.h: `hearth train -c FILE`: mlx_lm.lora's YAML configuration file (the same
 * keys: model, data, iters, lora_parameters, lr_schedule, optimizer_config, ...) read into
 * hearth_train_options. Flags on the command line win over the file, as in mlx_lm.lora.
 * The YAML reader covers what such files use: block mappings and sequences, flow [..] and
 * {..} (JSON included, over several lines), plain / single / double-quoted scalars,
 * comments, and PyYAML's SafeLoader typing with mlx-lm's float rule (1e-5 is a number).
 * Anchors, aliases, tags and block scalars (| >) are refused by line. */
#ifndef HEARTH_CLI_TRAIN_CONFIG_H
#define HEARTH_CLI_TRAIN_CONFIG_H
#include "hearth.h"
#include <jansson.h>
#include <stddef.h>

/* text (n bytes, no NUL needed) as YAML into a new JSON value; NULL with "line N: problem"
 * in msg (msg_len bytes) when it is not YAML this reader takes. */
json_t *yaml_parse(const char *text, size_t n, char *msg, size_t msg_len);

/* The keys of cfg (a mapping) into *o and *model (model only when *model is NULL): strings
 * point into cfg, which must outlive o. Keys that would change training and that hearth
 * cannot honour (full fine-tuning, dropout, lora keys, optimizer settings but weight_decay) are errors naming the key;
 * keys with no effect here (test, report_to, ...) and unknown keys are named in warn (one line each, may be truncated).
 * 0, or -1 with the problem in msg. */
int train_config_apply(const json_t *cfg, hearth_train_options *o, const char **model, char *warn, size_t warn_len,
                       char *msg, size_t msg_len);
/* cfg's optimizer_config for o->optimizer (adam when NULL), read once the command line has
 * named the optimizer: weight_decay, unless --weight-decay set one; any other key of that
 * optimizer is an error. 0, or -1 with the problem in msg. */
int train_config_optimizer(const json_t *cfg, hearth_train_options *o, char *msg, size_t msg_len);
#endif
