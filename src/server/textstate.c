/* textstate.c: the output-text state machine (normal / reasoning / tool) behind
 * textstate.h, a byte-level port of mlx_lm.generate.TextStateMachine plus the
 * per-segment bookkeeping of mlx_lm.server's handle_completion. Matching bytes instead
 * of code points gives the same matches for UTF-8 text. No JSON, no HTTP here. */
#include "server/textstate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/sbuf.h"

enum { ST_NORMAL = 0, ST_REASONING, ST_TOOL, ST_COUNT };

/* One Aho-Corasick node. Children are a short linear list: markers are few and the
 * alphabet is bytes, so a 256-entry table per node would be mostly empty. */
typedef struct ac_node {
    unsigned char *keys;
    int *kids;
    int n_kids, cap_kids;
    int fail;
    int match_len; /* 0 = no match ends here (own or inherited through fail) */
    int match_dst; /* state entered on a match */
} ac_node;

typedef struct ac_trie {
    ac_node *nodes;
    int n, cap;
} ac_trie;

struct ts_parser {
    ac_trie tries[ST_COUNT];
    int state, node, prev_state;
    bool done, made_tool_call;
    sbuf buf;                    /* held-back bytes that may start a marker */
    sbuf content, reasoning, tool_text;
    char **tool_texts;           /* completed tool spans waiting for the caller */
    size_t *tool_lens;
    size_t n_tools, cap_tools;
    bool oom;
};

static int ac_add_node(ac_trie *t) {
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 16;
        ac_node *nn = realloc(t->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return -1;
        t->nodes = nn;
        t->cap = cap;
    }
    memset(&t->nodes[t->n], 0, sizeof(ac_node));
    return t->n++;
}

static int ac_child(const ac_trie *t, int node, unsigned char c) {
    const ac_node *nd = &t->nodes[node];
    for (int i = 0; i < nd->n_kids; i++)
        if (nd->keys[i] == c) return nd->kids[i];
    return -1;
}

static int ac_add_child(ac_trie *t, int node, unsigned char c) {
    int kid = ac_add_node(t);
    if (kid < 0) return -1;
    ac_node *nd = &t->nodes[node];
    if (nd->n_kids == nd->cap_kids) {
        int cap = nd->cap_kids ? nd->cap_kids * 2 : 2;
        unsigned char *k = realloc(nd->keys, (size_t)cap);
        if (!k) return -1;
        nd->keys = k;
        int *kk = realloc(nd->kids, (size_t)cap * sizeof *kk);
        if (!kk) return -1;
        nd->kids = kk;
        nd->cap_kids = cap;
    }
    nd->keys[nd->n_kids] = c;
    nd->kids[nd->n_kids++] = kid;
    return kid;
}

/* Inserts one pattern; a later identical pattern replaces the earlier one's target,
 * as upstream's dict-based trie does. Empty patterns are skipped (they would match
 * everywhere). Returns false on OOM. */
static bool ac_insert(ac_trie *t, const char *pat, int dst) {
    size_t len = strlen(pat);
    if (len == 0) return true;
    if (len > (size_t)1 << 30) return false;
    int node = 0;
    for (size_t i = 0; i < len; i++) {
        int kid = ac_child(t, node, (unsigned char)pat[i]);
        if (kid < 0) kid = ac_add_child(t, node, (unsigned char)pat[i]);
        if (kid < 0) return false;
        node = kid;
    }
    t->nodes[node].match_len = (int)len;
    t->nodes[node].match_dst = dst;
    return true;
}

/* Breadth-first failure links; a node without its own match inherits its fail
 * node's (upstream propagates the same way, so the longest-suffix rule matches). */
