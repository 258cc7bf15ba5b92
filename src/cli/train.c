/* train.c: `hearth train`: mlx_lm.lora's verb (LoRA SFT on the CPU; flags, defaults and
 * progress lines as mlx_lm.lora has them) plus preference training (--method dpo|orpo);
 * hearth_train does the work. */
#include "base/file.h"
#include "cli/cli.h"
#include "cli/train_config.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *train_usage =
    "hearth train <model> --data <dir> [--method sft|dpo|orpo] [--iters N] [--batch-size N]\n"
    "  [--learning-rate X] [--lora-rank N] [--lora-scale X] [--num-layers 16] [--max-seq-length N]\n"
    "  [--beta 0.1] [--lambda 0.1] [--seed 0] [--adapter-path adapters] [--resume-adapter-file F]\n"
    "  [--steps-per-report 10] [--steps-per-eval 200] [--val-batches 25] [--save-every 100] [--mask-prompt]\n"
    "  [--fine-tune-type lora|dora] [--optimizer adam|adamw|sgd|muon|adafactor] [--weight-decay X] "
    "[--grad-accumulation-steps N] "
    "[--grad-checkpoint]\n"
    "  [--lr-schedule cosine_decay|linear_schedule|exponential_decay|step_decay --lr-schedule-args A,B[,C]]\n"
    "  [--warmup N] [--warmup-init X] [--resume]  (--resume: continue the run in --adapter-path to --iters)\n"
    "  [--threads N] [-c config.yaml]  (mlx_lm.lora's YAML config, flags win; --model M and --train work too)\n"
    "  method: orpo for prompt/chosen/rejected data, else sft. Defaults: sft iters 1000, batch 4, lr 1e-5,\n"
    "  rank 8, scale 20, seq 2048; dpo/orpo iters 100, batch 1, lr 5e-5/1e-5, rank 8/16, scale 1/2, seq 4096\n"
    "  adapts what mlx_lm.lora's default keys adapt (every linear layer of the block; a config's\n"
    "  lora_parameters.keys picks some); writes DIR/adapters.safetensors (MLX), DIR/peft/ (PEFT; none when\n"
    "  a mixture of experts' routers or experts are adapted) and DIR/metrics.jsonl (hearth train-watch DIR)";

static void on_metrics(void *ctx, const char *line) {
    json_t *j = json_loads(line, 0, NULL);
    if (!j || json_object_get(j, "done")) { /* the final record: main says what was written */
        json_decref(j);
        return;
    }
    int step = (int)json_integer_value(json_object_get(j, "step"));
    if (json_object_get(j, "rewards/chosen") && json_object_get(j, "loss"))
        printf("Iter %d: Train loss %.3f, Chosen reward %.3f, Rejected reward %.3f, Accuracy %.3f, Margin %.3f, "
               "Learning Rate %.3e, It/sec %.3f, Tokens/sec %.3f, Peak mem %.3f GB\n",
               step, json_real_value(json_object_get(j, "loss")), json_real_value(json_object_get(j, "rewards/chosen")),
               json_real_value(json_object_get(j, "rewards/rejected")),
               json_real_value(json_object_get(j, "rewards/accuracies")),
               json_real_value(json_object_get(j, "rewards/margins")),
               json_real_value(json_object_get(j, "learning_rate")),
               json_real_value(json_object_get(j, "iterations_per_second")),
               json_real_value(json_object_get(j, "tokens_per_second")),
               json_real_value(json_object_get(j, "peak_memory_gb")));
    else if (json_object_get(j, "val_loss"))
        printf("Iter %d: Val loss %.3f, Val took %.3fs\n", step, json_real_value(json_object_get(j, "val_loss")),
               json_real_value(json_object_get(j, "val_time")));
    else
        printf("Iter %d: Train loss %.3f, Learning Rate %.3e, It/sec %.3f, Tokens/sec %.3f, Trained Tokens %lld, "
               "Peak mem %.3f GB\n",
               step, json_real_value(json_object_get(j, "loss")), json_real_value(json_object_get(j, "learning_rate")),
               json_real_value(json_object_get(j, "iterations_per_second")),
               json_real_value(json_object_get(j, "tokens_per_second")),
               (long long)json_integer_value(json_object_get(j, "trained_tokens")),
               json_real_value(json_object_get(j, "peak_memory_gb")));
    fflush(stdout);
    json_decref(j);
}

