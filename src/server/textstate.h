/* textstate.h: the output-text state machine of mlx_lm.server (contract §5 "Output
 * text"): splits streamed decoded text into content / reasoning / tool-call text by
 * markers, strips markers and stop strings, holds back possible partial markers.
 * Plain C, no HTTP and no JSON; tool-call text is parsed by toolparse.h.
 *
 * How the server uses it, per request (mirrors mlx_lm/server.py handle_completion):
 *
 *   ts_config cfg;  ts_infer(&cfg, template_text, cfg_tool_parser_type, has_tok, ud, false, &err);   (once per model)
 *   bool reasoning = is_chat && ts_prompt_opens_think(&cfg, rendered_prompt, len);
 *   ts_parser *p = ts_new(&cfg, stops, n_stops, reasoning, &err);
 *   for each generated token (text = its newly decoded text, may be ""):
 *       ts_feed(p, text, len, finish);        finish: TS_FINISH_NONE / _STOP / _LENGTH
 *       if (streaming && !ts_in_tool(p) && ts_has_pending(p)) {
 *           send a chunk built from ts_pending(p) (content, reasoning, tool texts ->
 *           tp_format_calls), then ts_clear_pending(p);
 *       }
 *   ts_end(p);                                 after the last token
 *   finish_reason = ts_finish_reason(p, finish_of_last_token);   "stop"/"length"/"tool_calls"
 *   final chunk / non-streaming message from ts_pending(p); ts_free(p).
 *
 * On TS_FINISH_STOP the token's text is NOT consumed (it is the EOS/stop-sequence
 * token) and the held-back buffer is discarded; on TS_FINISH_LENGTH the text is
 * consumed and the buffer flushed as the current state's text. Text completions use
 * the same machine (start state normal); their reasoning/tool text is just dropped. */
#ifndef HEARTH_SERVER_TEXTSTATE_H
#define HEARTH_SERVER_TEXTSTATE_H
#include <stdbool.h>
#include <stddef.h>
#include "hearth.h"

/* Tool-call formats. The marker pairs of every upstream parser are known so the text
 * splits exactly as upstream does; toolparse.h parses the bodies of JSON_TOOLS,
 * QWEN3_CODER, MISTRAL, PYTHONIC and LLAMA3_JSON. The others parse to "unsupported"
 * (the call is dropped with a warning, as upstream drops text it cannot parse). */
typedef enum {
    TS_TOOL_NONE = 0,
    TS_TOOL_JSON_TOOLS,     /* <tool_call>{"name":..,"arguments":{..}}</tool_call> */
    TS_TOOL_QWEN3_CODER,    /* <tool_call>\n<function=f>\n<parameter=p>v</parameter>... */
    TS_TOOL_MISTRAL,        /* [TOOL_CALLS]... to the end of the output (no end marker) */
    TS_TOOL_PYTHONIC,       /* <|tool_call_start|>[f(a=1)]<|tool_call_end|> */
    TS_TOOL_LLAMA3_JSON,    /* hearth extension: <|python_tag|>{"name":..,"parameters":..} */
    TS_TOOL_GLM47,          /* markers only */
    TS_TOOL_KIMI_K2,        /* markers only */
    TS_TOOL_GEMMA4,         /* <|tool_call>call:f{a:<|"|>x<|"|>}<tool_call|> */
    TS_TOOL_FUNCTION_GEMMA, /* markers only */
    TS_TOOL_LONGCAT,        /* markers only */
    TS_TOOL_MINIMAX_M2,     /* markers only */
    TS_TOOL_MINICPM5,       /* <function name="f"><param name="p">v</param></function> */
    TS_TOOL_MUSE_SPARK,     /* markers only */
    TS_TOOL_KIMI_K3,        /* markers only */
} ts_tool_type;

/* Marker strings longer than this do not exist in any supported format. */
#define TS_MARKER_MAX 48

typedef struct ts_config {
    char think_start[TS_MARKER_MAX]; /* "" = model has no thinking markers */
    char think_end[TS_MARKER_MAX];
    ts_tool_type tool;               /* TS_TOOL_NONE = no tool parser */
    const char *tool_name;           /* upstream module name, e.g. "json_tools"; NULL if none */
    char tool_start[TS_MARKER_MAX];
    char tool_end[TS_MARKER_MAX];    /* "" = tool section lasts to the end (mistral) */
    /* Self-transitions of the normal state (stripped, state unchanged): the
     * "structural markers" upstream infers for <|open|>...<|sep|> vocabularies. */
    int n_structural;
    char structural[3][TS_MARKER_MAX];
} ts_config;

/* Answers whether `piece` is one token of the vocabulary (an exact vocab entry,
 * added/special tokens included). */
typedef bool (*ts_has_token_fn)(void *ud, const char *piece);

