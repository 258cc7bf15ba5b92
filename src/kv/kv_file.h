/* kv_file.h: the on-disk form of one sequence's KV (hearth_seq_save / hearth_seq_load):
 * a fixed little-endian header naming the model identity and the KV layout, then the
 * token ids, each layer's and KV head's key and value rows (with their int8 scales),
 * and the recurrent state of hybrid models. Layers of different shapes are stored at the
 * largest one (seq_file.c pads them). Header and payload are checksummed. This
 * file parses and writes bytes; it never touches a pool or a model. */
#ifndef HEARTH_KV_KV_FILE_H
#define HEARTH_KV_KV_FILE_H
#include "hearth.h"
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KV_FILE_MAGIC "HEARTHKV"
#define KV_FILE_VERSION 1u
#define KV_FILE_HEADER_BYTES 128u

/* What a file holds and what it must agree with before it is loaded. */
typedef struct kv_file_shape {
    uint64_t model_id; /* engine_model_identity: the weights and config the KV came from */
    uint32_t kv_quant; /* hearth_kv_quant */
    uint32_t n_layers, n_kv_heads, head_dim;
    uint32_t n_tokens;
    uint64_t state_bytes; /* recurrent state after the KV (hybrid models; 0 otherwise) */
} kv_file_shape;

/* A parsed file: pointers into the caller's bytes (e.g. a read-only mapping). */
typedef struct kv_file_view {
    kv_file_shape shape;
    const int32_t *tokens_unaligned; /* n_tokens ids; read with memcpy (no alignment promise) */
    const uint8_t *kv;               /* layer-major: for each layer and KV head, keys
                                        [n_tokens][head_dim], values, then (scaled formats)
                                        key scales [n_tokens] and value scales (f32) */
    const uint8_t *state;            /* state_bytes */
} kv_file_view;

/* Bytes of the key/value section for a shape (0 on overflow or an unknown format). */
uint64_t kv_file_kv_bytes(const kv_file_shape *s);
/* Bytes of one (layer, KV head) block of the kv section. */
uint64_t kv_file_head_bytes(const kv_file_shape *s);
/* Checks magic, version, header checksum, every size against the buffer, the payload
 * checksum and the token ids; names `name` (the file) in every error. Nothing is trusted
 * before it passes. */
hearth_status kv_file_parse(const uint8_t *data, size_t size, const char *name, kv_file_view *out, hearth_error *err);

/* Streaming 64-bit checksum (corruption detection, not security): feed any chunks. */
typedef struct kv_sum {
    uint64_t lane[4];
    uint8_t carry[32];
    size_t n_carry;
    uint64_t total;
} kv_sum;
void kv_sum_init(kv_sum *s);
void kv_sum_feed(kv_sum *s, const void *data, size_t n);
uint64_t kv_sum_final(const kv_sum *s);

/* Writing: kv_file_begin writes a placeholder header; the caller writes the payload
 * through kv_file_put (tokens, kv section, state: exactly the shape's bytes, in order);
 * kv_file_end writes the real header with the checksum. */
typedef struct kv_file_writer {
    FILE *f;
    kv_file_shape shape;
    kv_sum sum;
    uint64_t written;
    int failed;
} kv_file_writer;
void kv_file_begin(kv_file_writer *w, FILE *f, const kv_file_shape *s);
void kv_file_put(kv_file_writer *w, const void *data, size_t n);
/* 0 when everything was written and the byte count matches the shape. */
int kv_file_end(kv_file_writer *w);
#endif