static int int_flag(const char *name, const char *v, long lo, int *out) {
    long x;
    if (cli_parse_long(v, lo, 1L << 30, &x)) {
        fprintf(stderr, "hearth train: %s %s: not a whole number >= %ld\n", name, v, lo);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int real_flag(const char *name, const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= 0)) {
        fprintf(stderr, "hearth train: %s %s: not a non-negative number\n", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* --lr-schedule-args: 1 to 3 comma-separated numbers (a schedule's arguments, as mlx-lm's
 * lr_schedule "arguments" list). */
static int args_flag(const char *name, const char *v, hearth_train_options *o) {
    const char *p = v;
    int n = 0;
    for (;;) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || n == 3 || !isfinite(x) || (*end && *end != ',')) {
            fprintf(stderr, "hearth train: %s %s: need 1 to 3 comma-separated numbers\n", name, v);
            return -1;
        }
        o->lr_schedule_args[n++] = x;
        if (*end == 0) break;
        p = end + 1;
    }
    o->n_lr_schedule_args = n;
    return 0;
}

/* The flags of hearth train into *o and *model (hearth fit --train takes them too, and
 * --json: *as_json when as_json is not NULL); 0, or the exit code of a usage error. */
static int parse_train_flags(int argc, char **argv, const char *usage, hearth_train_options *o, const char **model,
                             int *as_json) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, used = 1;
        if (cli_is_help(a)) {
            printf("usage: %s\n", usage);
            return -1;
        }
        if (!strcmp(a, "--train")) continue;          /* mlx_lm.lora needs it; training is what this verb does */
        if (as_json && !strcmp(a, "--json")) { *as_json = 1; continue; }
        if (!strcmp(a, "--mask-prompt")) { o->mask_prompt = 1; continue; }
        if (!strcmp(a, "--resume")) {
            o->resume = 1;
            continue;
        }
        if (!strcmp(a, "--grad-checkpoint")) {
            o->grad_checkpoint = 1;
            continue;
        }
        if (!v) used = 0;
        else if (!strcmp(a, "-c") || !strcmp(a, "--config")) { /* read first: train_config_load */
        } else if (!strcmp(a, "--model"))
            *model = v;
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--method")) o->method = v;
        else if (!strcmp(a, "--fine-tune-type")) {
            if (!strcmp(v, "lora") || !strcmp(v, "dora"))
                o->dora = !strcmp(v, "dora");
            else
                return cli_usage_error(usage, "--fine-tune-type %s: hearth trains lora or dora adapters", v);
        } else if (!strcmp(a, "--optimizer"))
            o->optimizer = v;
        else if (!strcmp(a, "--weight-decay"))
            bad = real_flag(a, v, &o->weight_decay);
        else if (!strcmp(a, "--grad-accumulation-steps"))
            bad = int_flag(a, v, 1, &o->grad_accumulation_steps);
        else if (!strcmp(a, "--lr-schedule"))
            o->lr_schedule = v;
        else if (!strcmp(a, "--lr-schedule-args"))
            bad = args_flag(a, v, o);
        else if (!strcmp(a, "--warmup"))
            bad = int_flag(a, v, 0, &o->warmup);
        else if (!strcmp(a, "--warmup-init"))
            bad = real_flag(a, v, &o->warmup_init);
        else if (!strcmp(a, "--adapter-path")) o->adapter_path = v;
        else if (!strcmp(a, "--resume-adapter-file")) o->resume_adapter_file = v;
        else if (!strcmp(a, "--iters")) bad = int_flag(a, v, 1, &o->iters);
        else if (!strcmp(a, "--batch-size")) bad = int_flag(a, v, 1, &o->batch_size);
        else if (!strcmp(a, "--lora-rank")) bad = int_flag(a, v, 1, &o->lora_rank);
        else if (!strcmp(a, "--max-seq-length")) bad = int_flag(a, v, 2, &o->max_seq_length);
        else if (!strcmp(a, "--steps-per-report")) bad = int_flag(a, v, 1, &o->steps_per_report);
        else if (!strcmp(a, "--steps-per-eval")) bad = int_flag(a, v, 1, &o->steps_per_eval);
        else if (!strcmp(a, "--save-every")) bad = int_flag(a, v, 1, &o->save_every);
        else if (!strcmp(a, "--threads")) bad = int_flag(a, v, 1, &o->threads);
        else if (!strcmp(a, "--num-layers")) {
            if (!strcmp(v, "-1")) o->num_layers = -1;
            else bad = int_flag(a, v, 1, &o->num_layers);
        } else if (!strcmp(a, "--val-batches")) {
            if (!strcmp(v, "-1")) o->val_batches = -1;
            else bad = int_flag(a, v, 1, &o->val_batches);
        } else if (!strcmp(a, "--seed")) {
            int s;
            bad = int_flag(a, v, 0, &s);
            o->seed = (unsigned long long)s;
        } else if (!strcmp(a, "--learning-rate")) bad = real_flag(a, v, &o->learning_rate);
        else if (!strcmp(a, "--lora-scale")) bad = real_flag(a, v, &o->lora_scale);
        else if (!strcmp(a, "--beta")) bad = real_flag(a, v, &o->beta);
        else if (!strcmp(a, "--lambda")) bad = real_flag(a, v, &o->orpo_lambda);
        else used = 0;
        if (bad) return 2;
        if (used) {
            i++;
            continue;
        }
        if (a[0] == '-') return cli_usage_error(usage, "%s: unknown flag, or a flag without its value", a);
        if (*model) return cli_usage_error(usage, "%s: unexpected argument", a);
        *model = a;
    }
    return 0;
}

