/* convert.c: `hearth convert`: a float safetensors model to an MLX folder, optionally
 * quantized (hearth_convert does the work), with a progress line on a terminal. */
#include "cli/cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *convert_usage =
    "hearth convert <model> --out <dir> [-q|--quantize] [--q-bits 4] [--q-group-size 64]\n"
    "       [--quant-predicate mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6]\n"
    "       [--target-bpw B --calibration-data F.jsonl [--candidate-bits 3,4,6,8] [--n-calibration 8]\n"
    "        [--calibration-length 256]]\n"
    "       hearth convert <model> --out <file.gguf> --outtype f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q6_k|q4_k_m\n"
    "       [--threads N]";

static void on_progress(void *user, size_t done, size_t total, const char *tensor) {
    (void)user;
    fprintf(stderr, "\r  %zu/%zu tensors  %-60.60s", done, total, tensor);
    if (done == total) fprintf(stderr, "\n");
}

int cli_convert_mixed(const char *model, hearth_convert_options o, double target_bpw, const int *cand, int n_cand,
                      const char *calib_path, int n_calib, int calib_len);

/* "3,4,6,8" -> ascending MLX widths; 0 on a bad list */
static int parse_candidates(const char *s, int *out, int cap) {
    int n = 0;
    for (char *end; *s && n < cap; s = *end == ',' ? end + 1 : end) {
        long b = strtol(s, &end, 10);
        if (end == s || (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8) || (n && b <= out[n - 1])) return 0;
        out[n++] = (int)b;
        if (!*end) return n;
        if (*end != ',') return 0;
    }
    return 0;
}

int cli_convert(int argc, char **argv) {
    const char *model = NULL, *calib = NULL, *cand_list = "3,4,6,8";
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
    if (target_bpw > 0) {
        int cand[6], n_cand = parse_candidates(cand_list, cand, 6);
        if (!o.quantize || o.quant_recipe || !calib)
            return cli_usage_error(convert_usage, "%s", "--target-bpw goes with -q and --calibration-data, no recipe");
        if (!n_cand)
            return cli_usage_error(convert_usage, "--candidate-bits '%s': ascending widths of 2,3,4,5,6,8", cand_list);
        if (n_calib < 1 || calib_len < 2)
            return cli_usage_error(convert_usage, "%s", "--n-calibration >= 1, --calibration-length >= 2");
        return cli_convert_mixed(model, o, target_bpw, cand, n_cand, calib, n_calib, calib_len);
    }
    hearth_error err = {0};
    if (hearth_convert(model, &o, &err)) return cli_fail(&err);
    printf("%s\n", o.out_dir);
    return 0;
}
