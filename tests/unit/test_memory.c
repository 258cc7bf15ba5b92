/* test_memory.c: unit tests of the memory's text rules (src/memory): Markdown headings,
 * sections and slugs, wikilinks, conflict markers and UTF-8 checks, and the synthesis
 * gate (prose kept, citations kept, secrets), the dangling-link rewrite and the lenient
 * reading of a model's JSON answer, the stages' answer schemas (each compiles as a
 * constraint; what they admit is checked against jsonschema by tests/api) and the repair
 * of a model's segments, and the --since bound (dates checked against libc's timegm).
 * Expected values are worked out by hand. */
/* cmocka.h needs these before it */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hearth.h"
#include "memory/memory.h"
#include "memory/memory_synth.h"

static const char *doc = "---\ntitle: \"Garden\"\nsource: x\n---\n# Top\nintro\n## Beds & Soil\ntext\n```\n# no\n```\n"
                         "### Deep\nd\n## Last\nend\n";

/* --since: a date is accepted exactly when libc's timegm keeps it as written (an impossible
 * day is normalised into the next month), the minute form too; the bound compares against
 * the created times import writes ("... HH:MM UTC", ISO "T...Z"). */
static void test_since(void **state) {
    (void)state;
    static const int years[] = {1900, 1999, 2000, 2023, 2024, 2100};
    char text[32], key[32];
    for (size_t y = 0; y < sizeof years / sizeof years[0]; y++)
        for (int mo = 0; mo <= 13; mo++)
            for (int d = 0; d <= 32; d++) {
                struct tm tm = {.tm_year = years[y] - 1900, .tm_mon = mo - 1, .tm_mday = d};
                time_t t = timegm(&tm);
                int valid = t != (time_t)-1 && tm.tm_mon == mo - 1 && tm.tm_mday == d && mo >= 1 && mo <= 12;
                snprintf(text, sizeof text, "%04d-%02d-%02d", years[y], mo, d);
                assert_int_equal(synth_since_key(text, key, sizeof key) == 0, valid);
                snprintf(text, sizeof text, "%04d-%02d-%02dT23:59", years[y], mo, d);
                assert_int_equal(synth_since_key(text, key, sizeof key) == 0, valid);
            }
    static const char *bad[] = {"",
                                "2024",
                                "2024-1-05",
                                "2024-01-05T",
                                "2024-01-05T7:00",
                                "2024-01-05T24:00",
                                "2024-01-05T12:60",
                                "2024-01-05X12:00",
                                "2024/01/05",
                                "+024-01-05",
                                "2024-01-05 ",
                                "2024-01-05T12:00:00",
                                "0000-01-01"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(synth_since_key(bad[i], key, 32), -1);
    assert_int_equal(synth_since_key("2024-01-05T07:30", key, sizeof key), 0);
    assert_string_equal(key, "2024-01-05 07:30");
    assert_true(synth_before("2024-01-05 07:29 UTC", key) && !synth_before("2024-01-05 07:30 UTC", key));
    assert_true(synth_before("2024-01-05T07:29:59Z", key) && !synth_before("2024-01-06T00:00:00Z", key));
    assert_true(synth_before("", key)); /* no time: older */
    assert_int_equal(synth_since_key("2024-01-05", key, sizeof key), 0);
    assert_true(!synth_before("2024-01-05 00:00 UTC", key) && synth_before("2024-01-04T23:59:59Z", key));
}

/* RFC 3629's well-formed UTF-8 (what Python's strict decoder accepts): a vault file that is
 * not is reported, never rewritten */
static void test_utf8(void **state) {
    (void)state;
    static const struct {
        const char *s;
        int ok;
    } cases[] = {
        {"plain", 1},
        {"caf\xc3\xa9", 1},
        {"\xe2\x82\xac \xf0\x9f\x8d\x95", 1},
        {"\xc0\xaf", 0},         /* overlong 2-byte */
        {"\xe0\x80\xaf", 0},     /* overlong 3-byte */
        {"\xed\xa0\x80", 0},     /* a surrogate */
        {"\xf4\x90\x80\x80", 0}, /* past U+10FFFF */
        {"\xf5\x80\x80\x80", 0}, /* lead byte F5 */
        {"\xe2\x82", 0},         /* cut short */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(md_valid_utf8(cases[i].s, strlen(cases[i].s)), cases[i].ok);
}

static void test_markdown(void **state) {
    (void)state;
    md_doc d;
    assert_int_equal(md_parse(doc, strlen(doc), "stem", &d), 0);
    assert_string_equal(d.title, "Garden");
    assert_string_equal(d.source, "x");
    assert_int_equal(d.n_headings, 4); /* the fenced "# no" is code */
    assert_string_equal(d.headings[1].text, "Beds & Soil");
    assert_string_equal(d.headings[1].anchor, "beds-soil");
    const md_heading *h = md_find_heading(&d, "beds-soil");
    assert_non_null(h);
    /* the section runs to the next heading of its level or above: Deep is inside */
    char *section = strndup(doc + h->start, h->end - h->start);
    assert_string_equal(section, "## Beds & Soil\ntext\n```\n# no\n```\n### Deep\nd\n");
    free(section);
    assert_ptr_equal(md_find_heading(&d, "#Beds & soil"), h); /* by text, any case */
    assert_null(md_find_heading(&d, "nowhere"));
    md_doc_free(&d);
    assert_int_equal(md_parse("# A\n", 4, "s", &d), 0);
    assert_string_equal(d.title, "A"); /* no front matter: the first level-1 heading */
    md_doc_free(&d);
}

static void count_link(void *user, const char *target, const char *heading) {
    char *out = user;
    strcat(out, target);
    strcat(out, "#");
    strcat(out, heading);
    strcat(out, ";");
}

static void test_links_and_checks(void **state) {
    (void)state;
    const char *t = "a [[X]] b [[Y#h|alias]] [[#local]] [[unclosed\n```\n[[code]]\n```\n[[Z]]";
    char got[256] = "";
    assert_int_equal(md_wikilinks(t, strlen(t), count_link, got), 4);
    assert_string_equal(got, "X#;Y#h;#local;Z#;");
    const char *conflict = "a\n<<<<<<< HEAD\nx\n=======\ny\n>>>>>>> b\n";
    assert_true(md_has_conflict_markers(conflict, strlen(conflict)));
    assert_false(md_has_conflict_markers("Title\n=======\n", 14)); /* a setext heading */
    assert_true(md_valid_utf8("caf\xc3\xa9", 5));
    assert_false(md_valid_utf8("caf\xe9", 4));
    assert_false(md_valid_utf8("\xc0\xaf", 2)); /* overlong */
    assert_false(md_valid_utf8("\xe2\x82", 2)); /* cut short */
}

static void test_gate(void **state) {
    (void)state;
    const char *old = "# T\n\nAlpha is red. Beta is blue.[^1]\n\n[^1]: [[C#m1]]\n";
    /* both sentences kept (the heading and footnote definition are not prose) */
    assert_true(synth_prose_kept(old, "Alpha is red. Beta is blue.[^1] Gamma.") > 0.999);
    /* "Alpha is red." is 13 of 13 + 17 bytes */
    double k = synth_prose_kept(old, "Alpha is red. Something else.");
    assert_true(k > 13.0 / 30 - 1e-9 && k < 13.0 / 30 + 1e-9);
    assert_true(synth_prose_kept("", "anything") == 1.0);
    assert_true(synth_citations_kept(old, "x [^1]"));
    assert_false(synth_citations_kept(old, "x [^2]"));
    assert_true(synth_has_secret("my key sk-abcdefghijklmnopqrstuvwx"));
    assert_true(synth_has_secret("password: hunter2"));
    assert_true(synth_has_secret("-----BEGIN RSA PRIVATE KEY-----"));
    assert_false(synth_has_secret("ask-me anything; my task-list"));
    assert_false(synth_has_secret("a password manager"));
}

static int exists_x(void *user, const char *target) { return !strcmp(target, "X"); }

static void test_unlink_and_answers(void **state) {
    (void)state;
    int changed = 0;
    char *out =
        synth_unlink_dangling("[[X]] [[Gone]] [[Gone#h|shown]]\n```\n[[Gone]]\n```\n", exists_x, NULL, &changed);
    assert_string_equal(out, "[[X]] Gone shown\n```\n[[Gone]]\n```\n");
    assert_true(changed);
    free(out);
    json_t *v = synth_parse_answer("Sure!\n```json\n{\"article\": \"Bikes\"}\n```");
    assert_string_equal(json_string_value(json_object_get(v, "article")), "Bikes");
    json_decref(v);
    assert_null(synth_parse_answer("no json here {"));
    char name[64];
    synth_article_name("../Reference/x: y?", name, sizeof name);
    assert_string_equal(name, "Referencex y"); /* no path can leave articles/ */
    synth_article_name("???", name, sizeof name);
    assert_string_equal(name, "Untitled");
}

static void assert_compiles(json_t *schema) {
    char *text = json_dumps(schema, JSON_COMPACT);
    hearth_error err = {0};
    hearth_status st = hearth_constraint_check(HEARTH_CONSTRAINT_JSON_SCHEMA, text, strlen(text), &err);
    if (st) fail_msg("%s: %s", text, err.message);
    free(text);
    json_decref(schema);
}

static void test_stage_schemas_compile(void **state) {
    (void)state;
    assert_compiles(synth_schema_segments(json_pack("[s, s, s]", "D1:1", "D1:2", "D1:3")));
    assert_compiles(synth_schema_segments(json_array())); /* a conversation without messages */
    assert_compiles(synth_schema_facts(json_pack("[s]", "a")));
    assert_compiles(synth_schema_facts(json_array()));
    assert_compiles(synth_schema_route());
    assert_compiles(synth_schema_article(800));
    /* the id list is an enum of the input's ids, capped at their number */
    json_t *s = synth_schema_segments(json_pack("[s, s]", "x", "y"));
    json_t *ids = json_object_get(json_object_get(json_object_get(s, "items"), "properties"), "messages");
    assert_int_equal(json_integer_value(json_object_get(ids, "maxItems")), 2);
    assert_int_equal(json_array_size(json_object_get(json_object_get(ids, "items"), "enum")), 2);
    json_decref(s);
}

static char *covered(const char *answer) {
    json_t *msgs = json_pack("[{s:s}, {s:s}, {s:s}, {s:s}]", "id", "1", "id", "2", "id", "3", "id", "4");
    json_t *ans = json_loads(answer, 0, NULL), *out = synth_segments_cover(ans, msgs);
    char *text = json_dumps(out, JSON_COMPACT);
    json_decref(msgs), json_decref(ans), json_decref(out);
    return text;
}

static void test_segments_cover(void **state) {
    (void)state;
    static const struct {
        const char *answer, *want;
    } cases[] = {
        /* left-out messages join the segment before them; the first joins the first segment */
        {"[{\"topic\":\"a\",\"messages\":[\"2\"]},{\"topic\":\"b\",\"messages\":[\"4\"]}]",
         "[{\"topic\":\"a\",\"messages\":[\"1\",\"2\",\"3\"]},{\"topic\":\"b\",\"messages\":[\"4\"]}]"},
        /* an id given twice stays in its first segment; a segment left empty is dropped */
        {"[{\"topic\":\"a\",\"messages\":[\"1\",\"3\",\"1\"]},{\"topic\":\"b\",\"messages\":[\"3\"]}]",
         "[{\"topic\":\"a\",\"messages\":[\"1\",\"2\",\"3\",\"4\"]}]"},
        /* unknown ids are ignored; no usable segment: the whole conversation */
        {"[{\"topic\":\"a\",\"messages\":[\"9\"]}]", "[{\"topic\":\"a\",\"messages\":[\"1\",\"2\",\"3\",\"4\"]}]"},
        {"{\"not\":\"a list\"}", "[{\"topic\":\"\",\"messages\":[\"1\",\"2\",\"3\",\"4\"]}]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = covered(cases[i].answer);
        assert_string_equal(got, cases[i].want);
        free(got);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_markdown),
        cmocka_unit_test(test_links_and_checks),
        cmocka_unit_test(test_gate),
        cmocka_unit_test(test_unlink_and_answers),
        cmocka_unit_test(test_stage_schemas_compile),
        cmocka_unit_test(test_segments_cover),
        cmocka_unit_test(test_since),
    };
    return cmocka_run_group_tests_name("memory", tests, NULL, NULL);
}
