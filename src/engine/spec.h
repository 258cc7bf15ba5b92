/* spec.h: speculative decoding's proposers and draft depth, for the scheduler: prompt
 * lookup (an n-gram of the sequence's own tail found earlier in its prompt or output
 * proposes the tokens that followed it) and the per-request depth that follows the
 * measured acceptance. Verification (sampling each proposed position with the target's
 * own logits and keeping the longest agreeing prefix) and KV rollback are the
 * scheduler's. Pure functions of token arrays: no model, no KV. */
#ifndef HEARTH_ENGINE_SPEC_H
#define HEARTH_ENGINE_SPEC_H
#include <stdint.h>

/* Most tokens proposed for one request in one step. A verified step costs more than a
 * plain one with every token it carries, and 8 accepted tokens in a row are already a
 * long copied run; deeper drafts win little (peers default to 3-10). */
#define SPEC_MAX_DRAFT 8
/* n-gram lengths prompt lookup matches, longest first: a 1-gram match is too often a
 * coincidence to be worth verifying, and beyond 4 tokens matches get rare without
 * predicting better. */
#define SPEC_NGRAM_MAX 4
#define SPEC_NGRAM_MIN 2
/* Where proposing stops: a verified token is nearly free only while the step is
 * memory-bound (reading the weights costs more than the arithmetic on its tokens). The
 * engine gives each backend's limits (engine_spec_limits):
 * - CPU: at most SPEC_CPU_DECODE_ROWS decoding requests, whatever the depth: a CPU step's
 *   arithmetic catches up with its weight reads after a few rows.
 * - GPU: the step's tokens (decoding rows and proposals) at most the ridge point, the
 *   tokens at which the arithmetic (2 FLOP a weight a token) takes as long as reading the
 *   weights once: SPEC_GPU_FLOP_PER_BYTE x (weight bytes a parameter) / 2; about 200
 *   tokens for bf16 weights, 56 for 4.5-bit ones. SPEC_GPU_FLOP_PER_BYTE is a dense
 *   bf16 tensor-core GPU's peak FLOP/s over its memory bytes/s, rounded down: H200 989e12
 *   / 4.8e12 = 206, H100 SXM 295, A100 156. */
#define SPEC_CPU_DECODE_ROWS 4
#define SPEC_GPU_FLOP_PER_BYTE 200.0
typedef struct spec_limits {
    int max_decode_rows; /* decoding requests above which nothing is proposed */
    int max_step_tokens; /* decoding rows plus proposals a step may carry; 0: no limit */
} spec_limits;
/* The limits of the CPU (gpu 0) or the GPU, for weights of bytes_per_weight bytes a
 * parameter (the GPU's ridge; at least 2 tokens). */
spec_limits spec_limits_for(int gpu, double bytes_per_weight);
/* Tokens the step may propose in all with n_dec decoding requests: 0 above
 * max_decode_rows or at the token limit, else what the token limit leaves (INT32_MAX
 * without one). draft_depth > 0 (a draft model proposing that many for each request):
 * the draft's steps cost as much for one request as for all of them, so either every
 * decoding request gets its full depth within the limit or none proposes. */
int spec_step_room(spec_limits l, int n_dec, int draft_depth);

/* Prompt lookup: for n-gram lengths SPEC_NGRAM_MAX down to SPEC_NGRAM_MIN, the latest
 * earlier occurrence of hist's last n tokens; the up to max_k tokens that followed it go
 * to out. Returns how many (0: no match). */
int spec_lookup(const int32_t *hist, int n, int max_k, int32_t *out);
/* spec_lookup, and the n-gram length it matched in *matched (0: none; matched may be NULL). */
int spec_lookup_match(const int32_t *hist, int n, int max_k, int32_t *out, int *matched);

/* The suffix index (--speculate suffix): the batch's recent outputs, each request's
 * generated tokens appended as it finishes, in a ring of SPEC_SUFFIX_TOKENS tokens; the
 * n-grams of SPEC_SUFFIX_NGRAMS lengths inside one output are hashed to their latest end
 * (a slot later taken by another n-gram forgets the older one: recent outputs are the ones
 * agent loops repeat). Cross-request matches need more context than a request's own (a
 * 2-gram seen in another answer predicts little), hence longer n-grams than prompt lookup.
 * 2.3 MB. */
#define SPEC_SUFFIX_TOKENS (1 << 16)
#define SPEC_SUFFIX_SLOTS (1 << 19)
#define SPEC_SUFFIX_NGRAMS                                                                                             \
    { 8, 6, 4, 3 } /* longest first */
