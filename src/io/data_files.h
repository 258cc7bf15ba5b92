/* data_files.h: the repo's data/ tables (skus.json, catalogue.json, cuda_runtime.json),
 * embedded in the binary (data_files.c); $HEARTH_DATA (a folder) replaces them. */
#ifndef HEARTH_IO_DATA_FILES_H
#define HEARTH_IO_DATA_FILES_H
#include "hearth.h"

/* The named table's text, NUL-terminated, for the caller to free; NULL with err set when
 * there is no such table (or $HEARTH_DATA has no such file). */
char *data_file_load(const char *name, hearth_error *err);
#endif
