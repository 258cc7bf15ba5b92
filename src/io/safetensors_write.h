/* safetensors_write.h: writing a safetensors file one tensor at a time: the header first
 * (every name, dtype, shape and offset, known before any data), then each tensor's bytes
 * in the order given. Holds no tensor data itself. */
#ifndef HEARTH_IO_SAFETENSORS_WRITE_H
#define HEARTH_IO_SAFETENSORS_WRITE_H
#include "io/tensor.h"
#include <stdio.h>

typedef struct st_out_tensor {
    char *name;
    tensor_dtype dtype; /* a plain dtype (F32, F16, BF16, U32, ...) */
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];
} st_out_tensor;

/* Bytes of one tensor's data (0 on overflow). */
uint64_t st_out_nbytes(const st_out_tensor *t);
/* Writes the 8-byte length, the JSON header (with "__metadata__": {"format": "mlx"}) padded
 * to 8 bytes; the caller then writes each tensor's st_out_nbytes in order. *data_bytes: the
 * sum of those. */
hearth_status st_write_header(FILE *f, const char *fname, const st_out_tensor *t, size_t n, uint64_t *data_bytes,
                              hearth_error *err);
#endif