#define SPEC_SUFFIX_N_NGRAMS 4
typedef struct spec_suffix {
    int32_t *ring;  /* [SPEC_SUFFIX_TOKENS]: token, or -1 between outputs */
    uint32_t n;     /* tokens ever appended (mod 2^32); token t sits at ring[t % SPEC_SUFFIX_TOKENS] */
    uint32_t *slot; /* [SPEC_SUFFIX_SLOTS]: an n-gram's hash -> the index after its latest end (0: none) */
} spec_suffix;
spec_suffix *spec_suffix_new(void);
void spec_suffix_free(spec_suffix *s);
/* Appends one output (n tokens) and the separator after it. */
void spec_suffix_add(spec_suffix *s, const int32_t *tokens, int n);
/* For the n-gram lengths of SPEC_SUFFIX_NGRAMS, longest first, the latest indexed output position
 * that follows hist's last g tokens: up to max_k of the tokens after it (within that output)
 * to out, g in *matched (may be NULL). Returns how many (0: no match). A slot another n-gram
 * took since is a miss, never a wrong match. */
int spec_suffix_lookup(const spec_suffix *s, const int32_t *hist, int n, int max_k, int32_t *out, int *matched);

/* The measured cost of speculating, per engine: the seconds of a whole decode step (no
 * prompt tokens in it) without proposals, and what a step carrying k proposed or re-fed
 * tokens in all takes beyond that, for each k up to SPEC_COST_TOKENS (a step's fixed part,
 * such as a hybrid's state backup, and its per-token part are both in it), as moving averages
 * by the step's decoding rows (1..SPEC_COST_BUCKETS, the last bucket also holding more).
 * Everything a speculating step costs is in it: the wider forward, verification, a hybrid's
 * backup and restore. spec_cost_depth then caps a row's depth at the one with the most
 * expected tokens per second, and at 0 where no depth beats a plain step by SPEC_COST_MARGIN. */
#define SPEC_COST_BUCKETS 8
#define SPEC_COST_TOKENS 16
#define SPEC_COST_WARM 4      /* plain steps, and speculating ones, before the model is used */
#define SPEC_COST_MARGIN 1.02 /* the expected gain a proposal must clear */
#define SPEC_COST_PROBE 3     /* a row the cost stopped this many times (each a pause) probes at depth 1 */
#define SPEC_COST_REFRESH 64  /* speculating steps before a plain one measures the plain cost again */
typedef struct spec_cost {
    double plain[SPEC_COST_BUCKETS];
    double extra[SPEC_COST_BUCKETS][SPEC_COST_TOKENS + 1]; /* [rows][k]: seconds over a plain step */
    int n_plain[SPEC_COST_BUCKETS], n_spec[SPEC_COST_BUCKETS], n_extra[SPEC_COST_BUCKETS][SPEC_COST_TOKENS + 1];
    int since_plain[SPEC_COST_BUCKETS]; /* speculating steps since the last plain one */
} spec_cost;
/* One decode step of n_dec rows that carried extra proposed or re-fed tokens in all. */
void spec_cost_record(spec_cost *c, int n_dec, int extra, double seconds);
/* Whether the next step of n_dec decoding rows should propose nothing, to measure a plain
 * step: before SPEC_COST_WARM of them, then after every SPEC_COST_REFRESH speculating steps
 * (a plain step's cost grows with the context). */
int spec_cost_plain_due(const spec_cost *c, int n_dec);
/* Tokens a step yields for a row whose proposed tokens are each accepted with probability a
 * until the first miss, proposing k: 1 + a + ... + a^k. */
double spec_expected_tokens(double a, int k);
/* The depth in 1..k with the most expected tokens per second for such a row among n_dec
 * decoding rows, each depth's cost as measured (one not measured yet: the nearest measured
 * one's, scaled by the token count); k before SPEC_COST_WARM plain and speculating steps;
 * 0 when no depth gains SPEC_COST_MARGIN over a plain step. */
int spec_cost_depth(const spec_cost *c, int n_dec, double a, int k);

/* A request's draft depth, adapted to what it accepts: doubles after a fully accepted
 * draft, drops to one past the accepted count after a rejection, and after drafts of
 * which nothing was accepted, proposing pauses for 2, 4, 8 ... 64 steps, so a request
 * whose text does not repeat itself costs next to nothing. */
typedef struct spec_depth {
    int depth;  /* 0: not started (SPEC_MAX_DRAFT / 2) */
    int misses; /* drafts in a row with nothing accepted */
    int pause;  /* steps left without proposing */
} spec_depth;
/* The most tokens to propose this step (0: pause); counts the pause down. */
int spec_depth_next(spec_depth *d);
/* Records a verified draft: proposed tokens, accepted of them. strict (a hybrid model's
 * row, whose rejected tokens cost a state restore and their feeding again): any rejection
 * pauses as a draft with nothing accepted does. */
void spec_depth_update(spec_depth *d, int proposed, int accepted, int strict);
#endif