/* Fills cfg the way mlx-lm's tokenizer_utils infers it: think markers from the vocab
 * (<think>/</think>, <longcat_think>, <|think:start|>, then multi-token
 * <|channel>thought/<channel|>, <|open|>think<|sep|>); tool parser from
 * `tool_parser_type` (tokenizer_config.json's key; NULL or "" = absent), else from the
 * chat template text (first match wins, contract §5), else from the vocab.
 * chat_template may be NULL. `llama3_tools`: hearth extension, off for drop-in parity —
 * when no upstream parser matches and the template mentions <|python_tag|>, select
 * TS_TOOL_LLAMA3_JSON (mlx-lm 0.32.2 has no Llama parser: its tool calls stay content).
 * Fails only for an unknown tool_parser_type (upstream fails to load the model). */
hearth_status ts_infer(ts_config *cfg, const char *chat_template, const char *tool_parser_type,
                       ts_has_token_fn has_token, void *ud, bool llama3_tools,
                       hearth_error *err);

/* Maps an upstream module name ("json_tools", ...) to the enum; false if unknown. */
bool ts_tool_from_name(const char *name, ts_tool_type *out);
/* Sets cfg's tool format (type, name and markers); TS_TOOL_NONE leaves cfg unchanged. */
void ts_set_tool(ts_config *cfg, ts_tool_type type);

/* True when the rendered prompt's last think-start marker comes after its last
 * think-end marker (the template pre-opened a think block): start in reasoning.
 * Upstream searches token ids; searching the marker text is equivalent for markers
 * that are single special tokens. Only for chat requests. */
bool ts_prompt_opens_think(const ts_config *cfg, const char *prompt, size_t len);

typedef enum { TS_FINISH_NONE = 0, TS_FINISH_STOP, TS_FINISH_LENGTH } ts_finish;

typedef struct ts_parser ts_parser;

/* stops: the request's stop strings (empty strings are ignored); they are stripped
 * in every state and held back while partial. Returns NULL on out-of-memory. */
ts_parser *ts_new(const ts_config *cfg, const char *const *stops, size_t n_stops,
                  bool start_in_reasoning, hearth_error *err);
void ts_free(ts_parser *p);

/* Consumes one generation step's text (any bytes; len may be 0). See the top comment
 * for what finish does. After a STOP or LENGTH step, further feeds are ignored. */
hearth_status ts_feed(ts_parser *p, const char *text, size_t len, ts_finish finish,
                      hearth_error *err);

/* Call once after the last token: an unterminated tool section (mistral, or a
 * truncated call) becomes a tool text if it is non-empty, as upstream does. */
void ts_end(ts_parser *p);

/* Text produced since the last ts_clear_pending. Pointers stay valid until the next
 * ts_feed / ts_end / ts_clear_pending / ts_free. Content and reasoning are
 * NUL-terminated; each tool text is one start..end span, markers stripped, to be
 * given to tp_format_calls (an empty span is kept: upstream tries and drops it). */
typedef struct ts_pending_view {
    const char *content;
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
    size_t n_tools;
    const char *const *tool_texts;
    const size_t *tool_lens;
} ts_pending_view;
void ts_pending(const ts_parser *p, ts_pending_view *out);
bool ts_has_pending(const ts_parser *p); /* content, reasoning or a tool text waiting */
void ts_clear_pending(ts_parser *p);

/* The current state is inside a tool section: a streaming server sends nothing for
 * this step (upstream's rule), even if content is pending. */
bool ts_in_tool(const ts_parser *p);
/* Whether the current state is reasoning (for diagnostics and tests). */
bool ts_in_reasoning(const ts_parser *p);

/* Where the model's first tool call ends (parallel tool calls off with tool_choice "auto":
 * the generation stops there). Fed the same text as the parser, token by token, on any
 * thread. A call opens at the tool-start marker (the parser enters its tool state from
 * content and from reasoning alike) and ends at the tool-end marker, or, in the formats
 * without one (mistral, llama3_json), where its first JSON value closes (an object, after
 * mistral's name[ARGS] header if it has one, or mistral's whole [...] list). */
typedef struct ts_call_watch {
    char tool_start[TS_MARKER_MAX], tool_end[TS_MARKER_MAX];
    int in_call, ended;
    /* a call without an end marker: before its value (1), in mistral's name[ARGS] header
     * (2), in the value (0); the value's JSON nesting */
    int lead, depth, in_string, escaped;
    char window[TS_MARKER_MAX];    /* the last bytes seen, for markers split across tokens */
    size_t window_len;
} ts_call_watch;

/* Whether cfg's tool format has calls to watch (a tool parser with a start marker). */
bool ts_call_watch_init(ts_call_watch *w, const ts_config *cfg);
/* The bytes of text up to and including the end of the first call, or -1 while it has not
 * ended (and after it ended: the first call ends once). */
long ts_call_watch_feed(ts_call_watch *w, const char *text, size_t len);

/* "tool_calls" when finish is STOP and a tool section was seen (even one that fails
 * to parse), else "stop" / "length". finish NONE counts as "stop" (upstream default). */
const char *ts_finish_reason(const ts_parser *p, ts_finish finish);

#endif
