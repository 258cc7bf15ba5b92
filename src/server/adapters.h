/* adapters.h: the LoRA adapter endpoints of `hearth serve` and which adapters a completion
 * request names (adapters.c). */
#ifndef HEARTH_SERVER_ADAPTERS_H
#define HEARTH_SERVER_ADAPTERS_H
#include "server/server.h"
#include <jansson.h>

int srv_adapters_get(srv_server *s, srv_conn *c);
int srv_adapters_post(srv_server *s, srv_conn *c, const char *body, size_t len);
int srv_adapters_delete(srv_server *s, srv_conn *c, const char *id);
int srv_adapters_available(srv_server *s, srv_conn *c);
/* The mounted adapters (hearth_adapters_json) as a JSON array (a new reference). */
json_t *srv_adapters_list(const srv_server *s);
/* The adapter spec a request asks for, into spec: its `adapter` field ("id", "a+b",
 * "none"), else its `adapters` path or id (mlx_lm.server's field), else its `model` when
 * that names a mounted adapter. Returns 1 when it names none (the server's default), 0 with
 * spec set (2: named by `model`), -1 with e filled (400: not mounted, or not combinable). */
int srv_adapter_spec(const srv_server *s, const srv_request *r, char *spec, size_t cap, srv_error *e);
#endif
