/* st_dequant.c: test helper for tests/parity/test_mlx_dequant.py. Opens a folder of
 * safetensors with st_set_open and writes the float32 dequantization of MLX-quantized
 * weights to OUTDIR/<prefix>.f32 (raw little-endian), one line per tensor on stdout.
 *   st_dequant DIR OUTDIR PREFIX:BITS:GROUP...   explicit parameters
 *   st_dequant DIR OUTDIR                        every "<prefix>.scales", with
 *                                                bits/group from DIR/config.json
 *   st_dequant --list DIR                        the catalog: name dtype shape file
 *                                                offset nbytes, one tensor a line */
#define _GNU_SOURCE /* memrchr */
#include "base/file.h"
#include "io/mlx_quant.h"
#include "io/safetensors.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int dequant_one(const st_set *set, const char *outdir, const char *prefix, int bits, int group) {
    char name[1024];
    const tensor_info *t[3];
    const char *suffix[3] = {"weight", "scales", "biases"};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.%s", prefix, suffix[i]);
        if (!(t[i] = st_set_find(set, name))) {
            fprintf(stderr, "st_dequant: tensor '%s' not found\n", name);
            return 1;
        }
    }
    uint64_t rows = 1;
    for (int i = 0; i + 1 < t[0]->ndim; i++) rows *= (uint64_t)t[0]->shape[i];
    uint64_t cols = (uint64_t)t[0]->shape[t[0]->ndim - 1] * 32 / (uint64_t)bits;
    uint64_t n = rows * cols;
    float *out = malloc((n ? n : 1) * sizeof *out);
    hearth_error err = {0};
    if (!out || mlxq_dequantize(t[0], t[1], t[2], bits, group, out, rows * cols, &err) != HEARTH_OK) {
        fprintf(stderr, "st_dequant: %s\n", out ? err.message : "out of memory");
        free(out);
        return 1;
    }
    snprintf(name, sizeof name, "%s/%s.f32", outdir, prefix);
    FILE *f = fopen(name, "wb");
    int bad = !f || fwrite(out, sizeof *out, rows * cols, f) != rows * cols;
    if (f && fclose(f)) bad = 1;
    free(out);
    if (bad) {
        fprintf(stderr, "st_dequant: cannot write %s\n", name);
        return 1;
    }
    printf("%s %d %d %llu %llu\n", prefix, bits, group, (unsigned long long)rows, (unsigned long long)cols);
    return 0;
}

static int from_config(const st_set *set, const char *dir, const char *outdir) {
    char *cfg_path = path_join(dir, "config.json");
    json_error_t jerr;
    json_t *cfg = json_load_file(cfg_path, 0, &jerr);
    free(cfg_path);
    if (!cfg) {
        fprintf(stderr, "st_dequant: config.json: %s\n", jerr.text);
        return 1;
    }
    mlxq_config qc;
    hearth_error err = {0};
    int rc = 0;
    if (mlxq_config_parse(cfg, "config.json", &qc, &err) != HEARTH_OK) {
        fprintf(stderr, "st_dequant: %s\n", err.message);
        json_decref(cfg);
        return 1;
    }
    for (size_t i = 0; rc == 0 && i < set->n_tensors; i++) {
        const char *n = set->by_name[i]->name;
        size_t l = strlen(n);
        if (l < 8 || strcmp(n + l - 7, ".scales") != 0) continue;
        char prefix[1024];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(l - 7), n);
        int bits, group;
        if (!mlxq_lookup(&qc, prefix, &bits, &group)) {
            fprintf(stderr, "st_dequant: '%s' has scales but the config says it is not quantized\n", prefix);
            rc = 1;
        } else {
            rc = dequant_one(set, outdir, prefix, bits, group);
        }
    }
    mlxq_config_free(&qc);
    json_decref(cfg);
    return rc;
}

static int list_set(const char *dir) {
    st_set set;
    hearth_error err = {0};
    if (st_set_open(dir, &set, &err) != HEARTH_OK) {
        fprintf(stderr, "st_dequant: %s\n", err.message);
        return 1;
    }
    for (size_t i = 0; i < set.n_files; i++) {
        const st_file *f = &set.files[i];
        const char *base = strrchr(f->path, '/');
        for (size_t j = 0; j < f->n_tensors; j++) {
            const tensor_info *t = &f->tensors[j];
            printf("%s %s ", t->name, tensor_dtype_name(t->dtype));
            for (int d = 0; d < t->ndim; d++) printf("%s%lld", d ? "," : "", (long long)t->shape[d]);
            printf("%s %s %llu %llu\n", t->ndim ? "" : "-", base ? base + 1 : f->path,
                   (unsigned long long)(t->data - f->map.data), (unsigned long long)t->nbytes);
        }
    }
    st_set_close(&set);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--list") == 0) return list_set(argv[2]);
    if (argc < 3) {
        fprintf(stderr, "usage: st_dequant DIR OUTDIR [PREFIX:BITS:GROUP...]\n");
        return 2;
    }
    st_set set;
    hearth_error err = {0};
    if (st_set_open(argv[1], &set, &err) != HEARTH_OK) {
        fprintf(stderr, "st_dequant: %s\n", err.message);
        return 1;
    }
    int rc = 0;
    if (argc == 3) rc = from_config(&set, argv[1], argv[2]);
    for (int i = 3; rc == 0 && i < argc; i++) {
        char prefix[1024];
        int bits, group;
        const char *c2 = strrchr(argv[i], ':');
        const char *c1 = c2 ? memrchr(argv[i], ':', (size_t)(c2 - argv[i])) : NULL;
        if (!c1 || sscanf(c1, ":%d:%d", &bits, &group) != 2) {
            fprintf(stderr, "st_dequant: bad spec '%s'\n", argv[i]);
            rc = 2;
            break;
        }
        snprintf(prefix, sizeof prefix, "%.*s", (int)(c1 - argv[i]), argv[i]);
        rc = dequant_one(&set, argv[2], prefix, bits, group);
    }
    st_set_close(&set);
    return rc;
}
