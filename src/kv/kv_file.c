/* kv_file.c: the saved-sequence file (kv_file.h): header encoding, bounds checks,
 * checksums. Every length and offset is checked against the buffer before use, so a
 * truncated, corrupted or foreign file is refused with a message naming it; fuzzed by
 * tests/fuzz/fuzz_kv_file.c. */
#include "kv/kv_file.h"
#include "base/err.h"
#include "kv/kv_cache.h"
#include <string.h>

/* Header offsets (little-endian); bytes 72..119 are zero, reserved for later versions. */
enum {
    OFF_VERSION = 8,
    OFF_HEADER_BYTES = 12,
    OFF_MODEL_ID = 16,
    OFF_QUANT = 24,
    OFF_LAYERS = 28,
    OFF_HEADS = 32,
    OFF_HEAD_DIM = 36,
    OFF_TOKENS = 40,
    OFF_STATE = 48,
    OFF_PAYLOAD = 56,
    OFF_PAYLOAD_SUM = 64,
    OFF_RESERVED = 72,
    OFF_HEADER_SUM = 120
};

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

/* Four independent multiply-rotate lanes over 32-byte stripes (the round of xxHash64,
 * whose constants these are): several GB/s, so checking a file costs little next to
 * reading it. */
#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t round64(uint64_t acc, uint64_t w) { return rotl(acc + w * P2, 31) * P1; }
static uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* host order: files are written and read on little-endian hosts (checked by the header) */
}

void kv_sum_init(kv_sum *s) {
    memset(s, 0, sizeof *s);
    s->lane[0] = P1 + P2;
    s->lane[1] = P2;
    s->lane[2] = 0;
    s->lane[3] = 0 - P1;
}

static void stripe(kv_sum *s, const uint8_t *p) {
    for (int i = 0; i < 4; i++) s->lane[i] = round64(s->lane[i], load64(p + 8 * i));
}

