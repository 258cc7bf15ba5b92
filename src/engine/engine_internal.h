/* engine_internal.h: what generate.c needs of the engine besides the public API. */
#ifndef HEARTH_ENGINE_ENGINE_INTERNAL_H
#define HEARTH_ENGINE_ENGINE_INTERNAL_H
#include "hearth.h"
#include "engine/sampler.h"

#define ENGINE_MAX_LOGITS_ROWS 8 /* rows of logits one append may return; decode needs 1 */
#define ENGINE_MAX_EOS 8

/* The model's end-of-sequence ids. */
int engine_eos_ids(const hearth_engine *e, const int32_t **ids);
sampler *engine_sampler(hearth_engine *e);
const int32_t *engine_history(const hearth_engine *e, int seq);
int engine_seq_length(const hearth_engine *e, int seq);
float *engine_logits_buffer(hearth_engine *e);
/* Tokens per forward step: the prefill chunk size. */
int engine_step_tokens(const hearth_engine *e);
const hearth_model *engine_model(const hearth_engine *e);
#endif
