/* scheduler.h: the pure parts of the batch scheduler (scheduler.c), exposed for unit
 * tests: how one step's token budget is split between decoding and prefilling requests,
 * and how many KV blocks a request must be able to hold before it is admitted. */
#ifndef HEARTH_ENGINE_SCHEDULER_H
#define HEARTH_ENGINE_SCHEDULER_H
#include <stddef.h>

/* remaining[i]: prompt tokens request i still has to prefill (0: it is decoding).
 * Fills take[i] with the tokens request i contributes to the step: 1 for every decoding
 * request first (decode latency never waits behind prompts), then prompt chunks in
 * order (FIFO) while budget lasts. Returns the step's token count (<= budget). */
int sched_pack(const size_t *remaining, int n, int budget, int *take);

/* KV blocks a request needs for its prompt and every token it may generate (capped by
 * the context, where it finishes with "length"). */
int sched_blocks_needed(size_t n_prompt, int max_tokens, int context);
#endif
