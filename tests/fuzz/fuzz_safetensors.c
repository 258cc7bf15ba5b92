/* fuzz_safetensors.c: libFuzzer target for st_parse. Any input must parse or fail with
 * an error, never crash or read out of bounds; a parsed catalog must point inside the
 * input, and every MLX-looking weight/scales/biases triple goes through the dequantizer. */
#include "io/mlx_quant.h"
#include "io/safetensors.h"
#include <stdlib.h>
#include <string.h>

/* Tries mlxq_dequantize on tensors i, i+1, i+2 as weight/scales/biases with every
 * bits/group pair; shape errors are fine, crashes are not. */
static void try_dequant(const st_file *f, size_t i) {
    const tensor_info *w = &f->tensors[i], *s = &f->tensors[i + 1], *b = &f->tensors[i + 2];
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    uint64_t elems = tensor_elems(w);
    if (elems > (1u << 16)) return; /* keep the fuzzer fast; sizes are checked before use */
    float *out = malloc((elems ? elems : 1) * 16 * sizeof *out);
    if (!out) return;
    for (int bi = 0; bi < 6; bi++)
        for (int group = 32; group <= 128; group *= 2) {
            hearth_error err;
            mlxq_dequantize(w, s, b, bitss[bi], group, out, elems * 32 / (uint64_t)bitss[bi], &err);
        }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a heap copy of exactly `size` bytes so ASan catches any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    st_file f;
    hearth_error err;
    if (st_parse(buf, size, "fuzz.safetensors", &f, &err) == HEARTH_OK) {
        for (size_t i = 0; i < f.n_tensors; i++) {
            const tensor_info *t = &f.tensors[i];
            if (t->nbytes && (t->data < buf || t->data + t->nbytes > buf + size)) abort();
            volatile uint8_t sink = 0;
            for (uint64_t k = 0; k < t->nbytes; k++) sink ^= t->data[k];
            (void)sink;
        }
        for (size_t i = 0; i + 2 < f.n_tensors; i++) try_dequant(&f, i);
        st_close(&f);
    }
    free(buf);
    return 0;
}
