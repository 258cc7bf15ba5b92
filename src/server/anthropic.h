/* anthropic.h: the Anthropic Messages API on `hearth serve` (POST /v1/messages
 * and /v1/messages/count_tokens): the request translation into the
 * chat-template form the OpenAI path uses (anthropic_request.c, pure and
 * fuzzed), the content-block builder that writes the reply or its event stream,
 * and the HTTP handlers (anthropic.c). Nothing here touches the engine except
 * through the job queue. */
#ifndef HEARTH_SERVER_ANTHROPIC_H
#define HEARTH_SERVER_ANTHROPIC_H
#include "server/server.h"

/* What a Messages request carries besides the srv_request it becomes. */
typedef struct anth_extra {
    int thinking;    /* "thinking": {"type": "enabled"}: reasoning becomes thinking
                        blocks */
    int tool_choice; /* ANTH_TOOL_CHOICE_* */
} anth_extra;

enum { ANTH_TOOL_CHOICE_AUTO, ANTH_TOOL_CHOICE_ANY, ANTH_TOOL_CHOICE_TOOL, ANTH_TOOL_CHOICE_NONE };

/* Parses and validates a Messages body (count_only: a count_tokens body, where
 * max_tokens is not required) into r (kind SRV_CHAT: OpenAI-style messages with
 * tool_calls and role "tool" messages, OpenAI function tools) and x. Returns 0,
 * or -1 with e filled (status 400, e->anthropic set) and r, x freed. */
int anth_request_parse(const char *body, size_t len, const srv_defaults *d, int count_only, srv_request *r,
                       anth_extra *x, srv_error *e);
void anth_extra_free(anth_extra *x);

/* {"type": "error", "error": {"type", "message"}} with the Anthropic error type
 * of e->http_status; caller frees. */
char *anth_error_body(const srv_error *e);
/* The Anthropic error type name of an HTTP status ("invalid_request_error",
 * ...). */
const char *anth_error_type(int http_status);

/* ---- content blocks: one builder for both the reply and the stream ---------
 */

typedef enum anth_block_kind { ANTH_BLOCK_NONE, ANTH_BLOCK_TEXT, ANTH_BLOCK_THINKING, ANTH_BLOCK_TOOL } anth_block_kind;

/* Consecutive text of one kind goes into one block; a change of kind or a tool
 * call closes it. Streaming: content_block_start/delta/stop events are appended
 * to out; otherwise the blocks are appended to content. */
typedef struct anth_blocks {
    int stream;
    sbuf *out;       /* streaming */
    json_t *content; /* non-streaming: the "content" array */
    anth_block_kind open;
    int index; /* of the open block; the next block gets index + 1 */
    int n_tool_use;
    sbuf text; /* non-streaming: the open text/thinking block's text so far */
} anth_blocks;

void anth_blocks_init(anth_blocks *b, int stream, sbuf *out, json_t *content);
void anth_blocks_text(anth_blocks *b, anth_block_kind kind, const char *text, size_t len);
/* A complete tool_use block; input must be an object (borrowed). */
void anth_blocks_tool(anth_blocks *b, const char *id, const char *name, const json_t *input);
void anth_blocks_close(anth_blocks *b);
void anth_blocks_free(anth_blocks *b);

/* "msg_..." / "toolu_..." ids: the prefix and 24 random alphanumerics. */
void anth_make_id(char *out, size_t cap, const char *prefix);

/* ---- HTTP (anthropic.c) ------------------------------------------------- */

int anth_handle_messages(srv_server *s, srv_conn *c, const char *body, size_t len);
int anth_handle_count_tokens(srv_server *s, srv_conn *c, const char *body, size_t len);

#endif
