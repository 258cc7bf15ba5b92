/* tensor.h: the tensor catalog shared by every model file format (safetensors, GGUF).
 * A catalog only describes tensors and points into mapped file bytes; it never
 * computes. Shapes are in numpy/safetensors order: shape[0] is the outermost
 * dimension and shape[ndim-1] the contiguous one (GGUF's ne[] is reversed on load). */
#ifndef HEARTH_IO_TENSOR_H
#define HEARTH_IO_TENSOR_H
#include "hearth.h"
#include <stddef.h>
#include <stdint.h>

typedef enum tensor_dtype {
    DT_F32, DT_F16, DT_BF16, DT_F64,
    DT_I8, DT_U8, DT_I16, DT_U16, DT_I32, DT_U32, DT_I64, DT_U64, DT_BOOL,
    /* GGUF block-quantized types */
    DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0,
    DT_Q2_K, DT_Q3_K, DT_Q4_K, DT_Q5_K, DT_Q6_K,
    DT_COUNT,
    /* not a file format: the CUDA backend's device layout for the quantized formats it
     * keeps as n-bit codes with an f32 (scale, bias) per group (backend/cuda/cuda_affine.h) */
    DT_AFFINE
} tensor_dtype;

#define TENSOR_MAX_DIMS 8

typedef struct tensor_info {
    char *name;
    tensor_dtype dtype;
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];
    const uint8_t *data; /* points into the mapped file */
    uint64_t nbytes;
    const char *file;    /* the file it lives in, for error messages */
} tensor_info;

/* Elements per block and bytes per block of a dtype (1 and sizeof for plain types). */
int tensor_dtype_block_elems(tensor_dtype t);
int tensor_dtype_block_bytes(tensor_dtype t);
const char *tensor_dtype_name(tensor_dtype t);
/* Bytes a tensor of n elements takes, or 0 when n is not a whole number of blocks
 * or the size overflows. */
uint64_t tensor_dtype_nbytes(tensor_dtype t, uint64_t n_elems);
/* Product of the shape, 0 on overflow. */
uint64_t tensor_elems(const tensor_info *t);
#endif