/* -c / --config FILE (the last one given): mlx_lm.lora's YAML config into *o before the
 * flags, which win over it; its model in *cfg_model. *cfg (json_decref after training) holds
 * the strings o points to. 0, or an exit code after the message. */
static int train_config_load(int argc, char **argv, const char *verb, hearth_train_options *o, const char **cfg_model,
                             json_t **cfg, const char **path) {
    *path = NULL;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) *path = argv[++i];
    if (!*path) return 0;
    char *text = NULL, msg[512], warn[2048];
    size_t n = 0;
    hearth_error err = {0};
    if (file_read_all(*path, &text, &n, &err)) {
        fprintf(stderr, "hearth %s: %s: %s\n", verb, *path, err.message);
        return 1;
    }
    *cfg = yaml_parse(text, n, msg, sizeof msg);
    free(text);
    if (!*cfg) {
        fprintf(stderr, "hearth %s: %s: %s\n", verb, *path, msg);
        return 2;
    }
    if (train_config_apply(*cfg, o, cfg_model, warn, sizeof warn, msg, sizeof msg)) {
        fprintf(stderr, "hearth %s: %s: %s\n", verb, *path, msg);
        return 2;
    }
    for (char *w = warn, *e; *w; w = e + 1) { /* one warning a line */
        e = strchr(w, '\n');
        if (!e) break;
        fprintf(stderr, "hearth %s: %s: warning: %.*s\n", verb, *path, (int)(e - w), w);
    }
    return 0;
}

/* After the flags: the config's optimizer_config for the optimizer now chosen, and its model
 * when the command line named none. */
static int train_config_finish(const json_t *cfg, const char *path, const char *verb, hearth_train_options *o,
                               const char **model, const char *cfg_model) {
    char msg[512];
    if (!*model) *model = cfg_model;
    if (cfg && train_config_optimizer(cfg, o, msg, sizeof msg)) {
        fprintf(stderr, "hearth %s: %s: %s\n", verb, path, msg);
        return 2;
    }
    return 0;
}

int cli_train(int argc, char **argv) {
    hearth_train_options o;
    hearth_train_defaults(&o);
    o.on_metrics = on_metrics;
    const char *model = NULL, *cfg_model = NULL, *cfg_path = NULL;
    json_t *cfg = NULL;
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) return printf("usage: %s\n", train_usage), 0;
    int rc = train_config_load(argc, argv, "train", &o, &cfg_model, &cfg, &cfg_path);
    if (!rc) rc = parse_train_flags(argc, argv, train_usage, &o, &model, NULL);
    if (!rc) rc = train_config_finish(cfg, cfg_path, "train", &o, &model, cfg_model);
    if (rc) {
        json_decref(cfg);
        return rc < 0 ? 0 : rc;
    }
    if (!model)
        rc = cli_usage_error(train_usage, "%s", "need a model");
    else if (!o.data)
        rc = cli_usage_error(train_usage, "%s", "need --data <dir> (a folder with train.jsonl)");
    hearth_error err = {0};
    if (!rc && hearth_train(model, &o, &err)) rc = cli_fail(&err);
    if (!rc) {
        char peft[4096];
        snprintf(peft, sizeof peft, "%s/peft/adapter_model.safetensors", o.adapter_path);
        if (access(peft, F_OK) == 0)
            fprintf(stderr, "hearth train: wrote %s/adapters.safetensors (MLX) and %s/peft/ (PEFT)\n", o.adapter_path,
                    o.adapter_path);
        else /* a mixture of experts' router, experts or shared expert adapted: no PEFT layout for those */
            fprintf(stderr,
                    "hearth train: wrote %s/adapters.safetensors (MLX; no PEFT copy: PEFT has no layout for the "
                    "routed experts' pairs)\n",
                    o.adapter_path);
    }
    json_decref(cfg);
    return rc;
}

