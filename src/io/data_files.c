/* data_files.c: the data files of the repo's data/ folder (skus.json, catalogue.json, cuda_runtime.json),
 * embedded in the binary with .incbin so an installed hearth needs no data directory;
 * $HEARTH_DATA (a folder) replaces them, for tests and for users with their own table.
 * The Makefile makes this object depend on the files in data/. */
#include "base/err.h"
#include "base/file.h"
#include "io/data_files.h"
#include <stdlib.h>
#include <string.h>

DATA_INCBIN(hub_skus_json, "data/skus.json");
DATA_INCBIN(hub_catalogue_json, "data/catalogue.json");
DATA_INCBIN(hub_cuda_runtime_json, "data/cuda_runtime.json");

char *data_file_load(const char *name, hearth_error *err) {
    const char *dir = getenv("HEARTH_DATA");
    if (dir && *dir) {
        char *path = path_join(dir, name), *text = NULL;
        size_t len = 0;
        hearth_status st = path ? file_read_all(path, &text, &len, err) : HEARTH_ERR_NOMEM;
        free(path);
        return st ? NULL : text;
    }
    const char *start = NULL, *end = NULL;
    if (!strcmp(name, "skus.json"))
        start = hub_skus_json_start, end = hub_skus_json_end;
    else if (!strcmp(name, "catalogue.json"))
        start = hub_catalogue_json_start, end = hub_catalogue_json_end;
    else if (!strcmp(name, "cuda_runtime.json"))
        start = hub_cuda_runtime_json_start, end = hub_cuda_runtime_json_end;
    if (!start) {
        err_set(err, HEARTH_ERR_NOT_FOUND, "data: no embedded file %s", name);
        return NULL;
    }
    char *copy = malloc((size_t)(end - start) + 1);
    if (!copy) {
        err_set(err, HEARTH_ERR_NOMEM, "data: out of memory");
        return NULL;
    }
    memcpy(copy, start, (size_t)(end - start));
    copy[end - start] = 0;
    return copy;
}
