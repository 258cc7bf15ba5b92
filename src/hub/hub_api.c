/* hub_api.c: reads the hub's answer to GET api/models/{repo}/revision/{rev} into a
 * file list. Input is untrusted (any HF_ENDPOINT): every field is type-checked and
 * every file name must stay inside the snapshot folder. No network, no files. */
#include "base/err.h"
#include "hub/hub.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void hub_file_list_free(hub_file_list *l) {
    for (size_t i = 0; i < l->count; i++) {
        free(l->files[i].name);
        free(l->files[i].lfs_sha256);
    }
    free(l->files);
    free(l->commit);
    memset(l, 0, sizeof *l);
}

static long long size_field(const json_t *o) {
    const json_t *v = json_object_get(o, "size");
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (long long)json_integer_value(v) : -1;
}

hearth_status hub_parse_file_list(const char *text, size_t len, hub_file_list *out, hearth_error *err) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return err_set(err, HEARTH_ERR_FORMAT, "hub: model info is not JSON: %s (line %d)", je.text, je.line);
    hearth_status st = HEARTH_OK;
    const json_t *sha = json_object_get(root, "sha"), *sib = json_object_get(root, "siblings");
    if (!json_is_string(sha) || !hub_is_hex(json_string_value(sha), 40)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "hub: model info has no 40-hex commit \"sha\"");
        goto done;
    }
    if (!json_is_array(sib)) {
        st = err_set(err, HEARTH_ERR_FORMAT, "hub: model info has no \"siblings\" file list");
        goto done;
    }
    out->commit = strdup(json_string_value(sha));
    out->files = calloc(json_array_size(sib) + 1, sizeof *out->files);
    if (!out->commit || !out->files) {
        st = err_set(err, HEARTH_ERR_NOMEM, "hub: out of memory reading the file list");
        goto done;
    }
    size_t i;
    const json_t *f;
    json_array_foreach(sib, i, f) {
        const json_t *name = json_object_get(f, "rfilename");
        if (!json_is_string(name)) {
            st = err_set(err, HEARTH_ERR_FORMAT, "hub: siblings[%zu] has no \"rfilename\"", i);
            goto done;
        }
        const char *n = json_string_value(name);
        if (!hub_safe_relpath(n) || strlen(n) != json_string_length(name) || strlen(n) > 1000) {
            st = err_set(err, HEARTH_ERR_FORMAT, "hub: siblings[%zu]: unsafe file name '%.200s'", i, n);
            goto done;
        }
        hub_file *hf = &out->files[out->count++];
        hf->name = strdup(n);
        hf->size = size_field(f);
        const json_t *lfs = json_object_get(f, "lfs"), *lsha = json_object_get(lfs, "sha256");
        if (json_is_string(lsha) && hub_is_hex(json_string_value(lsha), 64)) {
            hf->lfs_sha256 = strdup(json_string_value(lsha));
            if (size_field(lfs) >= 0) hf->size = size_field(lfs);
        }
        if (!hf->name) {
            st = err_set(err, HEARTH_ERR_NOMEM, "hub: out of memory reading the file list");
            goto done;
        }
    }
done:
    json_decref(root);
    if (st) hub_file_list_free(out);
    return st;
}