static const char *train_fit_usage =
    "hearth fit <model> --train [--data <dir>] [--method sft|dpo|orpo] [--max-seq-length N] [--lora-rank N]\n"
    "       [--num-layers N|-1] [--threads N] [-c config.yaml] [--json]\n"
    "  the peak memory `hearth train` would take with the same flags (every other train flag is accepted\n"
    "  and changes nothing here); with --data, sized for its longest example as training is";

static double train_mib(const json_t *o, const char *key) {
    return (double)json_integer_value(json_object_get(o, key)) / (1024.0 * 1024.0);
}

int cli_train_fit(int argc, char **argv) {
    hearth_train_options o;
    hearth_train_defaults(&o);
    const char *model = NULL, *cfg_model = NULL, *cfg_path = NULL;
    json_t *cfg = NULL;
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) return printf("usage: %s\n", train_fit_usage), 0;
    int as_json = 0, rc = train_config_load(argc, argv, "fit", &o, &cfg_model, &cfg, &cfg_path);
    if (!rc) rc = parse_train_flags(argc, argv, train_fit_usage, &o, &model, &as_json);
    if (!rc) rc = train_config_finish(cfg, cfg_path, "fit", &o, &model, cfg_model);
    if (!rc && !model) rc = cli_usage_error(train_fit_usage, "%s", "need a model");
    hearth_error err = {0};
    char *report = NULL;
    if (!rc && hearth_train_fit(model, &o, &report, &err)) rc = cli_fail(&err);
    json_decref(cfg); /* o's strings are not read after the fit */
    if (rc) return rc < 0 ? 0 : rc;
    json_t *r = as_json ? NULL : json_loads(report, 0, NULL);
    if (as_json || !r) {
        printf("%s\n", report);
    } else {
        const json_t *p = json_object_get(r, "parts");
        printf("model:    %s\n", json_string_value(json_object_get(r, "model")));
        printf("training: %s, sequences of %lld tokens (%s), LoRA rank %lld on the last %lld layers (%lld "
               "parameters), %lld threads\n\n",
               json_string_value(json_object_get(r, "method")),
               (long long)json_integer_value(json_object_get(r, "sequence_length")),
               json_string_value(json_object_get(r, "sequence_length_source")),
               (long long)json_integer_value(json_object_get(r, "lora_rank")),
               (long long)json_integer_value(json_object_get(r, "layers_trained")),
               (long long)json_integer_value(json_object_get(r, "trainable_parameters")),
               (long long)json_integer_value(json_object_get(r, "threads")));
        static const char *const rows[][2] = {
            {"process", "this process (libraries, tokenizer, data)"}, {"weights", "weights as loaded"},
            {"dense_weight_copies", "float32 copies of quantized weights"},
            {"adapter_and_gradients", "LoRA tensors and their gradients"}, {"optimizer_state", "Adam state"},
            {"saved_activations", "activations kept for the backward"}, {"step_buffers", "the step's buffers"},
            {"gemm_workspace", "GEMM packing workspace"}};
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            printf("  %-42s %10.1f MiB\n", rows[i][1], train_mib(p, rows[i][0]));
        printf("  %-42s %10.1f MiB\n", "predicted peak resident", train_mib(r, "predicted_peak_bytes"));
        if (json_object_get(r, "fits"))
            printf("  %-42s %10.1f MiB\nfits: %s\n", "available", train_mib(r, "available_bytes"),
                   json_is_true(json_object_get(r, "fits")) ? "yes" : "NO");
    }
    json_decref(r);
    hearth_free(report);
    return 0;
}
