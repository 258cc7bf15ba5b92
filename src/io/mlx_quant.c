/* mlx_quant.c: MLX affine quantization: reads the quantization section of config.json
 * the way mlx-lm's load_model does, dequantizes packed uint32 weights bit-exactly
 * against mx.dequantize and quantizes float rows bit-exactly as mx.quantize (convert -q),
 * or with each group's scale and bias fitted to the least squared error (--target-bpw).
 * Reference code for loaders and tests; the fast matmul kernels live in backend/ and must
 * agree with mlxq_dequantize. */
#include "io/mlx_quant.h"
#include "base/err.h"
#include "base/half.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* mx.quantize accepts these (mlx 0.32: "supported group sizes are 32, 64, and 128";
 * bits 2..8 except 7). */
static int mlxq_bits_ok(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
static int mlxq_group_ok(int g) { return g == 32 || g == 64 || g == 128; }

/* Defaults mlx.nn's to_quantized uses for an affine layer whose params omit them
 * (_defaults_for_mode in mlx/nn/layers/quantized.py), not the config's top level. */
#define MLXQ_LAYER_DEFAULT_GROUP 64
#define MLXQ_LAYER_DEFAULT_BITS 4

/* Keys of the quantization section that are settings, not module paths. */
static int mlxq_is_setting_key(const char *k) {
    static const char *const keys[] = {"group_size", "bits", "mode", "quant_method", "global_scale",
                                       "quantize_input"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(k, keys[i]) == 0) return 1;
    return 0;
}

/* Reads group_size/bits/mode of one quantization object. `what` names it in errors. */
static hearth_status mlxq_read_params(const json_t *o, const char *fname, const char *what, int required, int *bits,
                                      int *group_size, const char **mode, hearth_error *err) {
    json_t *jb = json_object_get(o, "bits"), *jg = json_object_get(o, "group_size");
    json_t *jm = json_object_get(o, "mode");
    if ((jb && !json_is_integer(jb)) || (jg && !json_is_integer(jg)))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: %s: \"bits\" and \"group_size\" must be integers", fname, what);
    if (required && (!jb || !jg))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: %s: needs both \"bits\" and \"group_size\"", fname, what);
    if (jm && !json_is_string(jm))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: %s: \"mode\" must be a string", fname, what);
    *mode = jm ? json_string_value(jm) : "affine";
    if (strcmp(*mode, "affine") != 0)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: %s: quantization mode '%s' is not supported (only affine)",
                       fname, what, *mode);
    json_int_t b = jb ? json_integer_value(jb) : MLXQ_LAYER_DEFAULT_BITS;
    json_int_t g = jg ? json_integer_value(jg) : MLXQ_LAYER_DEFAULT_GROUP;
    if (b < 0 || b > 64 || !mlxq_bits_ok((int)b))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: %s: %lld-bit quantization is not supported (2,3,4,5,6,8)",
                       fname, what, (long long)b);
    if (g < 0 || g > 1024 || !mlxq_group_ok((int)g))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: %s: group size %lld is not supported (32, 64, 128)",
                       fname, what, (long long)g);
    *bits = (int)b;
    *group_size = (int)g;
    return HEARTH_OK;
}

static int mlxq_cmp_override(const void *a, const void *b) {
    return strcmp(((const mlxq_override *)a)->path, ((const mlxq_override *)b)->path);
}

/* The section mlx-lm reads: "quantization" first; else "quantization_config" (also
 * inside "text_config", as load_model looks there too). */
static const json_t *mlxq_find_section(const json_t *config, const char **key) {
    const json_t *q = json_object_get(config, "quantization");
    *key = "quantization";
    if (q && !json_is_null(q)) return q;
    *key = "quantization_config";
    q = json_object_get(config, "quantization_config");
    if (q && !json_is_null(q) && !json_is_false(q)) return q;
    const json_t *tc = json_object_get(config, "text_config");
    q = tc ? json_object_get(tc, "quantization_config") : NULL;
    *key = "text_config.quantization_config";
    return q && !json_is_null(q) && !json_is_false(q) ? q : NULL;
}

