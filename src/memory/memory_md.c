/* memory_md.c: the little Markdown the memory needs: YAML-ish front matter (key: value
 * lines), ATX headings outside code fences with their sections and Obsidian-style slugs,
 * [[wikilinks]], and the checks that make a vault unsafe to write (conflict markers,
 * invalid UTF-8). Bounds-checked against len everywhere: fuzzed by fuzz_memory_md. */
#include "memory/memory.h"
#include "tok/tok_internal.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static size_t line_end(const char *t, size_t len, size_t i) {
    while (i < len && t[i] != '\n') i++;
    return i;
}

static void copy_trimmed(const char *s, size_t n, char *out, size_t cap) {
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    if (n >= 2 && (s[0] == '"' || s[0] == '\'') && s[n - 1] == s[0]) s++, n -= 2;
    if (n >= cap) n = cap - 1;
    memcpy(out, s, n);
    out[n] = 0;
}

void md_slug(const char *text, size_t len, char *out, size_t cap) {
    size_t o = 0;
    int dash = 0;
    for (size_t i = 0; i < len && o + 1 < cap; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c >= 0x80 || isalnum(c) || c == '_') {
            if (dash && o) out[o++] = '-';
            dash = 0;
            if (o + 1 < cap) out[o++] = (char)(c < 0x80 ? tolower(c) : c);
        } else if (c == ' ' || c == '-' || c == '\t')
            dash = 1;
    }
    out[o] = 0;
}

/* Front matter: "---\n" at the very start, up to a line "---". */
static size_t front_matter(const char *t, size_t len, md_doc *d) {
    if (len < 4 || strncmp(t, "---", 3) || (t[3] != '\n' && t[3] != '\r')) return 0;
    size_t i = line_end(t, len, 0) + 1;
    while (i < len) {
        size_t e = line_end(t, len, i);
        if (e - i >= 3 && !strncmp(t + i, "---", 3)) return e < len ? e + 1 : e;
        const char *colon = memchr(t + i, ':', e - i);
        if (colon) {
            size_t k = (size_t)(colon - (t + i)), v = (size_t)(colon - t) + 1;
            if (k == 5 && !strncmp(t + i, "title", 5)) copy_trimmed(t + v, e - v, d->title, sizeof d->title);
            if (k == 6 && !strncmp(t + i, "source", 6)) copy_trimmed(t + v, e - v, d->source, sizeof d->source);
            if (k == 7 && !strncmp(t + i, "created", 7)) copy_trimmed(t + v, e - v, d->created, sizeof d->created);
        }
        i = e + 1;
    }
    return 0; /* no closing line: not front matter */
}

static int is_fence(const char *t, size_t i, size_t e) {
    while (i < e && t[i] == ' ') i++;
    return e - i >= 3 && (!strncmp(t + i, "```", 3) || !strncmp(t + i, "~~~", 3));
}

int md_parse(const char *t, size_t len, const char *stem, md_doc *d) {
    memset(d, 0, sizeof *d);
    d->body = front_matter(t, len, d);
    size_t cap = 0;
    int fenced = 0;
    for (size_t i = d->body; i < len;) {
        size_t e = line_end(t, len, i);
        if (is_fence(t, i, e))
            fenced = !fenced;
        else if (!fenced && t[i] == '#') {
            int level = 0;
            while (i + level < e && t[i + level] == '#') level++;
            if (level <= 6 && (i + level == e || t[i + level] == ' ')) {
                if (d->n_headings == cap) {
                    cap = cap ? cap * 2 : 16;
                    md_heading *h = realloc(d->headings, cap * sizeof *h);
                    if (!h) return -1;
                    d->headings = h;
                }
                md_heading *h = &d->headings[d->n_headings++];
                h->level = level;
                copy_trimmed(t + i + level, e - i - level, h->text, sizeof h->text);
                md_slug(h->text, strlen(h->text), h->anchor, sizeof h->anchor);
                h->start = i;
                h->body = e < len ? e + 1 : e;
                h->end = len;
            }
        }
        i = e + 1;
    }
    for (size_t a = 0; a < d->n_headings; a++)
        for (size_t b = a + 1; b < d->n_headings; b++)
            if (d->headings[b].level <= d->headings[a].level) {
                d->headings[a].end = d->headings[b].start;
                break;
            }
    if (!d->title[0]) {
        for (size_t a = 0; a < d->n_headings; a++)
            if (d->headings[a].level == 1) {
                snprintf(d->title, sizeof d->title, "%s", d->headings[a].text);
                break;
            }
        if (!d->title[0]) snprintf(d->title, sizeof d->title, "%s", stem);
    }
    return 0;
}

void md_doc_free(md_doc *d) {
    free(d->headings);
    d->headings = NULL;
    d->n_headings = 0;
}

const md_heading *md_find_heading(const md_doc *d, const char *anchor) {
    while (*anchor == '#') anchor++;
    char slug[256];
    md_slug(anchor, strlen(anchor), slug, sizeof slug);
    for (size_t i = 0; i < d->n_headings; i++)
        if (!strcasecmp(d->headings[i].text, anchor) || !strcmp(d->headings[i].anchor, slug)) return &d->headings[i];
    return NULL;
}

size_t md_wikilinks(const char *t, size_t len, md_link_fn fn, void *user) {
    size_t n = 0;
    int fenced = 0;
    for (size_t i = 0; i < len;) {
        size_t e = line_end(t, len, i);
        if (is_fence(t, i, e)) {
            fenced = !fenced;
            i = e + 1;
            continue;
        }
        for (size_t j = i; !fenced && j + 1 < e; j++) {
            if (t[j] != '[' || t[j + 1] != '[') continue;
            size_t k = j + 2;
            while (k + 1 < e && !(t[k] == ']' && t[k + 1] == ']')) k++;
            if (k + 1 >= e) break; /* unclosed on this line: not a link */
            size_t tgt_end = j + 2, head = 0, head_end = 0;
            while (tgt_end < k && t[tgt_end] != '|' && t[tgt_end] != '#') tgt_end++;
            if (tgt_end < k && t[tgt_end] == '#') {
                head = tgt_end + 1;
                head_end = head;
                while (head_end < k && t[head_end] != '|') head_end++;
            }
            char target[256], heading[256] = "";
            copy_trimmed(t + j + 2, tgt_end - (j + 2), target, sizeof target);
            if (head) copy_trimmed(t + head, head_end - head, heading, sizeof heading);
            if (target[0] || heading[0]) {
                n++;
                if (fn) fn(user, target, heading);
            }
            j = k + 1;
        }
        i = e + 1;
    }
    return n;
}

int md_has_conflict_markers(const char *t, size_t len) {
    /* both ends of a conflict: a lone "=======" is a setext heading underline */
    int open = 0, close = 0;
    for (size_t i = 0; i < len; i = line_end(t, len, i) + 1) {
        if (len - i >= 8 && !memcmp(t + i, "<<<<<<< ", 8)) open = 1;
        if (len - i >= 8 && !memcmp(t + i, ">>>>>>> ", 8)) close = 1;
    }
    return open && close;
}

/* well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF): the
 * tokenizer's check */
int md_valid_utf8(const char *text, size_t len) { return tok_utf8_valid(text, len); }
