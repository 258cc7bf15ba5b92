/* fuzz_tokenizer.c: libFuzzer target for the tokenizer. The first input byte picks the
 * mode: odd -> the rest is text encoded with a fixed small tokenizer, and the ids are
 * decoded and streamed back; 0 mod 4 -> the rest is a tokenizer.json for
 * tok_load_hf_json; 2 mod 4 -> the rest is a GGUF image for tok_load_gguf (each then
 * encodes, decodes and streams a short text if it loads). */
#include "io/gguf.h"
#include "tok/tokenizer.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *FIXED =
    "{\"added_tokens\":[{\"id\":9,\"content\":\"<s>\",\"special\":true},{\"id\":10,\"content\":\"ab\",\"normalized\":true,"
    "\"lstrip\":true,\"rstrip\":true,\"single_word\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],"
    "\"special_tokens\":{\"<s>\":{\"ids\":[9]}}},\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"\xC4\xA0\":3,\"ab\":4,\"abc\":5,\"\xC4\xA0" "a\":6,\"\xC3\xA3\":7,"
    "\"\xC3\xA3\xC4\xA5\":8,\"\xC4\xA5\":11},\"merges\":[\"a b\",\"ab c\",\"\xC4\xA0 a\",\"\xC3\xA3 \xC4\xA5\"]}}";

static void exercise(const tok_tokenizer *t, const char *text, size_t n) {
    int32_t *ids = NULL;
    size_t nid = 0;
    hearth_error err;
    if (tok_encode(t, text, n, 1, &ids, &nid, &err) != HEARTH_OK) return;
    char *out = NULL;
    if (tok_decode(t, ids, nid, 0, &out, &err) == HEARTH_OK) free(out);
    tok_stream *s = tok_stream_new(t, 1);
    for (size_t i = 0; s && i < nid; i++) tok_stream_push(s, ids[i]);
    if (s) tok_stream_finish(s);
    tok_stream_free(s);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tok_tokenizer *fixed;
    hearth_error err;
    if (!fixed && tok_load_hf_json(FIXED, strlen(FIXED), NULL, "fixed", &fixed, &err) != HEARTH_OK) abort();
    if (size == 0) return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        exercise(fixed, rest, n);
        return 0;
    }
    tok_tokenizer *t = NULL;
    if (data[0] & 2) {
        gguf_file g;
        if (gguf_parse((const uint8_t *)rest, n, "fuzz.gguf", &g, &err) != HEARTH_OK) return 0;
        if (tok_load_gguf(&g, &t, &err) == HEARTH_OK) {
            exercise(t, "Hello world, ab 123 \xC3\xA9 <s>", 23);
            tok_free(t);
        }
        gguf_close(&g);
        return 0;
    }
    if (tok_load_hf_json(rest, n, NULL, "fuzz", &t, &err) == HEARTH_OK) {
        exercise(t, "Hello world, ab 123 \xC3\xA9 <s>", 23);
        tok_free(t);
    }
    return 0;
}