static hearth_status mlxq_parse_overrides(const json_t *q, const char *fname, mlxq_config *c, hearth_error *err) {
    const char *key;
    json_t *val;
    c->overrides = calloc(json_object_size(q) + 1, sizeof *c->overrides);
    if (!c->overrides) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
    json_object_foreach((json_t *)q, key, val) {
        if (mlxq_is_setting_key(key)) continue;
        mlxq_override o = {0};
        if (json_is_boolean(val)) {
            /* true: nn.quantize's bool path, i.e. the top-level bits/group_size */
            o.quantized = json_is_true(val);
            o.bits = o.quantized ? c->bits : 0;
            o.group_size = o.quantized ? c->group_size : 0;
        } else if (json_is_object(val)) {
            char what[300];
            const char *mode;
            snprintf(what, sizeof what, "layer '%.250s'", key);
            hearth_status st = mlxq_read_params(val, fname, what, 0, &o.bits, &o.group_size, &mode, err);
            if (st != HEARTH_OK) return st;
            o.quantized = 1;
        } else {
            continue; /* other settings some converters add (strings, numbers) */
        }
        if (!(o.path = strdup(key))) return err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
        c->overrides[c->n_overrides++] = o;
    }
    qsort(c->overrides, c->n_overrides, sizeof *c->overrides, mlxq_cmp_override);
    return HEARTH_OK;
}

hearth_status mlxq_config_parse(const json_t *config, const char *fname, mlxq_config *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    if (!fname) fname = "config.json";
    if (!json_is_object(config)) return err_set(err, HEARTH_ERR_INVALID, "%s: config is not a JSON object", fname);
    const char *key;
    const json_t *q = mlxq_find_section(config, &key);
    if (!q) return HEARTH_OK;
    if (!json_is_object(q)) return err_set(err, HEARTH_ERR_FORMAT, "%s: \"%s\" is not a JSON object", fname, key);
    json_t *qm = json_object_get(q, "quant_method");
    if (qm && !json_is_string(qm)) return err_set(err, HEARTH_ERR_FORMAT, "%s: %s.quant_method is not a string", fname, key);
    /* Non-MLX checkpoints (awq, gptq, fp8, bitnet, ...) keep other tensor layouts. */
    if (qm && strcmp(json_string_value(qm), "mlx") != 0 && strcmp(json_string_value(qm), "affine") != 0)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: %s: quant_method '%s' is not supported (MLX affine only)",
                       fname, key, json_string_value(qm));
    const char *mode;
    hearth_status st = mlxq_read_params(q, fname, key, 1, &out->bits, &out->group_size, &mode, err);
    if (st == HEARTH_OK && !(out->mode = strdup(mode))) st = err_set(err, HEARTH_ERR_NOMEM, "%s: out of memory", fname);
    if (st == HEARTH_OK) st = mlxq_parse_overrides(q, fname, out, err);
    if (st != HEARTH_OK) {
        mlxq_config_free(out);
        return st;
    }
    out->present = 1;
    return HEARTH_OK;
}

void mlxq_config_free(mlxq_config *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_overrides; i++) free(c->overrides[i].path);
    free(c->overrides);
    free(c->mode);
    memset(c, 0, sizeof *c);
}

int mlxq_lookup(const mlxq_config *c, const char *path, int *bits, int *group_size) {
    if (!c || !c->present) return 0;
    size_t lo = 0, hi = c->n_overrides;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(c->overrides[mid].path, path);
        if (cmp == 0) {
            if (!c->overrides[mid].quantized) return 0;
            *bits = c->overrides[mid].bits;
            *group_size = c->overrides[mid].group_size;
            return 1;
        }
        if (cmp < 0) lo = mid + 1;
        else hi = mid;
    }
    *bits = c->bits;
    *group_size = c->group_size;
    return 1;
}

hearth_status mlxq_infer(const tensor_info *w, const tensor_info *scales, int64_t in_dims, int *bits,
                         int *group_size, hearth_error *err) {
    if (w->ndim < 1 || scales->ndim < 1 || in_dims <= 0)
        return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s': cannot infer quantization without shapes",
                       w->file ? w->file : "?", w->name ? w->name : "?");
    int64_t wc = w->shape[w->ndim - 1], sc = scales->shape[scales->ndim - 1];
    if (sc <= 0 || in_dims % sc || wc > INT64_MAX / 32 || (wc * 32) % in_dims)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': shape does not fit %lld input columns",
                       w->file ? w->file : "?", w->name ? w->name : "?", (long long)in_dims);
    int64_t g = in_dims / sc, b = wc * 32 / in_dims;
    if (g > 1024 || b > 64 || !mlxq_group_ok((int)g) || !mlxq_bits_ok((int)b))
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s': inferred %lld bits, group size %lld unsupported",
                       w->file ? w->file : "?", w->name ? w->name : "?", (long long)b, (long long)g);
    *bits = (int)b;
    *group_size = (int)g;
    return HEARTH_OK;
}

/* ---- dequantization ------------------------------------------------------------ */

static const char *mlxq_tname(const tensor_info *t) { return t->name ? t->name : "?"; }
static const char *mlxq_fname(const tensor_info *t) { return t->file ? t->file : "<memory>"; }

