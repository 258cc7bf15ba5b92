/* convert_internal.h: what convert.c (the MLX folder output) and convert_gguf.c (the GGUF
 * output) share. */
#ifndef HEARTH_API_CONVERT_INTERNAL_H
#define HEARTH_API_CONVERT_INTERNAL_H
#include "api/model_internal.h"
#include <jansson.h>
#include <stdio.h>

/* 1 for a tensor mlx-lm's sanitize drops from a Hugging Face checkpoint (rotary
 * inv_freq buffers, a tied lm_head). */
int convert_dropped(const hearth_model *m, const tensor_info *t);
/* Writes o->out_dir as one GGUF file with 2-D weights in dt; for DT_Q4_K (the Q4_K_M mix)
 * and DT_Q6_K each weight's type is llama.cpp's choice for that file type. */
hearth_status convert_to_gguf(hearth_model *m, const hearth_convert_options *o, tensor_dtype dt, hearth_error *err);
/* Pieces of the MLX folder writer that fuse.c (hearth_fuse) shares: n bytes to f; float
 * values written as dt (F32, F16 or BF16); a JSON file in dir; every file of src beside the
 * weights and config.json copied to dst; an nftw callback that removes each entry. */
hearth_status convert_write_all(FILE *f, const void *p, size_t n, const char *fname, hearth_error *err);
hearth_status convert_write_values(FILE *f, const float *v, size_t n, tensor_dtype dt, const char *fname,
                                   hearth_error *err);
hearth_status convert_write_json(const char *dir, const char *name, json_t *j, hearth_error *err);
hearth_status convert_copy_side_files(const char *src, const char *dst, hearth_error *err);
struct stat;
struct FTW;
int convert_remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw);
#endif
