/* fuzz_train_records.c: the training view's reader of metrics.jsonl (srv_train_records,
 * src/server/train_routes.c) on arbitrary bytes: every complete line parsed or counted as
 * skipped, a half-written last line left alone. Nothing may crash, hang or leak, and the
 * records plus the skipped lines never exceed the complete lines. */
#include "server/server.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    size_t lines = 0;
    for (size_t i = 0; i < size; i++) lines += buf[i] == '\n';
    int skipped = -1;
    json_t *recs = srv_train_records(buf, size, &skipped);
    if (!json_is_array(recs) || skipped < 0 || json_array_size(recs) + (size_t)skipped > lines) abort();
    json_decref(recs);
    free(buf);
    return 0;
}