static void mlxq_shape_str(const tensor_info *t, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* The tensor holds at least its shape's worth of bytes and has data to read. */
static hearth_status mlxq_check_bytes(const tensor_info *t, hearth_error *err) {
    uint64_t n = tensor_elems(t);
    int zero_dim = 0;
    for (int i = 0; i < t->ndim; i++) zero_dim |= t->shape[i] == 0;
    uint64_t need = tensor_dtype_nbytes(t->dtype, n);
    if ((!n && !zero_dim) || (n && !need))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': invalid shape", mlxq_fname(t), mlxq_tname(t));
    if (t->nbytes < need || (need && !t->data))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': %llu bytes of data, shape needs %llu",
                       mlxq_fname(t), mlxq_tname(t), (unsigned long long)t->nbytes, (unsigned long long)need);
    return HEARTH_OK;
}

/* scales/biases must be the weight's leading dims plus [n_groups]. */
static hearth_status mlxq_check_side(const tensor_info *w, const tensor_info *s, int64_t n_groups,
                                     hearth_error *err) {
    int ok = s->ndim == w->ndim && s->shape[s->ndim - 1] == n_groups;
    for (int i = 0; ok && i + 1 < w->ndim; i++) ok = s->shape[i] == w->shape[i];
    if (!ok) {
        char ws[160], ss[160];
        mlxq_shape_str(w, ws, sizeof ws);
        mlxq_shape_str(s, ss, sizeof ss);
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': shape %s does not match weight '%s' %s (%lld groups per row)",
                       mlxq_fname(s), mlxq_tname(s), ss, mlxq_tname(w), ws, (long long)n_groups);
    }
    if (s->dtype != DT_F32 && s->dtype != DT_F16 && s->dtype != DT_BF16)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s, expected F32, F16 or BF16",
                       mlxq_fname(s), mlxq_tname(s), tensor_dtype_name(s->dtype));
    return mlxq_check_bytes(s, err);
}

