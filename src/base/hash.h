/* hash.h: FNV-1a 64, the tree's one non-cryptographic hash (hash tables, cache keys,
 * ETags, the identity of saved state). Some values are persisted (the model identity in
 * saved KV files, prompt-cache file names, the memory index's chunk keys): the constants
 * and the order of the words must never change. */
#ifndef HEARTH_BASE_HASH_H
#define HEARTH_BASE_HASH_H
#include <stddef.h>
#include <stdint.h>

#define FNV1A64_INIT 0xcbf29ce484222325ull
#define FNV1A64_PRIME 0x100000001b3ull

/* continues h over n bytes (start with FNV1A64_INIT) */
static inline uint64_t fnv1a64(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * FNV1A64_PRIME;
    return h;
}

/* the same over 32-bit words (token ids, state ids), one step per word */
static inline uint64_t fnv1a64_words(uint64_t h, const int32_t *w, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (uint32_t)w[i]) * FNV1A64_PRIME;
    return h;
}

#endif
