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
/* Decoding requests in a step above which nothing is proposed: a batch that large fills
 * the step's arithmetic already, so extra verified tokens cost about what they save. */
#define SPEC_MAX_DECODE_ROWS 4

/* Prompt lookup: for n-gram lengths SPEC_NGRAM_MAX down to SPEC_NGRAM_MIN, the latest
 * earlier occurrence of hist's last n tokens; the up to max_k tokens that followed it go
 * to out. Returns how many (0: no match). */
int spec_lookup(const int32_t *hist, int n, int max_k, int32_t *out);

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
/* Records a verified draft: proposed tokens, accepted of them. */
void spec_depth_update(spec_depth *d, int proposed, int accepted);
#endif
