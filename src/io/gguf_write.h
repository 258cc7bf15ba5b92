/* gguf_write.h: writing a GGUF v3 file: metadata and tensor infos are collected first,
 * then written as the header; the caller streams each tensor's data after it, in the
 * order added, each padded to the alignment (32). Holds no tensor data itself. */
#ifndef HEARTH_IO_GGUF_WRITE_H
#define HEARTH_IO_GGUF_WRITE_H
#include "base/sbuf.h"
#include "io/tensor.h"
#include <stdio.h>

#define GGUF_OUT_ALIGNMENT 32 /* GGUF's default general.alignment */

typedef struct gguf_out {
    sbuf kv, infos;
    uint64_t n_kv, n_tensors, data_bytes;
} gguf_out;

void gguf_out_init(gguf_out *o);
void gguf_out_free(gguf_out *o);
void gguf_out_str(gguf_out *o, const char *key, const char *value);
void gguf_out_u32(gguf_out *o, const char *key, uint32_t value);
void gguf_out_f32(gguf_out *o, const char *key, float value);
void gguf_out_bool(gguf_out *o, const char *key, int value);
void gguf_out_strs(gguf_out *o, const char *key, const char *const *values, size_t n);
void gguf_out_i32s(gguf_out *o, const char *key, const int32_t *values, size_t n);
/* Adds a tensor (shape in numpy order; F32, F16, BF16, Q4_0..Q8_0); returns its data
 * size in bytes, 0 for a dtype GGUF cannot hold or a size that is not whole blocks. */
uint64_t gguf_out_tensor(gguf_out *o, const char *name, tensor_dtype dt, int ndim, const int64_t *shape);
hearth_status gguf_out_write_header(gguf_out *o, FILE *f, const char *fname, hearth_error *err);
/* Writes the zero bytes that follow a tensor of nbytes. */
hearth_status gguf_out_pad(FILE *f, uint64_t nbytes, const char *fname, hearth_error *err);
#endif