static bool ac_build(ac_trie *t) {
    int *queue = malloc((size_t)t->n * sizeof *queue);
    if (!queue) return false;
    int head = 0, tail = 0;
    for (int i = 0; i < t->nodes[0].n_kids; i++) {
        int kid = t->nodes[0].kids[i];
        t->nodes[kid].fail = 0;
        queue[tail++] = kid;
    }
    while (head < tail) {
        int parent = queue[head++];
        for (int i = 0; i < t->nodes[parent].n_kids; i++) {
            unsigned char c = t->nodes[parent].keys[i];
            int kid = t->nodes[parent].kids[i];
            queue[tail++] = kid;
            int f = t->nodes[parent].fail;
            while (ac_child(t, f, c) < 0 && f != 0) f = t->nodes[f].fail;
            int fk = ac_child(t, f, c);
            t->nodes[kid].fail = fk >= 0 ? fk : 0;
            ac_node *kn = &t->nodes[kid];
            if (kn->match_len == 0 && t->nodes[kn->fail].match_len > 0) {
                kn->match_len = t->nodes[kn->fail].match_len;
                kn->match_dst = t->nodes[kn->fail].match_dst;
            }
        }
    }
    free(queue);
    return true;
}

static int ac_step(const ac_trie *t, int node, unsigned char c) {
    while (ac_child(t, node, c) < 0 && node != 0) node = t->nodes[node].fail;
    int kid = ac_child(t, node, c);
    return kid >= 0 ? kid : node;
}

static void ac_free(ac_trie *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->nodes[i].keys);
        free(t->nodes[i].kids);
    }
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

/* ---- configuration inference ---- */

