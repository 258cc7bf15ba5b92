/* convert_internal.h: what convert.c (the MLX folder output) and convert_gguf.c (the GGUF
 * output) share. */
#ifndef HEARTH_API_CONVERT_INTERNAL_H
#define HEARTH_API_CONVERT_INTERNAL_H
#include "api/model_internal.h"

/* 1 for a tensor mlx-lm's sanitize drops from a Hugging Face checkpoint (rotary
 * inv_freq buffers, a tied lm_head). */
int convert_dropped(const hearth_model *m, const tensor_info *t);
/* Writes o->out_dir as one GGUF file with 2-D weights in dt. */
hearth_status convert_to_gguf(hearth_model *m, const hearth_convert_options *o, tensor_dtype dt, hearth_error *err);
#endif