void kv_sum_feed(kv_sum *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->total += n;
    if (s->n_carry) {
        size_t k = 32 - s->n_carry < n ? 32 - s->n_carry : n;
        memcpy(s->carry + s->n_carry, p, k);
        s->n_carry += k;
        p += k;
        n -= k;
        if (s->n_carry < 32) return;
        stripe(s, s->carry);
        s->n_carry = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(s, p);
    memcpy(s->carry, p, n);
    s->n_carry = n;
}

uint64_t kv_sum_final(const kv_sum *s) {
    uint64_t h = rotl(s->lane[0], 1) + rotl(s->lane[1], 7) + rotl(s->lane[2], 12) + rotl(s->lane[3], 18);
    h ^= s->total * P3;
    for (size_t i = 0; i < s->n_carry; i++) h = rotl(h ^ (s->carry[i] * P1), 11) * P2;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    return h ^ (h >> 32);
}

static uint64_t sum_of(const void *data, size_t n) {
    kv_sum s;
    kv_sum_init(&s);
    kv_sum_feed(&s, data, n);
    return kv_sum_final(&s);
}

uint64_t kv_file_head_bytes(const kv_file_shape *s) {
    if (!kv_quant_known((int)s->kv_quant) || s->head_dim == 0 || s->head_dim > 65536) return 0;
    uint64_t row = (uint64_t)s->head_dim * kv_elem_bytes((int)s->kv_quant);
    uint64_t scale = kv_quant_scaled((int)s->kv_quant) ? sizeof(float) : 0;
    return 2 * (uint64_t)s->n_tokens * (row + scale); /* n_tokens < 2^32, row < 2^19: no overflow */
}

uint64_t kv_file_kv_bytes(const kv_file_shape *s) {
    uint64_t head = kv_file_head_bytes(s);
    if (!head || s->n_layers == 0 || s->n_layers > 4096 || s->n_kv_heads == 0 || s->n_kv_heads > 4096) return 0;
    return head * s->n_layers * s->n_kv_heads; /* < 2^52 * 2^24: checked below against the file size */
}

static void encode_header(uint8_t h[KV_FILE_HEADER_BYTES], const kv_file_shape *s, uint64_t payload,
                          uint64_t payload_sum) {
    memset(h, 0, KV_FILE_HEADER_BYTES);
    memcpy(h, KV_FILE_MAGIC, 8);
    put32(h + OFF_VERSION, KV_FILE_VERSION);
    put32(h + OFF_HEADER_BYTES, KV_FILE_HEADER_BYTES);
    put64(h + OFF_MODEL_ID, s->model_id);
    put32(h + OFF_QUANT, s->kv_quant);
    put32(h + OFF_LAYERS, s->n_layers);
    put32(h + OFF_HEADS, s->n_kv_heads);
    put32(h + OFF_HEAD_DIM, s->head_dim);
    put32(h + OFF_TOKENS, s->n_tokens);
    put64(h + OFF_STATE, s->state_bytes);
    put64(h + OFF_PAYLOAD, payload);
    put64(h + OFF_PAYLOAD_SUM, payload_sum);
    put64(h + OFF_HEADER_SUM, sum_of(h, OFF_HEADER_SUM));
}

hearth_status kv_file_parse(const uint8_t *data, size_t size, const char *name, kv_file_view *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    if (size < KV_FILE_HEADER_BYTES || memcmp(data, KV_FILE_MAGIC, 8))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: not a hearth KV file (no %s header)", name, KV_FILE_MAGIC);
    uint32_t version = get32(data + OFF_VERSION);
    if (version != KV_FILE_VERSION)
        return err_set(err, HEARTH_ERR_UNSUPPORTED, "%s: KV file version %u, this hearth reads version %u", name,
                       version, KV_FILE_VERSION);
    if (get32(data + OFF_HEADER_BYTES) != KV_FILE_HEADER_BYTES ||
        get64(data + OFF_HEADER_SUM) != sum_of(data, OFF_HEADER_SUM))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: the KV file's header is corrupted (checksum mismatch)", name);
    for (int i = OFF_RESERVED; i < OFF_HEADER_SUM; i++)
        if (data[i]) return err_set(err, HEARTH_ERR_FORMAT, "%s: reserved header bytes are not zero", name);
    kv_file_shape s = {.model_id = get64(data + OFF_MODEL_ID),
                       .kv_quant = get32(data + OFF_QUANT),
                       .n_layers = get32(data + OFF_LAYERS),
                       .n_kv_heads = get32(data + OFF_HEADS),
                       .head_dim = get32(data + OFF_HEAD_DIM),
                       .n_tokens = get32(data + OFF_TOKENS),
                       .state_bytes = get64(data + OFF_STATE)};
    uint64_t kv = kv_file_kv_bytes(&s);
    if (!kv && s.n_tokens)
        return err_set(err, HEARTH_ERR_FORMAT, "%s: KV layout out of range (format %u, %u layers, %u heads of %u)",
                       name, s.kv_quant, s.n_layers, s.n_kv_heads, s.head_dim);
    uint64_t avail = size - KV_FILE_HEADER_BYTES, tokens = (uint64_t)s.n_tokens * sizeof(int32_t);
    uint64_t payload = get64(data + OFF_PAYLOAD);
    if (s.n_tokens == 0) return err_set(err, HEARTH_ERR_FORMAT, "%s: the KV file holds no tokens", name);
    if (kv > avail || tokens > avail - kv || s.state_bytes > avail - kv - tokens ||
        payload != tokens + kv + s.state_bytes)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: truncated or inconsistent KV file: the header describes %llu payload bytes "
                       "(%u tokens), the file has %llu",
                       name, (unsigned long long)(tokens + kv + s.state_bytes), s.n_tokens, (unsigned long long)avail);
    if (payload != avail)
        return err_set(err, HEARTH_ERR_FORMAT,
                       "%s: %llu bytes after the KV file's payload of %llu (truncated "
                       "header or concatenated files?)",
                       name, (unsigned long long)(avail - payload), (unsigned long long)payload);
    const uint8_t *p = data + KV_FILE_HEADER_BYTES;
    if (sum_of(p, payload) != get64(data + OFF_PAYLOAD_SUM))
        return err_set(err, HEARTH_ERR_FORMAT, "%s: the KV file's data is corrupted (checksum mismatch)", name);
    for (uint32_t i = 0; i < s.n_tokens; i++)
        if ((int32_t)get32(p + 4 * (size_t)i) < 0)
            return err_set(err, HEARTH_ERR_FORMAT, "%s: token %u has a negative id", name, i);
    out->shape = s;
    out->tokens_unaligned = (const int32_t *)(const void *)p;
    out->kv = p + tokens;
    out->state = p + tokens + kv;
    return HEARTH_OK;
}

void kv_file_begin(kv_file_writer *w, FILE *f, const kv_file_shape *s) {
    memset(w, 0, sizeof *w);
    w->f = f;
    w->shape = *s;
    kv_sum_init(&w->sum);
    uint8_t h[KV_FILE_HEADER_BYTES] = {0};
    w->failed = fwrite(h, 1, sizeof h, f) != sizeof h;
}

void kv_file_put(kv_file_writer *w, const void *data, size_t n) {
    if (w->failed || n == 0) return;
    kv_sum_feed(&w->sum, data, n);
    w->written += n;
    if (fwrite(data, 1, n, w->f) != n) w->failed = 1;
}

int kv_file_end(kv_file_writer *w) {
    uint64_t want = (uint64_t)w->shape.n_tokens * sizeof(int32_t) + kv_file_kv_bytes(&w->shape) + w->shape.state_bytes;
    if (w->failed || w->written != want) return -1;
    uint8_t h[KV_FILE_HEADER_BYTES];
    encode_header(h, &w->shape, w->written, kv_sum_final(&w->sum));
    if (fseek(w->f, 0, SEEK_SET) || fwrite(h, 1, sizeof h, w->f) != sizeof h || fflush(w->f)) return -1;
    return 0;
}