static float mlxq_load_param(const uint8_t *p, tensor_dtype dt, uint64_t i) {
    if (dt == DT_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2); /* little-endian host assumed, as everywhere in io/ */
    return dt == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* Unpacks one group: element j sits at bit j*bits of a little-endian bit stream (the
 * uint32 words are little-endian, and so are the bits within them); checked against
 * mx.quantize for every bit width, including 3/5/6 where elements straddle words. */
static void mlxq_unpack_group(const uint8_t *src, int bits, int n, uint8_t *q) {
    unsigned mask = (1u << bits) - 1u;
    if (bits == 8) {
        memcpy(q, src, (size_t)n);
        return;
    }
    size_t nbytes = (size_t)n * (size_t)bits / 8;
    for (int j = 0; j < n; j++) {
        size_t o = (size_t)j * (size_t)bits, byte = o >> 3;
        unsigned v = src[byte];
        if (byte + 1 < nbytes) v |= (unsigned)src[byte + 1] << 8;
        q[j] = (uint8_t)((v >> (o & 7)) & mask);
    }
}

/* mx.dequantize computes in the scales' dtype: w = T(T(scale * q) + bias), each op done
 * in float32 and rounded to T (for f16/bf16 that equals correctly rounded T math, as
 * float32 has more than 2p+2 bits). The multiply and add must stay separate roundings,
 * so GCC must not contract them into an fma. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static void mlxq_apply(const uint8_t *q, int n, float s, float b, tensor_dtype dt, float *out) {
    for (int j = 0; j < n; j++) {
        float p = s * (float)q[j];
        if (dt == DT_F16) p = f16_to_f32(f32_to_f16(p));
        else if (dt == DT_BF16) p = bf16_to_f32(f32_to_bf16(p));
        float r = p + b;
        if (dt == DT_F16) r = f16_to_f32(f32_to_f16(r));
        else if (dt == DT_BF16) r = bf16_to_f32(f32_to_bf16(r));
        out[j] = r;
    }
}

hearth_status mlxq_dequantize(const tensor_info *w, const tensor_info *scales, const tensor_info *biases, int bits,
                              int group_size, float *out, uint64_t out_elems, hearth_error *err) {
    if (!w || !scales || !biases || (!out && out_elems))
        return err_set(err, HEARTH_ERR_INVALID, "mlxq_dequantize: weight, scales, biases and output are required");
    if (!mlxq_bits_ok(bits) || !mlxq_group_ok(group_size))
        return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s': unsupported %d bits / group size %d",
                       mlxq_fname(w), mlxq_tname(w), bits, group_size);
    if (w->dtype != DT_U32)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': quantized weight has dtype %s, expected U32",
                       mlxq_fname(w), mlxq_tname(w), tensor_dtype_name(w->dtype));
    if (w->ndim < 1 || w->ndim > TENSOR_MAX_DIMS)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': quantized weight needs at least one dimension",
                       mlxq_fname(w), mlxq_tname(w));
    hearth_status st = mlxq_check_bytes(w, err);
    if (st != HEARTH_OK) return st;
    int64_t words = w->shape[w->ndim - 1];
    /* 32-bit words per row times 32/bits elements; a row is whole groups of >=32 elements */
    if (words > INT64_MAX / 32 || (words * 32) % bits || ((words * 32) / bits) % group_size)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: tensor '%s': last dimension %lld words is not whole %d-element groups at %d bits",
                       mlxq_fname(w), mlxq_tname(w), (long long)words, group_size, bits);
    int64_t cols = words * 32 / bits, n_groups = cols / group_size;
    uint64_t rows = words ? tensor_elems(w) / (uint64_t)words : 1;
    for (int i = 0; !words && i + 1 < w->ndim; i++) rows *= (uint64_t)w->shape[i];
    if ((st = mlxq_check_side(w, scales, n_groups, err)) != HEARTH_OK) return st;
    if ((st = mlxq_check_side(w, biases, n_groups, err)) != HEARTH_OK) return st;
    if (scales->dtype != biases->dtype)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': dtype %s differs from scales '%s' dtype %s",
                       mlxq_fname(biases), mlxq_tname(biases), tensor_dtype_name(biases->dtype), mlxq_tname(scales),
                       tensor_dtype_name(scales->dtype));
    if (cols && rows > UINT64_MAX / (uint64_t)cols)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: tensor '%s': too large", mlxq_fname(w), mlxq_tname(w));
    if (out_elems != rows * (uint64_t)cols)
        return err_set(err, HEARTH_ERR_INVALID, "%s: tensor '%s': output has %llu elements, dequantized size is %llu",
                       mlxq_fname(w), mlxq_tname(w), (unsigned long long)out_elems,
                       (unsigned long long)(rows * (uint64_t)cols));
    size_t group_bytes = (size_t)group_size * (size_t)bits / 8, row_bytes = (size_t)words * 4;
    uint8_t q[128]; /* largest group size */
    for (uint64_t r = 0; r < rows; r++) {
        const uint8_t *src = w->data + r * row_bytes;
        for (int64_t g = 0; g < n_groups; g++) {
            uint64_t gi = r * (uint64_t)n_groups + (uint64_t)g;
            float s = mlxq_load_param(scales->data, scales->dtype, gi);
            float b = mlxq_load_param(biases->data, biases->dtype, gi);
            mlxq_unpack_group(src + (size_t)g * group_bytes, bits, group_size, q);
            mlxq_apply(q, group_size, s, b, scales->dtype, out + r * (uint64_t)cols + (uint64_t)g * group_size);
        }
    }
    return HEARTH_OK;
}

/* Codes of x (each the nearest to scale * code + bias, clamped to the width) into the row's
 * bit stream at value index pos. */
static void mlxq_pack_group(const float *x, int n, int bits, float scale, float bias, uint8_t *out, size_t pos) {
    const float n_bins = (float)((1 << bits) - 1);
    for (int j = 0; j < n; j++) {
        float q = scale != 0 ? rintf((x[j] - bias) / scale) : 0;
        unsigned code = q < 0 ? 0u : q > n_bins ? (unsigned)n_bins : (unsigned)q;
        size_t bit = (pos + (size_t)j) * (size_t)bits;
        unsigned v = code << (bit & 7); /* spans at most two bytes for bits <= 8 */
        out[bit >> 3] |= (uint8_t)v;
        if (v >> 8) out[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
    }
}

/* mlx's affine_quantize, op for op in float32 whatever the weight's dtype (mlx 0.32
 * rounds only the scales and biases it returns, to that dtype): the scale spans the
 * group's range over 2^bits - 1 steps, signed so that the larger-magnitude edge maps
 * exactly to a code (q0), then refit so that edge is hit exactly; the bias is that edge. */
void mlxq_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group_size, uint8_t *packed,
                   float *scales, float *biases) {
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    int64_t groups = cols / group_size;
    size_t row_bytes = (size_t)cols * (size_t)bits / 8;
    memset(packed, 0, (size_t)rows * row_bytes);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *out = packed + (size_t)r * row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            const float *x = w + r * cols + g * group_size;
            float hi = x[0], lo = x[0];
            for (int j = 1; j < group_size; j++) {
                hi = x[j] > hi ? x[j] : hi;
                lo = x[j] < lo ? x[j] : lo;
            }
            int low_edge = fabsf(lo) > fabsf(hi);
            float scale = (hi - lo) / n_bins;
            scale = scale > eps ? scale : eps;
            if (!low_edge) scale = -scale;
            float edge = low_edge ? lo : hi, q0 = rintf(edge / scale);
            if (q0 != 0) scale = edge / q0;
            float bias = q0 == 0 ? 0.0f : edge;
            scales[r * groups + g] = scale;
            biases[r * groups + g] = bias;
            mlxq_pack_group(x, group_size, bits, scale, bias, out, (size_t)g * group_size);
        }
    }
}

