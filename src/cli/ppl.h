/* ppl.h: the scoring behind `hearth perplexity`, shared with `hearth convert --target-bpw`
 * (which measures each module's KL sensitivity the same way): datasets in mlx-lm's shapes,
 * its seeded token rows, one model's pass over them with log-probs saved or compared. */
#ifndef HEARTH_CLI_PPL_H
#define HEARTH_CLI_PPL_H
#include "cli/cli.h"
#include <stdio.h>

typedef enum { ROWS_TEXT, ROWS_CHAT, ROWS_COMPLETION } rows_kind;

typedef struct dataset {
    const char *path;
    char **lines; /* one row each (a JSON object for .jsonl, the text for .txt) */
    size_t n;
    int jsonl;
    rows_kind kind; /* from the first row, as create_dataset decides */
} dataset;

typedef struct kl_stats {
    double *kl; /* per scored position */
    size_t same_top, n;
} kl_stats;

typedef struct score_run {
    const int32_t *tokens;
    size_t rows;
    int L;
    int first;  /* the first scored position of each row: 0 (mlx-lm's rule), or L/2 (llama-perplexity's) */
    FILE *save; /* write this model's log-probs here */
    FILE *ref;  /* compare with these (KL, top-1) */
    const char *save_path, *ref_path;
    double *loss; /* per scored position */
    kl_stats kl;
    double seconds;
    int quiet; /* no progress line (the caller prints its own) */
} score_run;

/* Splits buf (the file's text, kept) into rows; the first row decides the shape. */
int ppl_dataset_load(const char *path, char *buf, dataset *d);
/* mlx_lm.perplexity's load_data: rows in numpy's seeded order, concatenated, cut into
 * num_samples (or all, if <= 0) rows of L tokens. *out: rows x L (free). */
int ppl_load_tokens(const hearth_model *m, const dataset *d, int seed, int num_samples, int L, int32_t **out,
                    size_t *rows);
/* Opens `name`, builds an engine for rows of r->L tokens and scores every row; fills
 * r->loss (and r->kl when r->ref is set), writes log-probs to r->save when set. */
int ppl_run_model(const char *name, hearth_engine_options eo, score_run *r);
/* ppl_run_model in two parts, for scoring one loaded model many times: an engine on m for
 * rows of L tokens (0, or 1 after printing why), and one scoring pass over r's rows. */
int ppl_engine_open(hearth_model *m, hearth_engine_options eo, int L, hearth_engine **e);
int ppl_score(hearth_engine *e, score_run *r);
/* mean and its standard error (ddof=1) */
void ppl_mean_se(const double *x, size_t n, double *mean, double *se);
#endif
