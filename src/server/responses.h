/* responses.h: the OpenAI Responses API on `hearth serve` (POST /v1/responses,
 * GET and DELETE /v1/responses/{id}): the request and its input items
 * (responses_request.c, pure and fuzzed), the in-memory store of past responses
 * behind previous_response_id (responses_store.c) and the HTTP handlers that run
 * a request through the shared generation path (responses.c). */
#ifndef HEARTH_SERVER_RESPONSES_H
#define HEARTH_SERVER_RESPONSES_H
#include "server/server.h"

/* A parsed Responses body. req.messages is filled by resp_build_messages once
 * the stored conversation of previous_response_id (if any) is known. */
typedef struct resp_request {
    srv_request req;
    json_t *input;       /* this request's input items, normalized: each an object with "type" */
    char *instructions;  /* NULL: none */
    char *previous_id;   /* NULL: a new conversation */
    int store;           /* keep the response for GET and previous_response_id */
    json_t *tools_echo;  /* the "tools" array as the response echoes it */
    json_t *tool_choice; /* echoed: "auto", "none", "required" or the object */
    json_t *text_format; /* echoed: the request's text.format (NULL: {"type": "text"}) */
    json_t *metadata;    /* echoed object ({} when absent) */
    int has_max_output;  /* max_output_tokens was given (echoed, else null) */
} resp_request;

/* Parses and validates a body into r (defaults from d). Returns 0, or -1 with e
 * filled (400) and r freed. */
int resp_request_parse(const char *body, size_t len, const srv_defaults *d, resp_request *r, srv_error *e);
void resp_request_free(resp_request *r);

/* Translates instructions (NULL: none) and Responses items (message,
 * function_call, function_call_output, reasoning) into chat-template messages:
 * developer/system -> "system", function_call -> assistant tool_calls,
 * function_call_output -> role "tool" (its call_id must name an earlier
 * function_call). Returns 0 with *out a new array, or -1 with e filled. */
int resp_items_to_messages(const json_t *items, const char *instructions, json_t **out, srv_error *e);

/* ---- the store (responses_store.c) ---------------------------------------- */

typedef struct resp_store resp_store;

/* ttl_s: seconds a response is kept; max_bytes: the cap on the stored JSON,
 * oldest evicted first. NULL on allocation failure. */
resp_store *resp_store_new(unsigned ttl_s, size_t max_bytes);
void resp_store_free(resp_store *st);
/* Keeps a copy of response and of items (the whole conversation so far: earlier
 * items, this input, this output). Returns 0, or -1 when it is larger than the
 * cap on its own (nothing is stored). */
int resp_store_put(resp_store *st, const char *id, const json_t *response, const json_t *items);
/* A copy of the stored conversation items (caller decrefs), or NULL. */
json_t *resp_store_items(resp_store *st, const char *id);
/* The stored response as JSON text (caller frees), or NULL. */
char *resp_store_response(resp_store *st, const char *id);
/* Returns 1 if it was there. */
int resp_store_delete(resp_store *st, const char *id);
/* Entries and bytes held now (for logs and /stats). */
void resp_store_stats(resp_store *st, size_t *entries, size_t *bytes);

/* ---- HTTP (responses.c) ---------------------------------------------------- */

int resp_handle_create(srv_server *s, srv_conn *c, const char *body, size_t len);
/* GET (is_delete 0) or DELETE /v1/responses/{id}. */
int resp_handle_id(srv_server *s, srv_conn *c, const char *id, int is_delete);

#endif