/* A float rounded to the scales' and biases' stored dtype, back in float32. */
static float mlxq_round_param(float v, tensor_dtype dt) {
    return dt == DT_F16 ? f16_to_f32(f32_to_f16(v)) : dt == DT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

/* Squared error of x against scale * code + bias with each code the nearest in range;
 * with sums, also the least-squares (scale, bias) for those codes. */
typedef struct mlxq_fit_sums {
    double err, sq, sqq, sqx, sx;
} mlxq_fit_sums;

static mlxq_fit_sums mlxq_fit_eval(const float *x, int n, float n_bins, float scale, float bias) {
    mlxq_fit_sums s = {0};
    for (int j = 0; j < n; j++) {
        float q = scale != 0 ? rintf((x[j] - bias) / scale) : 0;
        q = q < 0 ? 0 : q > n_bins ? n_bins : q;
        double d = (double)scale * q + bias - x[j];
        s.err += d * d, s.sq += q, s.sqq += (double)q * q, s.sqx += (double)q * x[j], s.sx += x[j];
    }
    return s;
}

/* Number of starting steps tried per group: the range over n_bins + k/4 steps for k in
 * [-2, 5] (a narrower step than min/max's clips the extremes to fit the middle finer, a
 * wider one leaves room past them); each start then takes MLXQ_FIT_ROUNDS least-squares
 * refits of its codes. A small search, not a tuned one: `hearth convert` of SmolLM2-135M
 * takes about 14 s with it (1.2 s without), and the error it leaves is 0.71-0.90 of
 * mx.quantize's on bell-shaped weights (tests/unit/test_mlx_quant.c). */
#define MLXQ_FIT_STARTS 8
#define MLXQ_FIT_ROUNDS 2

void mlxq_quantize_fit(const float *w, int64_t rows, int64_t cols, int bits, int group_size, tensor_dtype dt,
                       uint8_t *packed, float *scales, float *biases) {
    const float n_bins = (float)((1 << bits) - 1);
    int64_t groups = cols / group_size;
    size_t row_bytes = (size_t)cols * (size_t)bits / 8;
    mlxq_quantize(w, rows, cols, bits, group_size, packed, scales,
                  biases); /* mx.quantize's answer: the first candidate */
    memset(packed, 0, (size_t)rows * row_bytes);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float *x = w + r * cols + g * group_size;
            float *ps = &scales[r * groups + g], *pb = &biases[r * groups + g];
            float best_s = mlxq_round_param(*ps, dt), best_b = mlxq_round_param(*pb, dt);
            double best = mlxq_fit_eval(x, group_size, n_bins, best_s, best_b).err;
            float hi = x[0], lo = x[0];
            for (int j = 1; j < group_size; j++) {
                hi = x[j] > hi ? x[j] : hi;
                lo = x[j] < lo ? x[j] : lo;
            }
            for (int k = 0; hi > lo && k < MLXQ_FIT_STARTS; k++) {
                float scale = (hi - lo) / (n_bins + 0.25f * (float)(k - 2)), bias = lo;
                for (int round = 0; round <= MLXQ_FIT_ROUNDS; round++) {
                    scale = mlxq_round_param(scale, dt), bias = mlxq_round_param(bias, dt);
                    mlxq_fit_sums s = mlxq_fit_eval(x, group_size, n_bins, scale, bias);
                    if (s.err < best) best = s.err, best_s = scale, best_b = bias;
                    double det = group_size * s.sqq - s.sq * s.sq;
                    if (round == MLXQ_FIT_ROUNDS || det <= 0) break;
                    scale = (float)((group_size * s.sqx - s.sq * s.sx) / det);
                    bias = (float)((s.sx - scale * s.sq) / group_size);
                }
            }
            *ps = best_s, *pb = best_b;
            mlxq_pack_group(x, group_size, bits, best_s, best_b, packed + (size_t)r * row_bytes,
                            (size_t)g * group_size);
        }
}
