/* fuzz_train_data.c: hearth train's JSONL data reader (tr_dataset_parse in
 * src/train/train_data.c) on arbitrary bytes: the format detection, the three formats, the
 * chat template and --mask-prompt offsets, and the preference rows of dpo / orpo (strings or
 * message lists, each response rendered and tokenized after its prompt). The first byte picks --mask-prompt, the rest is
 * the file. Texts are tokenized by a real tokenizer (fuzz_tiny_tokenizer.h) in a model
 * handle built here with a small ChatML-style template. A parsed set is checked (every
 * example's ids in the vocabulary, its offset within 0..len of the prompt's render);
 * nothing may crash or leak. */
#include "model/model_handle.h"
#include "tok/tokenizer.h"
#include "train/train_internal.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "fuzz_tiny_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct hearth_model m;
    hearth_error err = {0};
    if (!m.tok) {
        char *text = tokenizer_json();
        if (!text || tok_load_hf_json(text, strlen(text), NULL, "fuzz_train_data", &m.tok, &err) != HEARTH_OK) abort();
        free(text);
        m.chat_template = strdup("{% for m in messages %}[CLS]{{ m.role }}: {{ m.content }}[SEP]{% endfor %}"
                                 "{% if add_generation_prompt %}[CLS]assistant: {% endif %}");
        m.eos_token = strdup("[SEP]");
        m.bos_token = strdup("[CLS]");
    }
    if (!size) return 0;
    tr_dataset d;
    if (tr_dataset_parse(&m, (const char *)data + 1, size - 1, "fuzz.jsonl", data[0] & 1, &d, &err) == HEARTH_OK) {
        int vocab = tok_vocab_size(m.tok);
        for (int i = 0; i < d.n; i++) {
            if (d.ex[i].n < 0 || d.ex[i].offset < 0) abort();
            for (int k = 0; k < d.ex[i].n; k++)
                if (d.ex[i].ids[k] < 0 || d.ex[i].ids[k] >= vocab) abort();
            if (d.pref) { /* both sequences hold the prompt, then at least the EOS */
                if (d.ex[i].offset >= d.ex[i].n || d.ex[i].offset >= d.ex[i].n2 ||
                    memcmp(d.ex[i].ids, d.ex[i].ids2, sizeof(int32_t) * (size_t)d.ex[i].offset))
                    abort();
                for (int k = 0; k < d.ex[i].n2; k++)
                    if (d.ex[i].ids2[k] < 0 || d.ex[i].ids2[k] >= vocab) abort();
            }
        }
        tr_dataset_free(&d);
    } else if (!err.message[0]) {
        abort(); /* a refusal always says why */
    }
    return 0;
}
