/* safetensors_write.c: the safetensors header writer (see safetensors_write.h). The
 * reader (safetensors.c) is the check: every file written here must parse there. */
#include "io/safetensors_write.h"
#include "base/err.h"
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

uint64_t st_out_nbytes(const st_out_tensor *t) {
    tensor_info info = {.dtype = t->dtype, .ndim = t->ndim};
    memcpy(info.shape, t->shape, sizeof info.shape);
    return tensor_dtype_nbytes(t->dtype, tensor_elems(&info));
}

hearth_status st_write_header(FILE *f, const char *fname, const st_out_tensor *t, size_t n, uint64_t *data_bytes,
                              hearth_error *err) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "mlx"));
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        uint64_t nb = st_out_nbytes(&t[i]);
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", tensor_dtype_name(t[i].dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    char *js = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!js) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory for the header", fname);
    size_t len = strlen(js), padded = (len + 7) / 8 * 8; /* the data starts 8-byte aligned */
    uint64_t hl = padded;
    int bad = fwrite(&hl, 8, 1, f) != 1 || fwrite(js, 1, len, f) != len;
    for (size_t i = len; !bad && i < padded; i++) bad = fputc(' ', f) == EOF;
    free(js);
    if (bad) return err_set(err, HEARTH_ERR_IO, "%s: %s", fname, strerror(errno));
    *data_bytes = off;
    return HEARTH_OK;
}
