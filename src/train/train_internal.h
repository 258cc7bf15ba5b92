/* train_internal.h: what the files of src/train/ share: the tokenized data set and its
 * batch order (train_data.c), as mlx_lm.lora 0.32.2 forms them. */
#ifndef HEARTH_TRAIN_TRAIN_INTERNAL_H
#define HEARTH_TRAIN_TRAIN_INTERNAL_H
#include "hearth.h"
#include <stdint.h>

/* One example: its tokens and the offset of its first target token (mask_prompt). A
 * preference example (prompt / chosen / rejected) holds prompt + chosen in ids and
 * prompt + rejected in ids2 (n2 tokens); offset is then the prompt's length in both. */
typedef struct tr_example {
    int32_t *ids, *ids2;
    int n, n2, offset;
    int keys; /* how many keys its JSON object has: mlx-lm sorts examples by it */
    int has_ref;          /* dpo: ref_chosen / ref_rejected (the frozen base's log-probs) are known */
    double ref_chosen, ref_rejected;
} tr_example;

typedef struct tr_dataset {
    tr_example *ex;
    int n;
    int pref; /* 1: prompt / chosen / rejected examples (dpo, orpo) */
} tr_dataset;

/* Reads path (JSONL: "text", "prompt"/"completion", "messages" or "prompt"/"chosen"/
 * "rejected" objects, the format taken from the first line as mlx-lm does) and tokenizes
 * each line with m's tokenizer and chat template. Preference rows are tokenized as TRL's
 * DPOTrainer does: the prompt and each response separately without special tokens, EOS
 * after each response; a conversational row (prompt, chosen and rejected message lists)
 * is rendered with the chat template first (the prompt with the generation prompt, each
 * response as the rest of the prompt + response render). A missing file gives an empty
 * set when optional. */
hearth_status tr_dataset_load(const hearth_model *m, const char *path, int optional, int mask_prompt,
                              tr_dataset *out, hearth_error *err);
/* The same over the JSONL text buf (name: for messages); fuzzed by tests/fuzz/fuzz_train_data.c. */
hearth_status tr_dataset_parse(const hearth_model *m, const char *buf, size_t len, const char *name, int mask_prompt,
                               tr_dataset *out, hearth_error *err);
void tr_dataset_free(tr_dataset *d);

/* The batches of mlx-lm's iterate_batches: examples sorted (stably) by key count, cut
 * into runs of batch_size (a short tail is dropped); *n_batches of them, batch b is
 * examples idx[b * batch_size ...]. Caller frees *idx. */
hearth_status tr_batches(const tr_dataset *d, int batch_size, const char *what, int **idx, int *n_batches,
                         hearth_error *err);

/* numpy's legacy global generator (np.random.seed(int), then np.random.permutation): MT19937
 * seeded by init_genrand, permutations by Fisher-Yates with masked rejection sampling. */
typedef struct tr_mt {
    uint32_t mt[624];
    int i;
} tr_mt;
void tr_mt_seed(tr_mt *r, uint32_t seed);
uint32_t tr_mt_u32(tr_mt *r);
void tr_mt_permutation(tr_mt *r, int *out, int n);
#endif
