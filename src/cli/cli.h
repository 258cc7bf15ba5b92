/* cli.h: the verbs of the hearth command line and small shared helpers. */
#ifndef HEARTH_CLI_H
#define HEARTH_CLI_H
#include "hearth.h"

typedef struct cli_verb { const char *name; int (*run)(int argc, char **argv); const char *help; } cli_verb;

int cli_info(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_template(int argc, char **argv);
int cli_tensors(int argc, char **argv);
int cli_ls(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_trace(int argc, char **argv);
int cli_bench(int argc, char **argv);
/* hearth bench --prompt-file (bench_spec.c): a prompt text's tokens for every request of a
 * batch run, and the draft tokens each may propose. */
typedef struct cli_bench_text {
    const int32_t *ids;
    size_t n;
    int num_draft_tokens;
    int32_t *out; /* optional: [B, n] the requests' generated tokens */
} cli_bench_text;
/* One --batch run (bench.c): B greedy requests of p random tokens (text: its tokens) and n
 * new ones through one hearth_batch; aggregate prefill and decode tok/s; *stats (optional)
 * the batch's counters at the end. */
int cli_bench_run_batch(hearth_engine *e, int B, int p, int n, int vocab, uint64_t seed, const cli_bench_text *text,
                        double *prefill_tps, double *decode_tps, hearth_batch_stats *stats, hearth_error *err);
/* Every combination of the batch counts Bs, draft depths Ks and (nA > 0, with the draft
 * model) controlled acceptances As (hearth_spec_replay); one report each. */
int cli_bench_spec(hearth_model *m, hearth_engine_options eo, const char *prompt_file, const int *Bs, int nB, int n,
                   int reps, const int *Ks, int nK, const double *As, int nA, int as_json);
/* qsort's comparison of doubles, and the median of n sorted values. */
int cli_cmp_double(const void *a, const void *b);
double cli_median_sorted(const double *v, int n);
int cli_chat(int argc, char **argv);
int cli_serve(int argc, char **argv);
/* serve's flag parsing alone: 0, or 2 after printing the usage error (the appliance checks
 * its flags before it probes the machine or starts a download) */
int cli_serve_check_args(int argc, char **argv);
int cli_fit(int argc, char **argv);
int cli_pull(int argc, char **argv);
int cli_upload(int argc, char **argv);
int cli_rm(int argc, char **argv);
int cli_evals(int argc, char **argv);
int cli_perplexity(int argc, char **argv);
int cli_convert(int argc, char **argv);
/* A --target-bpw candidate: a width and its group size. */
typedef struct mixed_candidate {
    int bits, group;
} mixed_candidate;
int cli_convert_mixed(const char *model, hearth_convert_options o, double target_bpw, const mixed_candidate *cand,
                      int n_cand, const char *calib_path, int n_calib, int calib_len);
int cli_harness(int argc, char **argv);
int cli_fuse(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_train_fit(int argc, char **argv); /* hearth fit --train */
int cli_train_watch(int argc, char **argv);
/* The appliance's model for `hearth` without --model (choose.c); NULL: serve's default.
 * no_download: never start the background pull of a better model (--no-download). */
const char *cli_choose_model(int argc, char **argv, int no_download);
int cli_embed(int argc, char **argv);
int cli_memory(int argc, char **argv);
void cli_report_memory(const hearth_engine *e); /* {"peak_rss_bytes", ...} on stderr */

/* Prints "hearth: <message>" to stderr and returns 1. */
int cli_fail(const hearth_error *err);
/* Prints a usage error (fmt has one %s for arg) and returns 2. */
int cli_usage_error(const char *usage, const char *fmt, const char *arg);
int cli_is_help(const char *arg);
/* --threads, --ctx, --mmap, --device, --kv-quant, --deterministic: the engine flags every
 * verb that runs the engine shares. Returns 1 when argv[*i] was one (and advances *i). */
int cli_parse_engine_flag(int argc, char **argv, int *i, hearth_engine_options *o);
/* Reads a whole file ("-" for stdin), NUL-terminated; NULL after printing why. */
char *cli_read_file(const char *path);
/* The flags that size the engine's sequences, steps and KV pool, the same in serve and
 * fit: --max-sequences, --max-step-tokens (--prefill-step-size, mlx_lm.server's name),
 * --kv-blocks, --kv-budget ("1.5GB" or a block count); "--flag value" or "--flag=value".
 * Returns 1 when argv[*i] is one (consumed, with its value) and sets *rc: 0, or 2 after
 * printing the usage error for a bad value; 0 when it is not one. */
/* A whole decimal integer in [lo, hi]: 0, else -1. */
int cli_parse_long(const char *s, long lo, long hi, long *out);
int cli_parse_pool_flag(int argc, char **argv, int *i, hearth_engine_options *eo, const char *usage, int *rc);
/* Opens a model, printing the error; returns 0 on success, 1 on failure. */
int cli_open_model(const char *name, hearth_model **m);
/* Mounts the adapter of a flag value, "id=path" or a bare path (id: the folder's name), and
 * makes it the engine's default when asked; prints the error and returns 1 on failure. */
int cli_mount_adapter(hearth_engine *e, const char *arg, int make_default);
/* The id of such a flag value into id; returns its path part. */
const char *cli_adapter_id(const char *arg, char *id, size_t cap);
/* Speculative decoding in the one-request verbs (speculate.c): generate and chat take
 * serve's --speculate lookup|suffix|none (default lookup), --draft-model M and --num-draft-tokens N
 * and, while speculating, run their request through a hearth_batch of its own. */
typedef struct cli_spec {
    const char *draft_name;      /* --draft-model */
    int num_draft_tokens;        /* --num-draft-tokens; 3 */
    int speculate_given, num_draft_given;
    int mtp;                     /* --speculate mtp: the model's own head proposes */
    hearth_model *draft;         /* opened by cli_spec_open */
    hearth_batch *batch;         /* cli_spec_start's, while speculating */
    unsigned long long proposed, accepted; /* the batch's counts after the last request */
} cli_spec;
/* Takes argv[*i] when it is one of those flags (advancing *i); *rc: 0, or 2 after printing
 * the usage error for a bad value. Returns 0 when it is not one. */
int cli_spec_flag(int argc, char **argv, int *i, cli_spec *s, hearth_engine_options *eo, const char *usage, int *rc);
/* Checks the flags together and opens the draft model into eo. plain_only: the name of a
 * flag given that only the plain path serves (e.g. "--prompt-cache-file"): speculation asked
 * for explicitly is refused, the default is turned off. 0, or the exit code after printing why. */
int cli_spec_open(cli_spec *s, hearth_engine_options *eo, const char *plain_only, const char *usage);
/* The batch of engine e (made with eo) when eo speculates: 0, or 1 after printing the error. */
int cli_spec_start(cli_spec *s, hearth_engine *e, const hearth_engine_options *eo);
/* One request: through the batch when there is one (gp->num_draft_tokens set from the
 * flags), else hearth_generate; the same results and errors either way. */
hearth_status cli_spec_generate(cli_spec *s, hearth_engine *e, const int32_t *ids, size_t n, hearth_generate_params *gp,
                                hearth_token_fn on_token, void *user, hearth_generate_result *r, hearth_error *err);
/* "speculative decoding (lookup): N tokens proposed, M accepted" on stderr, when speculating. */
void cli_spec_report(const cli_spec *s);
/* Frees the batch, the engine e (may be NULL) and then the draft model. */
void cli_spec_end(cli_spec *s, hearth_engine *e);
/* Opens url with xdg-open when a display is available; returns 1 if launched,
 * 0 otherwise (never an error: the caller has printed the URL). */
int cli_open_browser(const char *url);
/* The progress of pull and upload on stderr (hearth_pull_progress_fn; user: a cli_progress,
 * zeroed but for tty and doing): one bar redrawn in place on a terminal, one line per file
 * otherwise (logs, CI). */
typedef struct cli_progress {
    int tty;
    const char *doing; /* "downloading", "uploading" */
    char file[512];
    double start;
    int line_open;
} cli_progress;
void cli_transfer_progress(void *user, const char *file, long long done, long long total);
#endif