static const struct {
    const char *name;
    ts_tool_type type;
    const char *start, *end;
} TOOL_FORMATS[] = {
    {"json_tools", TS_TOOL_JSON_TOOLS, "<tool_call>", "</tool_call>"},
    {"qwen3_coder", TS_TOOL_QWEN3_CODER, "<tool_call>", "</tool_call>"},
    {"mistral", TS_TOOL_MISTRAL, "[TOOL_CALLS]", ""},
    {"pythonic", TS_TOOL_PYTHONIC, "<|tool_call_start|>", "<|tool_call_end|>"},
    {"llama3_json", TS_TOOL_LLAMA3_JSON, "<|python_tag|>", ""},
    {"glm47", TS_TOOL_GLM47, "<tool_call>", "</tool_call>"},
    {"kimi_k2", TS_TOOL_KIMI_K2, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"},
    {"gemma4", TS_TOOL_GEMMA4, "<|tool_call>", "<tool_call|>"},
    {"function_gemma", TS_TOOL_FUNCTION_GEMMA, "<start_function_call>", "<end_function_call>"},
    {"longcat", TS_TOOL_LONGCAT, "<longcat_tool_call>", "</longcat_tool_call>"},
    {"minimax_m2", TS_TOOL_MINIMAX_M2, "<minimax:tool_call>", "</minimax:tool_call>"},
    {"minicpm5", TS_TOOL_MINICPM5, "<function name=", "</function>"},
    {"muse_spark", TS_TOOL_MUSE_SPARK, "<atem:function_calls>", "</atem:function_calls>"},
    {"kimi_k3", TS_TOOL_KIMI_K3, "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"},
};
#define N_TOOL_FORMATS (sizeof TOOL_FORMATS / sizeof TOOL_FORMATS[0])

bool ts_tool_from_name(const char *name, ts_tool_type *out) {
    for (size_t i = 0; name && i < N_TOOL_FORMATS; i++)
        if (strcmp(TOOL_FORMATS[i].name, name) == 0) {
            *out = TOOL_FORMATS[i].type;
            return true;
        }
    return false;
}

void ts_set_tool(ts_config *cfg, ts_tool_type type) {
    for (size_t i = 0; i < N_TOOL_FORMATS; i++)
        if (TOOL_FORMATS[i].type == type) {
            cfg->tool = type;
            cfg->tool_name = TOOL_FORMATS[i].name;
            snprintf(cfg->tool_start, TS_MARKER_MAX, "%s", TOOL_FORMATS[i].start);
            snprintf(cfg->tool_end, TS_MARKER_MAX, "%s", TOOL_FORMATS[i].end);
            return;
        }
}

static bool has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* The order of mlx_lm.tokenizer_utils._infer_tool_parser: first match wins. */
static ts_tool_type infer_from_template(const char *t) {
    if (has(t, "<minimax:tool_call>")) return TS_TOOL_MINIMAX_M2;
    if (has(t, "<|tool_call>") && has(t, "<tool_call|>")) return TS_TOOL_GEMMA4;
    if (has(t, "<start_function_call>")) return TS_TOOL_FUNCTION_GEMMA;
    if (has(t, "<longcat_tool_call>")) return TS_TOOL_LONGCAT;
    if (has(t, "<arg_key>")) return TS_TOOL_GLM47;
    if (has(t, "<|tool_list_start|>") || has(t, "<|tool_call_start|>")) return TS_TOOL_PYTHONIC;
    /* The template source may spell the newline as an escape or as itself. */
    if (has(t, "<tool_call>\\n<function=") || has(t, "<tool_call>\n<function="))
        return TS_TOOL_QWEN3_CODER;
    if (has(t, "<|tool_calls_section_begin|>")) return TS_TOOL_KIMI_K2;
    if (has(t, "<function name=\"") && has(t, "<param name=\"")) return TS_TOOL_MINICPM5;
    if (has(t, "[TOOL_CALLS]")) return TS_TOOL_MISTRAL;
    if (has(t, "<atem:function_calls>")) return TS_TOOL_MUSE_SPARK;
    if (has(t, "<tool_call>") && has(t, "tool_call.name")) return TS_TOOL_JSON_TOOLS;
    return TS_TOOL_NONE;
}

static bool xtml_vocab(ts_has_token_fn has_token, void *ud) {
    return has_token(ud, "<|open|>") && has_token(ud, "<|close|>") &&
           has_token(ud, "<|sep|>") && has_token(ud, "<|end_of_msg|>");
}

hearth_status ts_infer(ts_config *cfg, const char *chat_template, const char *tool_parser_type,
                       ts_has_token_fn has_token, void *ud, bool llama3_tools,
                       hearth_error *err) {
    memset(cfg, 0, sizeof *cfg);
    static const char *const THINK[][2] = {
        {"<think>", "</think>"},
        {"<longcat_think>", "</longcat_think>"},
        {"<|think:start|>", "<|think:end|>"},
    };
    bool xtml = has_token && xtml_vocab(has_token, ud);
    for (size_t i = 0; has_token && i < 3 && !cfg->think_start[0]; i++)
        if (has_token(ud, THINK[i][0]) && has_token(ud, THINK[i][1])) {
            snprintf(cfg->think_start, TS_MARKER_MAX, "%s", THINK[i][0]);
            snprintf(cfg->think_end, TS_MARKER_MAX, "%s", THINK[i][1]);
        }
    if (!cfg->think_start[0] && has_token && has_token(ud, "<|channel>") &&
        has_token(ud, "<channel|>")) {
        snprintf(cfg->think_start, TS_MARKER_MAX, "<|channel>thought");
        snprintf(cfg->think_end, TS_MARKER_MAX, "<channel|>");
    }
    if (!cfg->think_start[0] && xtml) {
        snprintf(cfg->think_start, TS_MARKER_MAX, "<|open|>think<|sep|>");
        snprintf(cfg->think_end, TS_MARKER_MAX, "<|close|>think<|sep|>");
    }
    if (xtml) {
        static const char *const S[3] = {"<|open|>response<|sep|>", "<|close|>response<|sep|>",
                                         "<|close|>message<|sep|>"};
        for (int i = 0; i < 3; i++) snprintf(cfg->structural[i], TS_MARKER_MAX, "%s", S[i]);
        cfg->n_structural = 3;
    }

    ts_tool_type tool = TS_TOOL_NONE;
    if (tool_parser_type && tool_parser_type[0]) {
        if (!ts_tool_from_name(tool_parser_type, &tool))
            return err_set(err, HEARTH_ERR_FORMAT,
                           "tokenizer_config.json: tool_parser_type '%s' is not a known tool "
                           "parser",
                           tool_parser_type);
    } else {
        if (chat_template) tool = infer_from_template(chat_template);
        if (tool == TS_TOOL_NONE && has_token) {
            if (xtml) tool = TS_TOOL_KIMI_K3;
            else if (has_token(ud, "<|tool_call_start|>") && has_token(ud, "<|tool_call_end|>"))
                tool = TS_TOOL_PYTHONIC;
        }
        if (tool == TS_TOOL_NONE && llama3_tools && chat_template &&
            has(chat_template, "<|python_tag|>"))
            tool = TS_TOOL_LLAMA3_JSON;
    }
    if (tool != TS_TOOL_NONE) ts_set_tool(cfg, tool);
    return HEARTH_OK;
}

/* Last occurrence of needle in hay[0..len); -1 if absent. */
static long rfind(const char *hay, size_t len, const char *needle) {
    size_t n = strlen(needle);
    if (n == 0 || n > len) return -1;
    for (size_t i = len - n + 1; i-- > 0;)
        if (memcmp(hay + i, needle, n) == 0) return (long)i;
    return -1;
}

bool ts_prompt_opens_think(const ts_config *cfg, const char *prompt, size_t len) {
    if (!cfg->think_start[0] || !prompt) return false;
    return rfind(prompt, len, cfg->think_start) > rfind(prompt, len, cfg->think_end);
}

/* ---- the parser ---- */

ts_parser *ts_new(const ts_config *cfg, const char *const *stops, size_t n_stops,
                  bool start_in_reasoning, hearth_error *err) {
    ts_parser *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    sbuf_init(&p->buf);
    sbuf_init(&p->content);
    sbuf_init(&p->reasoning);
    sbuf_init(&p->tool_text);
    bool ok = true;
    for (int s = 0; s < ST_COUNT; s++) ok = ok && ac_add_node(&p->tries[s]) == 0;
    /* Edge order matters only for identical strings (the later one wins). */
    bool think = cfg->think_start[0] && cfg->think_end[0];
    bool tool = cfg->tool != TS_TOOL_NONE && cfg->tool_start[0];
    if (think) ok = ok && ac_insert(&p->tries[ST_NORMAL], cfg->think_start, ST_REASONING);
    if (tool) ok = ok && ac_insert(&p->tries[ST_NORMAL], cfg->tool_start, ST_TOOL);
    for (int i = 0; i < cfg->n_structural && i < 3; i++)
        ok = ok && ac_insert(&p->tries[ST_NORMAL], cfg->structural[i], ST_NORMAL);
    if (think) ok = ok && ac_insert(&p->tries[ST_REASONING], cfg->think_end, ST_NORMAL);
    if (think && tool) ok = ok && ac_insert(&p->tries[ST_REASONING], cfg->tool_start, ST_TOOL);
    if (tool && cfg->tool_end[0])
        ok = ok && ac_insert(&p->tries[ST_TOOL], cfg->tool_end, ST_NORMAL);
    for (int s = 0; s < ST_COUNT; s++)
        for (size_t i = 0; i < n_stops; i++)
            if (stops[i]) ok = ok && ac_insert(&p->tries[s], stops[i], s);
    for (int s = 0; s < ST_COUNT; s++) ok = ok && ac_build(&p->tries[s]);
    if (!ok) goto oom;
    p->state = p->prev_state = (start_in_reasoning && think) ? ST_REASONING : ST_NORMAL;
    return p;
oom:
    ts_free(p);
    err_set(err, HEARTH_ERR_NOMEM, "text state machine: out of memory");
    return NULL;
}

void ts_free(ts_parser *p) {
    if (!p) return;
    for (int s = 0; s < ST_COUNT; s++) ac_free(&p->tries[s]);
    sbuf_free(&p->buf);
    sbuf_free(&p->content);
    sbuf_free(&p->reasoning);
    sbuf_free(&p->tool_text);
    ts_clear_pending(p);
    free(p->tool_texts);
    free(p->tool_lens);
    free(p);
}

static void push_tool_text(ts_parser *p) {
    if (p->n_tools == p->cap_tools) {
        size_t cap = p->cap_tools ? p->cap_tools * 2 : 4;
        char **t = realloc(p->tool_texts, cap * sizeof *t);
        if (!t) goto oom;
        p->tool_texts = t;
        size_t *l = realloc(p->tool_lens, cap * sizeof *l);
        if (!l) goto oom;
        p->tool_lens = l;
        p->cap_tools = cap;
    }
    size_t len = p->tool_text.len;
    char *text = sbuf_steal(&p->tool_text);
    if (!text) text = calloc(1, 1); /* an empty span is still a (failing) tool call */
    if (!text) goto oom;
    p->tool_texts[p->n_tools] = text;
    p->tool_lens[p->n_tools++] = len;
    sbuf_init(&p->tool_text);
    return;
oom:
    p->oom = true;
}

/* One (state, text) segment, as server.py's loop over split() segments handles it. */
static void segment(ts_parser *p, int state, const char *text, size_t len) {
    if (state == ST_REASONING) {
        sbuf_append(&p->reasoning, text, len);
    } else if (state == ST_TOOL) {
        sbuf_append(&p->tool_text, text, len);
    } else {
        if (p->prev_state == ST_TOOL) {
            push_tool_text(p);
            p->made_tool_call = true;
        }
        sbuf_append(&p->content, text, len);
    }
    p->prev_state = state;
}

/* TextStateMachine.split: buf[begin..consumed) is safe text of the current state,
 * buf[consumed..) may still become a marker and is kept for the next call. */
static void split(ts_parser *p, const char *text, size_t len) {
    size_t start = p->buf.len;
    sbuf_append(&p->buf, text, len);
    if (p->buf.oom) {
        p->oom = true;
        return;
    }
    const unsigned char *b = (const unsigned char *)p->buf.data;
    size_t n = p->buf.len, begin = 0, consumed = 0;
    for (size_t i = start; i < n; i++) {
        const ac_trie *t = &p->tries[p->state];
        p->node = ac_step(t, p->node, b[i]);
        const ac_node *nd = &t->nodes[p->node];
        if (nd->match_len > 0) {
            size_t mstart = i + 1 >= (size_t)nd->match_len ? i + 1 - (size_t)nd->match_len : 0;
            segment(p, p->state, p->buf.data + begin, mstart > begin ? mstart - begin : 0);
            begin = consumed = i + 1;
            p->state = nd->match_dst;
            p->node = 0;
        } else if (p->node == 0) {
            consumed = i + 1;
        }
    }
    segment(p, p->state, p->buf.data + begin, consumed - begin);
    memmove(p->buf.data, p->buf.data + consumed, n - consumed);
    p->buf.len = n - consumed;
    p->buf.data[p->buf.len] = '\0';
}

hearth_status ts_feed(ts_parser *p, const char *text, size_t len, ts_finish finish,
                      hearth_error *err) {
    if (p->done) return HEARTH_OK;
    if (!text) len = 0;
    if (finish == TS_FINISH_STOP) {
        /* The stop token's text is never shown and a held-back partial marker dies. */
        sbuf_reset(&p->buf);
        p->node = 0;
        segment(p, p->state, "", 0);
        p->done = true;
    } else {
        split(p, text ? text : "", len);
        if (finish == TS_FINISH_LENGTH) {
            size_t n = p->buf.len;
            segment(p, p->state, p->buf.data ? p->buf.data : "", n);
            sbuf_reset(&p->buf);
            p->node = 0;
            p->done = true;
        }
    }
    if (p->oom || p->content.oom || p->reasoning.oom || p->tool_text.oom)
        return err_set(err, HEARTH_ERR_NOMEM, "text state machine: out of memory");
    return HEARTH_OK;
}

void ts_end(ts_parser *p) {
    if (p->prev_state == ST_TOOL && p->tool_text.len > 0) {
        push_tool_text(p);
        p->made_tool_call = true;
    }
}

void ts_pending(const ts_parser *p, ts_pending_view *out) {
    out->content = p->content.data ? p->content.data : "";
    out->content_len = p->content.len;
    out->reasoning = p->reasoning.data ? p->reasoning.data : "";
    out->reasoning_len = p->reasoning.len;
    out->n_tools = p->n_tools;
    out->tool_texts = (const char *const *)p->tool_texts;
    out->tool_lens = p->tool_lens;
}

bool ts_has_pending(const ts_parser *p) {
    return p->content.len > 0 || p->reasoning.len > 0 || p->n_tools > 0;
}

void ts_clear_pending(ts_parser *p) {
    sbuf_reset(&p->content);
    sbuf_reset(&p->reasoning);
    for (size_t i = 0; i < p->n_tools; i++) free(p->tool_texts[i]);
    p->n_tools = 0;
}

bool ts_in_tool(const ts_parser *p) { return p->state == ST_TOOL; }
bool ts_in_reasoning(const ts_parser *p) { return p->state == ST_REASONING; }

const char *ts_finish_reason(const ts_parser *p, ts_finish finish) {
    if (finish == TS_FINISH_LENGTH) return "length";
    return p->made_tool_call ? "tool_calls" : "stop";
}

/* ---- the end of the first tool call ---- */

bool ts_call_watch_init(ts_call_watch *w, const ts_config *cfg) {
    memset(w, 0, sizeof *w);
    if (cfg->tool == TS_TOOL_NONE || !cfg->tool_start[0]) return false;
    memcpy(w->tool_start, cfg->tool_start, sizeof w->tool_start);
    memcpy(w->tool_end, cfg->tool_end, sizeof w->tool_end);
    return true;
}

/* Appends c to the window of recent bytes; whether it now ends with marker. */
static bool window_push(ts_call_watch *w, char c, const char *marker) {
    if (w->window_len == sizeof w->window) {
        memmove(w->window, w->window + 1, sizeof w->window - 1);
        w->window_len--;
    }
    w->window[w->window_len++] = c;
    size_t n = strlen(marker);
    return n && n <= w->window_len && !memcmp(w->window + w->window_len - n, marker, n);
}

/* One byte of a call without an end marker: whether its first JSON value closed. */
static bool json_value_closes(ts_call_watch *w, char c) {
    if (w->in_string) {
        if (w->escaped) w->escaped = 0;
        else if (c == '\\') w->escaped = 1;
        else if (c == '"') w->in_string = 0;
        return false;
    }
    if (c == '"' && w->depth > 0) w->in_string = 1;
    else if (c == '{' || c == '[') w->depth++;
    else if ((c == '}' || c == ']') && w->depth > 0) return --w->depth == 0;
    return false;
}

long ts_call_watch_feed(ts_call_watch *w, const char *text, size_t len) {
    for (size_t i = 0; i < len && !w->ended; i++) {
        if (!w->in_call) {
            if (window_push(w, text[i], w->tool_start)) w->in_call = 1, w->lead = 1, w->window_len = 0;
            continue;
        }
        if (!w->tool_end[0] && w->lead) { /* the value starts at once, or after a header */
            char c = text[i];
            if (w->lead == 2) {
                if (window_push(w, c, "[ARGS]")) w->lead = 0;
                continue;
            }
            if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
            w->lead = c == '{' || c == '[' ? 0 : 2;
            if (w->lead) {
                window_push(w, c, "[ARGS]");
                continue;
            }
        }
        if (w->tool_end[0] ? window_push(w, text[i], w->tool_end) : json_value_closes(w, text[i])) {
            w->ended = 1;
            return (long)(i + 1);
        }
    }
    return -1;
}
