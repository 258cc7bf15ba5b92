/* convert.c: `hearth convert`: a float safetensors model to an MLX folder, optionally
 * quantized (hearth_convert does the work), with a progress line on a terminal. */
#include "cli/convert_args.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *convert_usage =
    "hearth convert <model> --out <dir> [-q|--quantize] [--q-bits 4] [--q-group-size 64]\n"
    "       [--quant-predicate mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6]\n"
    "       [--target-bpw B --calibration-data F.jsonl [--candidate-bits 3,4:128,4,4:32,5] [--n-calibration 8]\n"
    "        [--calibration-length 256]] [--plan config.json]\n"
    "       hearth convert <model> --out <file.gguf> --outtype f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q6_k|q4_k_m\n"
    "       [--threads N]";

static void on_progress(void *user, size_t done, size_t total, const char *tensor) {
    (void)user;
    fprintf(stderr, "\r  %zu/%zu tensors  %-60.60s", done, total, tensor);
    if (done == total) fprintf(stderr, "\n");
}

/* --plan: a quantization section as config.json records one (convert_parse_plan checked
 * it): a module it names with {"bits", "group_size"} gets those, one it names as false
 * stays float, others get the section's own "bits" and "group_size". */
static int choose_planned(void *user, const char *module, int *group) {
    json_t *q = user, *v = json_object_get(q, module);
    if (json_is_false(v)) return 0;
    if (!json_is_object(v)) return (int)json_integer_value(json_object_get(q, "bits"));
    json_t *g = json_object_get(v, "group_size");
    if (json_is_integer(g)) *group = (int)json_integer_value(g);
    return (int)json_integer_value(json_object_get(v, "bits"));
}

static int convert_planned(const char *model, hearth_convert_options o, const char *plan_path) {
    if (access(plan_path, R_OK)) { /* cli_read_file's perror lacks the "hearth: " prefix */
        fprintf(stderr, "hearth: %s: %s\n", plan_path, strerror(errno));
        return 1;
    }
    char *text = cli_read_file(plan_path), msg[512];
    json_t *q = NULL;
    if (!text) return 1;
    if (convert_parse_plan(plan_path, text, strlen(text), &q, msg, sizeof msg)) {
        fprintf(stderr, "hearth: %s\n", msg);
        free(text);
        return 1;
    }
    free(text);
    o.bits = (int)json_integer_value(json_object_get(q, "bits"));
    if (json_is_integer(json_object_get(q, "group_size")))
        o.group_size = (int)json_integer_value(json_object_get(q, "group_size"));
    o.choose_bits = choose_planned, o.choose_user = q, o.fit_scales = 1;
    hearth_error err = {0};
    int rc = hearth_convert(model, &o, &err) ? cli_fail(&err) : 0;
    if (!rc) printf("%s\n", o.out_dir);
    json_decref(q);
    return rc;
}

int cli_convert(int argc, char **argv) {
    const char *model = NULL, *calib = NULL, *cand_list = NULL, *plan = NULL;
    double target_bpw = 0;
    int n_calib = 8, calib_len = 256;
    hearth_convert_options o = {.bits = 4, .group_size = 64};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            printf("usage: %s\n", convert_usage);
            return 0;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quantize")) {
            o.quantize = 1;
            continue;
        }
        int *num = !strcmp(a, "--q-bits")               ? &o.bits
                   : !strcmp(a, "--q-group-size")       ? &o.group_size
                   : !strcmp(a, "--n-calibration")      ? &n_calib
                   : !strcmp(a, "--calibration-length") ? &calib_len
                   : !strcmp(a, "--threads")            ? &o.n_threads
                                                        : NULL;
        const char **str = !strcmp(a, "--out")                ? &o.out_dir
                           : !strcmp(a, "--outtype")          ? &o.gguf_type
                           : !strcmp(a, "--quant-predicate")  ? &o.quant_recipe
                           : !strcmp(a, "--calibration-data") ? &calib
                           : !strcmp(a, "--candidate-bits")   ? &cand_list
                           : !strcmp(a, "--plan")             ? &plan
                                                              : NULL;
        if ((num || str || !strcmp(a, "--target-bpw")) && !v)
            return cli_usage_error(convert_usage, "flag '%s' needs a value", a);
        if (num) {
            char *end;
            long x = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || x < 1 || x > 1024)
                return cli_usage_error(convert_usage, "'%s' is not a usable number", argv[i]);
            *num = (int)x;
        } else if (str)
            *str = argv[++i];
        else if (!strcmp(a, "--target-bpw")) {
            char *end;
            target_bpw = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(target_bpw > 0 && target_bpw <= 32))
                return cli_usage_error(convert_usage, "'%s' is not a usable --target-bpw", argv[i]);
        } else if (a[0] == '-')
            return cli_usage_error(convert_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model)
            model = a;
        else
            return cli_usage_error(convert_usage, "unexpected argument '%s'", a);
    }
    if (!model || !o.out_dir) return cli_usage_error(convert_usage, "%s", "need a model and --out");
    if (o.gguf_type && o.quantize)
        return cli_usage_error(convert_usage, "%s", "-q makes MLX output; GGUF output takes --outtype");
    if (isatty(2)) o.progress = on_progress;
    if (plan) {
        if (!o.quantize || o.quant_recipe || target_bpw > 0)
            return cli_usage_error(convert_usage, "%s", "--plan goes with -q, without a recipe or --target-bpw");
        return convert_planned(model, o, plan);
    }
    if (target_bpw > 0) {
        /* measured in bench/results/convert_mixed.md: group 32 and group 128 at 4 bits are candidates of
         * their own (4:128 is what lets a tied 262k-row embedding cost less than 4.5 bits) */
        if (!cand_list) cand_list = o.group_size == 64 ? "3,4:128,4,4:32,5" : "3,4,5";
        mixed_candidate cand[8];
        int n_cand = convert_parse_candidates(cand_list, o.group_size, cand, 8);
        if (!o.quantize || o.quant_recipe || !calib)
            return cli_usage_error(convert_usage, "%s", "--target-bpw goes with -q and --calibration-data, no recipe");
        if (!n_cand)
            return cli_usage_error(convert_usage,
                                   "--candidate-bits: '%s': widths of 2,3,4,5,6,8, each optionally "
                                   ":32|:64|:128 (group size), ascending in bits per weight, at most 8",
                                   cand_list);
        if (n_calib < 1 || calib_len < 2)
            return cli_usage_error(convert_usage, "%s", "--n-calibration >= 1, --calibration-length >= 2");
        return cli_convert_mixed(model, o, target_bpw, cand, n_cand, calib, n_calib, calib_len);
    }
    hearth_error err = {0};
    if (hearth_convert(model, &o, &err)) return cli_fail(&err);
    printf("%s\n", o.out_dir);
    return 0;
}
