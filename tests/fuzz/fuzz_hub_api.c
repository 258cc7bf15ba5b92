/* fuzz_hub_api.c: the hub's api/models answer (hub_parse_file_list) and the name
 * helpers it feeds (repo ids, ETags, symlink targets) on arbitrary bytes: a hostile
 * HF_ENDPOINT must never crash hearth pull or get a path outside the snapshot. */
#include "hub/hub.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hub_file_list l;
    hearth_error err = {0};
    if (hub_parse_file_list((const char *)data, size, &l, &err) == HEARTH_OK) {
        for (size_t i = 0; i < l.count; i++) {
            if (!hub_safe_relpath(l.files[i].name)) abort(); /* the parser let an unsafe name through */
            char *t = hub_symlink_target(l.files[i].name, "etag");
            free(t);
        }
        hub_file_list_free(&l);
    }
    char *s = malloc(size + 1), repo[HUB_NAME_MAX], rev[HUB_NAME_MAX], etag[160];
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    if (hub_parse_repo_arg(s, repo, rev, &err) == HEARTH_OK && (!hub_safe_relpath(rev) || strstr(repo, ".."))) abort();
    hub_normalize_etag(s, etag, sizeof etag);
    if (strchr(etag, '/')) abort();
    free(s);
    return 0;
}
