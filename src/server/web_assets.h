/* web_assets.h: the embedded chat page (web/), looked up by URL path and served
 * from memory through respond.c. No file access at run time. */
#ifndef HEARTH_SERVER_WEB_ASSETS_H
#define HEARTH_SERVER_WEB_ASSETS_H
#include <stddef.h>

typedef struct srv_conn srv_conn;

typedef struct srv_web_asset_view {
    const char *content_type;
    const unsigned char *data;
    size_t size;
    char etag[24]; /* quoted 16 hex digits */
} srv_web_asset_view;

/* Fills out for a page path ("/" is index.html) and returns it, or NULL when
 * the path is not part of the page. */
const srv_web_asset_view *srv_web_find(const char *path, srv_web_asset_view *out);

/* Answers a GET/HEAD for a page path (200, or 304 on a matching If-None-Match).
 * Returns -1 when url is not part of the page (nothing sent), 1 when sent, 0
 * when the connection failed. */
int srv_web_respond(srv_conn *c, const char *url);

#endif
