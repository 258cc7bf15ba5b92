/* fuzz_kv_file.c: libFuzzer target for kv_file_parse (saved KV files). Any input must
 * parse or fail with an error, never crash or read out of bounds. The input is tried
 * twice: as it is, and with its two checksums recomputed, so the fuzzer also reaches the
 * size and layout checks that a checksum mismatch would otherwise stop first. A parsed
 * view must lie inside the input. */
#include "kv/kv_file.h"
#include <stdlib.h>
#include <string.h>

/* kv_file.c's header: payload checksum at byte 64, header checksum (of bytes 0..120) at 120 */
static void reseal(uint8_t *b, size_t size) {
    if (size < KV_FILE_HEADER_BYTES) return;
    kv_sum s;
    kv_sum_init(&s);
    kv_sum_feed(&s, b + KV_FILE_HEADER_BYTES, size - KV_FILE_HEADER_BYTES);
    uint64_t v = kv_sum_final(&s);
    for (int i = 0; i < 8; i++) b[64 + i] = (uint8_t)(v >> (8 * i));
    kv_sum_init(&s);
    kv_sum_feed(&s, b, 120);
    v = kv_sum_final(&s);
    for (int i = 0; i < 8; i++) b[120 + i] = (uint8_t)(v >> (8 * i));
}

static void parse(const uint8_t *b, size_t size) {
    kv_file_view v;
    hearth_error err;
    if (kv_file_parse(b, size, "fuzz.hkv", &v, &err) != HEARTH_OK) return;
    /* everything the view names is inside the buffer: touch its first and last bytes */
    uint64_t kv = kv_file_kv_bytes(&v.shape);
    volatile uint8_t x = 0;
    const uint8_t *t = (const uint8_t *)v.tokens_unaligned;
    x ^= t[0] ^ t[(size_t)v.shape.n_tokens * 4 - 1];
    if (kv) x ^= v.kv[0] ^ v.kv[kv - 1];
    if (v.shape.state_bytes) x ^= v.state[0] ^ v.state[v.shape.state_bytes - 1];
    if (v.state + v.shape.state_bytes != b + size) abort();
    (void)x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a heap copy of exactly `size` bytes so ASan catches any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    parse(buf, size);
    reseal(buf, size);
    parse(buf, size);
    free(buf);
    return 0;
}
