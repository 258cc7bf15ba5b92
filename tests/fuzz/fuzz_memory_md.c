/* fuzz_memory_md.c: the memory's Markdown reading (memory_md.c: front matter, headings and
 * their sections, wikilinks, conflict markers, UTF-8), the synthesis gate's text checks and
 * the dangling-link rewrite, the lenient JSON reading of a model's answer and the repair of
 * its segments (synth_segments_cover), the --since bound's reading, on arbitrary bytes. Must never crash, read out of
 * bounds or leak. */
#include "memory/memory_synth.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void on_link(void *user, const char *target, const char *heading) {
    (*(size_t *)user) += strlen(target) + strlen(heading);
}
static int exists_when_short(void *user, const char *target) { return strlen(target) < 4; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *t = (const char *)data; /* not NUL-terminated: the md_ functions take a length */
    md_doc d;
    if (md_parse(t, size, "stem", &d) == 0) {
        for (size_t i = 0; i < d.n_headings; i++) {
            const md_heading *h = &d.headings[i];
            if (h->start > h->body || h->body > size || h->end > size || h->start > h->end) abort();
        }
        if (d.n_headings) md_find_heading(&d, d.headings[0].anchor);
        md_find_heading(&d, "#x");
        md_doc_free(&d);
    }
    size_t sum = 0;
    md_wikilinks(t, size, on_link, &sum);
    md_has_conflict_markers(t, size);
    md_valid_utf8(t, size);
    char *s = malloc(size + 1); /* the string-taking checks get a NUL-terminated copy */
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    int changed = 0;
    free(synth_unlink_dangling(s, exists_when_short, NULL, &changed));
    synth_prose_kept(s, "x");
    synth_citations_kept(s, s);
    synth_has_secret(s);
    json_t *answer = synth_parse_answer(s);
    json_t *msgs = json_pack("[{s:s}, {s:s}, {s:i}]", "id", "a", "id", "b", "id", 3), *cover;
    cover = synth_segments_cover(answer, msgs);
    size_t i, covered = 0;
    json_t *seg;
    json_array_foreach(cover, i, seg) covered += json_array_size(json_object_get(seg, "messages"));
    if (covered != 3) abort(); /* every message, once, whatever the model said */
    json_decref(cover), json_decref(msgs), json_decref(answer);
    char name[64], key[32];
    synth_article_name(s, name, sizeof name);
    if (synth_since_key(s, key, sizeof key) == 0 && (strlen(key) != 10 && strlen(key) != 16)) abort();
    synth_before(s, "2024-02-29 23:59");
    free(s);
    return 0;
}
