/* scheduler.h: the pure parts of the batch scheduler (scheduler.c), exposed for unit
 * tests: how one step's token budget is split between decoding and prefilling requests,
 * and how many KV blocks a request must be able to hold before it is admitted. */
#ifndef HEARTH_ENGINE_SCHEDULER_H
#define HEARTH_ENGINE_SCHEDULER_H
#include <stddef.h>
#include <stdint.h>

/* remaining[i]: prompt tokens request i still has to prefill (0: it is decoding).
 * Fills take[i] with the tokens request i contributes to the step: 1 for every decoding
 * request first (decode latency never waits behind prompts), then prompt chunks in
 * order (FIFO) while budget lasts. Returns the step's token count (<= budget). */
int sched_pack(const size_t *remaining, int n, int budget, int *take);

/* KV blocks a request needs for its prompt and every token it may generate (capped by
 * the context, where it finishes with "length"). */
int sched_blocks_needed(size_t n_prompt, int max_tokens, int context);

/* Shared prefixes are computed once: a waiting request whose prompt shares at least
 * SCHED_SHARE_MIN_BLOCKS full blocks with the prompt a running request is prefilling
 * right now (counting only blocks that request computes, not those it found cached) is
 * not admitted until that request has computed (and committed) them; it then attaches
 * them from the prefix cache. Requests behind it are admitted meanwhile.
 * It waits until the leader has committed the block holding the last shared token too
 * (unless the leader's prompt ends inside that block), so it copies the shared part of
 * that block instead of computing it. Shorter common prefixes (a chat template's header)
 * are not worth a step of waiting. */
#define SCHED_SHARE_MIN_BLOCKS 4

/* Tokens a request with a[0..n_a) could take from the cache once a request prefilling
 * b[0..n_b) has committed the blocks holding them: the longest common prefix, never
 * covering a's last token (its logits must be computed). */
size_t sched_shared_tokens(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b);
/* Of those, the leading whole blocks (sched_shared_tokens / KV_BLOCK_SIZE). */
int sched_shared_blocks(const int32_t *a, size_t n_a, const int32_t *b, size_t n_b);

/* Where a batch's proposals come from (speculative decoding): fills out[0..max_k) with
 * the tokens it guesses follow tokens[0..n) (the request's prompt, output and next token)
 * and returns how many. The default is prompt lookup (spec_lookup); tests set their own
 * to drive acceptance and rejection where they want them. */
typedef int (*sched_proposer_fn)(void *user, const int32_t *tokens, int n, int max_k, int32_t *out);
struct hearth_batch;
void sched_set_proposer(struct hearth_batch *b, sched_proposer_fn fn, void *user);
#endif
