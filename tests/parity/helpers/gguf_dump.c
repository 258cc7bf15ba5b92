/* gguf_dump.c: test helper that exposes hearth's GGUF reader and (de)quantizers to
 * the Python parity tests. It only prints what libhearth computed; the tests hold
 * the expected values (from the gguf package), never this program.
 *   gguf_dump FILE meta                  -> JSON: version, alignment, metadata, tensors
 *   gguf_dump FILE tensor NAME OUT       -> NAME dequantized to raw float32 in OUT
 *   gguf_dump quantize TYPE IN OUT       -> raw float32 IN quantized to TYPE in OUT */
#include "io/ggml_quant.h"
#include "io/gguf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const hearth_error *e) {
    fprintf(stderr, "gguf_dump: %s: %s: %s\n", what, hearth_status_name(e->status), e->message);
    return 1;
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f)) {
        fprintf(stderr, "gguf_dump: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

static int dump_meta(const gguf_file *g) {
    json_t *root = json_object(), *tensors = json_array();
    json_object_set_new(root, "version", json_integer(g->version));
    json_object_set_new(root, "alignment", json_integer((json_int_t)g->alignment));
    json_object_set_new(root, "data_offset", json_integer((json_int_t)g->data_offset));
    json_object_set_new(root, "metadata", gguf_metadata_json(g, UINT64_MAX));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tensor_info *t = &g->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(tensors, json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", t->name, "dtype",
                                                 tensor_dtype_name(t->dtype), "shape", shape, "nbytes",
                                                 (json_int_t)t->nbytes, "offset", /* within the data section */
                                                 (json_int_t)(t->data - g->map.data - g->data_offset)));
    }
    json_object_set_new(root, "tensors", tensors);
    char *s = json_dumps(root, JSON_COMPACT);
    if (!s) return 1;
    puts(s);
    free(s);
    json_decref(root);
    return 0;
}

static int dump_tensor(const gguf_file *g, const char *name, const char *out) {
    const tensor_info *t = gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "gguf_dump: no tensor '%s'\n", name);
        return 1;
    }
    uint64_t n = tensor_elems(t);
    float *dst = malloc(n ? n * sizeof(float) : 1);
    hearth_error e = {0};
    if (!dst) return 1;
    if (ggml_dequantize(t->dtype, t->data, t->nbytes, dst, n, &e)) return fail(name, &e);
    int rc = write_file(out, dst, n * sizeof(float));
    free(dst);
    return rc;
}

static int quantize(const char *type, const char *in, const char *out) {
    tensor_dtype t = DT_COUNT;
    for (int i = 0; i < DT_COUNT; i++)
        if (!strcmp(tensor_dtype_name((tensor_dtype)i), type)) t = (tensor_dtype)i;
    char *buf;
    size_t len;
    hearth_error e = {0};
    if (file_read_all(in, &buf, &len, &e)) return fail(in, &e);
    uint64_t n = len / sizeof(float), nbytes = tensor_dtype_nbytes(t, n);
    float *src = malloc(len ? len : 1);
    uint8_t *dst = malloc(nbytes ? nbytes : 1);
    if (!src || !dst) return 1;
    memcpy(src, buf, len);
    if (ggml_quantize(t, src, n, dst, nbytes, &e)) return fail(type, &e);
    int rc = write_file(out, dst, nbytes);
    free(buf), free(src), free(dst);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "quantize")) return quantize(argv[2], argv[3], argv[4]);
    if (argc < 3) {
        fprintf(stderr, "usage: gguf_dump FILE meta | FILE tensor NAME OUT | quantize TYPE IN OUT\n");
        return 2;
    }
    gguf_file g;
    hearth_error e = {0};
    if (gguf_open(argv[1], &g, &e)) return fail(argv[1], &e);
    int rc = 2;
    if (!strcmp(argv[2], "meta")) rc = dump_meta(&g);
    else if (!strcmp(argv[2], "tensor") && argc == 5) rc = dump_tensor(&g, argv[3], argv[4]);
    gguf_close(&g);
    return rc;
}
