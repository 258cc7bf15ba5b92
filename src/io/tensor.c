/* tensor.c: dtype tables for the tensor catalog (see tensor.h). Block sizes are the
 * GGML ones (ggml-common.h): 32-element blocks for Q4_0..Q8_0, 256 for k-quants. */
#include "io/tensor.h"

static const struct { const char *name; int elems, bytes; } dtype_table[DT_COUNT] = {
    [DT_F32] = {"F32", 1, 4},   [DT_F16] = {"F16", 1, 2},   [DT_BF16] = {"BF16", 1, 2},
    [DT_F64] = {"F64", 1, 8},   [DT_I8] = {"I8", 1, 1},     [DT_U8] = {"U8", 1, 1},
    [DT_I16] = {"I16", 1, 2},   [DT_U16] = {"U16", 1, 2},   [DT_I32] = {"I32", 1, 4},
    [DT_U32] = {"U32", 1, 4},   [DT_I64] = {"I64", 1, 8},   [DT_U64] = {"U64", 1, 8},
    [DT_BOOL] = {"BOOL", 1, 1},
    [DT_Q4_0] = {"Q4_0", 32, 18},  [DT_Q4_1] = {"Q4_1", 32, 20},  [DT_Q5_0] = {"Q5_0", 32, 22},
    [DT_Q5_1] = {"Q5_1", 32, 24},  [DT_Q8_0] = {"Q8_0", 32, 34},  [DT_Q2_K] = {"Q2_K", 256, 84},
    [DT_Q3_K] = {"Q3_K", 256, 110}, [DT_Q4_K] = {"Q4_K", 256, 144}, [DT_Q5_K] = {"Q5_K", 256, 176},
    [DT_Q6_K] = {"Q6_K", 256, 210},
};

int tensor_dtype_block_elems(tensor_dtype t) { return (unsigned)t < DT_COUNT ? dtype_table[t].elems : 0; }
int tensor_dtype_block_bytes(tensor_dtype t) { return (unsigned)t < DT_COUNT ? dtype_table[t].bytes : 0; }
const char *tensor_dtype_name(tensor_dtype t) {
    if (t == DT_AFFINE) return "affine";
    return (unsigned)t < DT_COUNT ? dtype_table[t].name : "?";
}

uint64_t tensor_dtype_nbytes(tensor_dtype t, uint64_t n) {
    int be = tensor_dtype_block_elems(t), bb = tensor_dtype_block_bytes(t);
    if (be <= 0 || n % (uint64_t)be) return 0;
    uint64_t blocks = n / (uint64_t)be;
    if (blocks > UINT64_MAX / (uint64_t)bb) return 0;
    return blocks * (uint64_t)bb;
}

uint64_t tensor_elems(const tensor_info *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) return 0;
        uint64_t d = (uint64_t)t->shape[i];
        if (d && n > UINT64_MAX / d) return 0;
        n *= d;
    }
    return n;
}
