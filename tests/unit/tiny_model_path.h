/* tiny_model_path.h: where tools/make_tiny_models.py writes a tiny model (HEARTH_CACHE, else
 * ~/.cache/hearth, then tiny/<name>), for the unit tests that open one. Test code only. */
#ifndef HEARTH_TESTS_TINY_MODEL_PATH_H
#define HEARTH_TESTS_TINY_MODEL_PATH_H
#include <stdio.h>
#include <stdlib.h>

static inline void tiny_model_path(char *path, size_t cap, const char *name) {
    const char *cache = getenv("HEARTH_CACHE");
    if (cache)
        snprintf(path, cap, "%s/tiny/%s", cache, name);
    else
        snprintf(path, cap, "%s/.cache/hearth/tiny/%s", getenv("HOME") ? getenv("HOME") : "", name);
}
#endif
