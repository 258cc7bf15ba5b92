/* fuzz_train_watch.c: hearth train-watch's reader of metrics.jsonl (src/cli/train_watch.c,
 * compiled in here: the CLI is not part of the library) on arbitrary bytes. The first byte
 * picks where the file is cut in two; the watch reads the first part (its last line maybe
 * half written), then the whole file, then a shorter file (a new run), and renders the
 * state as text and JSON after each read. Nothing may crash, hang or leak. */
#include "../../src/cli/train_watch.c"
#include <stdint.h>

/* the two cli/common.c helpers train_watch.c calls, not reached from here */
int cli_is_help(const char *a) { return !strcmp(a, "--help"); }
int cli_usage_error(const char *usage, const char *fmt, const char *arg) {
    return (void)usage, (void)fmt, (void)arg, 2;
}

static void put(const char *path, const uint8_t *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(d, 1, n, f) != n) abort();
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    static FILE *devnull;
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/fuzz_train_watch_%d.jsonl", (int)getpid());
        if (!freopen("/dev/null", "w", stdout) || !(devnull = fopen("/dev/null", "w"))) abort();
    }
    if (!size) return 0;
    size_t cut = size > 1 ? 1 + (size_t)data[0] * (size - 1) / 255 : 1;
    watch w = {.path = path, .warn = devnull};
    const uint8_t *body = data + 1;
    size_t n = size - 1, first = cut - 1 < n ? cut - 1 : n;
    put(path, body, first);
    watch_poll(&w);
    print_text(&w), print_json(&w);
    FILE *f = fopen(path, "ab");
    if (!f) abort();
    if (n > first && fwrite(body + first, 1, n - first, f) != n - first) abort();
    fclose(f);
    watch_poll(&w);
    print_text(&w), print_json(&w);
    put(path, body, first / 2); /* shorter: read as a new run */
    watch_poll(&w);
    print_text(&w), print_json(&w);
    watch_reset(&w);
    unlink(path);
    return 0;
}
