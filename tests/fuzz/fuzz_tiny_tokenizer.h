/* fuzz_tiny_tokenizer.h: a small real tokenizer.json for fuzz targets that tokenize
 * (fuzz_embeddings.c, fuzz_train_data.c): byte-level BPE over all 256 bytes with
 * BERT-style [CLS] ... [SEP] specials. */
#ifndef HEARTH_FUZZ_TINY_TOKENIZER_H
#define HEARTH_FUZZ_TINY_TOKENIZER_H
#include <jansson.h>

enum { CLS = 256, SEP = 257 };

/* The tokenizer.json: GPT-2's byte-to-character map as the vocabulary (ids 0..255 in
 * byte order), two merges so that some texts shrink, and the two specials. */
static char *tokenizer_json(void) {
    json_t *vocab = json_object();
    int next = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)next++;
        char utf8[3] = {0};
        if (cp < 0x80) {
            utf8[0] = (char)cp;
        } else {
            utf8[0] = (char)(0xC0 | cp >> 6);
            utf8[1] = (char)(0x80 | (cp & 0x3F));
        }
        json_object_set_new(vocab, utf8, json_integer(b));
    }
    json_object_set_new(vocab, "ab", json_integer(258));
    json_object_set_new(vocab, "abc", json_integer(259));
    json_t *tj =
        json_pack("{s:[{s:i,s:s,s:b},{s:i,s:s,s:b}],s:{s:s,s:b,s:b},s:{s:s},"
                  "s:{s:s,s:[{s:{s:s}},{s:{s:s}},{s:{s:s}}],s:{s:{s:[i]},s:{s:[i]}}},"
                  "s:{s:s,s:o,s:[s,s]}}",
                  "added_tokens", "id", CLS, "content", "[CLS]", "special", 1, "id", SEP, "content", "[SEP]", "special",
                  1, "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1, "decoder", "type",
                  "ByteLevel", "post_processor", "type", "TemplateProcessing", "single", "SpecialToken", "id", "[CLS]",
                  "Sequence", "id", "A", "SpecialToken", "id", "[SEP]", "special_tokens", "[CLS]", "ids", CLS, "[SEP]",
                  "ids", SEP, "model", "type", "BPE", "vocab", vocab, "merges", "a b", "ab c");
    char *text = json_dumps(tj, 0);
    json_decref(tj);
    return text;
}
#endif
