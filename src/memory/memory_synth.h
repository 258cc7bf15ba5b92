/* memory_synth.h: the synthesis pipeline's internals shared by its stages
 * (memory_synth.c: segment, extract, route; memory_synth_article.c: synthesize, the gate,
 * link, publish and the run). */
#ifndef HEARTH_MEMORY_SYNTH_H
#define HEARTH_MEMORY_SYNTH_H
#include "memory/memory.h"
#include <jansson.h>

/* The share of an article's old prose (by bytes of its sentences) a rewrite must keep. */
#define SYNTH_KEEP_PROSE 0.70

hearth_status synth_open(hearth_memory *m, hearth_error *err);
/* Runs one of "segment", "extract", "route", "synthesize" over its waiting items (o->limit
 * at most); *done counts them. synthesize adds touched article names to articles and
 * counts edits the gate refused in *rejected. */
hearth_status synth_stage(hearth_memory *m, const char *stage, const hearth_memory_synth_options *o, int *done,
                          int *rejected, json_t *articles, hearth_error *err);
/* Asks o->llm (instructions, "INPUT:", the input as JSON) for an answer satisfying schema
 * (a JSON Schema; the runner decodes under it when it can); *out: its parsed JSON answer
 * or NULL when it gave none. A failing callback stops the run. */
hearth_status synth_ask(const hearth_memory_synth_options *o, const char *stage, const char *instructions,
                        json_t *input, json_t *schema, json_t **out, hearth_error *err);
/* The answer schemas, one per stage: ids (stolen) are the message ids the answer may cite. */
json_t *synth_schema_segments(json_t *ids);
json_t *synth_schema_facts(json_t *ids);
json_t *synth_schema_route(void);
/* The model's segments (ans) made to cover msgs: every message in exactly one segment,
 * in order ([{"topic", "messages": [ids]}]; memory_synth.c says how). */
json_t *synth_segments_cover(json_t *ans, json_t *msgs);
/* An article body of at most max_chars characters. */
json_t *synth_schema_article(size_t max_chars);
hearth_status stage_synthesize(hearth_memory *m, const hearth_memory_synth_options *o, int *done, int *rejected,
                               json_t *articles, hearth_error *err);
json_t *synth_parse_answer(const char *text);
int synth_has_secret(const char *text);
/* The messages of a conversation file as [{"id", "speaker", "text", "heading"}]; created
 * (optional) gets its front matter date. */
json_t *synth_conversation(const char *root, const char *rel, char *created, size_t cap);
void synth_article_name(const char *title, char *out, size_t cap);
/* A `since` bound ("YYYY-MM-DD", optionally "THH:MM" or " HH:MM" after it, a real date and
 * time) as the comparable key "YYYY-MM-DD[ HH:MM]" in key (cap >= 17); -1 when malformed. */
int synth_since_key(const char *since, char *key, size_t cap);
/* 1 when a conversation created at created (its front matter: "2023-05-08 13:56 UTC",
 * "2023-05-08T13:56:00Z", ...; "" when unknown) is older than the bound key. */
int synth_before(const char *created, const char *key);
/* The gate: the share of old's prose (sentences, by bytes) found verbatim in new_text,
 * 1 when old has none; and whether every footnote marker of old is in new_text. */
double synth_prose_kept(const char *old, const char *new_text);
int synth_citations_kept(const char *old, const char *new_text);
/* new_text with every [[link]] whose target exists() rejects replaced by its text. */
typedef int (*synth_exists_fn)(void *user, const char *target);
char *synth_unlink_dangling(const char *text, synth_exists_fn exists, void *user, int *changed);
#endif
