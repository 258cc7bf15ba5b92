/* web_assets.c: the chat page (web/index.html, app.js, style.css) and the curve designer
 * (web/curves.html, curves.js, curves.css) and the training view (web/train.*) embedded in the
 * binary with the assembler's .incbin, so `make` needs no generator and no tools
 * beyond the compiler; the Makefile makes this object depend on the files in web/. Serves
 * them from memory with Content-Type, ETag and Cache-Control (through respond.c).
 * Knows nothing of the APIs; it must never read files at run time. */
#include "base/hash.h"
#include "server/web_assets.h"
#include "server/server.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Mach-O names its read-only section differently; hearth targets ELF first. */
#ifdef __APPLE__
#define WEB_SECTION ".const"
#define WEB_SYM(name) "_" #name
#define WEB_HIDDEN ".private_extern "
#else
#define WEB_SECTION ".section .rodata"
#define WEB_SYM(name) #name
#define WEB_HIDDEN ".hidden "
#endif

/* Paths are relative to the repository root, where make runs the compiler. The
 * symbols are hidden so they stay out of libhearth.so's exports. */
#define WEB_INCBIN(name, file)                                                                                         \
    __asm__(WEB_SECTION                                                                                                \
            "\n"                                                                                                       \
            ".globl " WEB_SYM(name##_start) "\n" WEB_HIDDEN WEB_SYM(                                                   \
                name##_start) "\n"                                                                                     \
                              ".globl " WEB_SYM(name##_end) "\n" WEB_HIDDEN WEB_SYM(                                   \
                                  name##_end) "\n"                                                                     \
                                              ".balign 16\n" WEB_SYM(name##_start) ":\n"                               \
                                                                                   ".incbin \"" file "\"\n" WEB_SYM(   \
                                                                                       name##_end) ":\n"               \
                                                                                                   ".byte 0\n"         \
                                                                                                   ".text\n");         \
    extern const unsigned char name##_start[], name##_end[]

WEB_INCBIN(web_index_html, "web/index.html");
WEB_INCBIN(web_app_js, "web/app.js");
WEB_INCBIN(web_style_css, "web/style.css");
WEB_INCBIN(web_curves_html, "web/curves.html");
WEB_INCBIN(web_curves_js, "web/curves.js");
WEB_INCBIN(web_curves_css, "web/curves.css");
WEB_INCBIN(web_train_html, "web/train.html");
WEB_INCBIN(web_train_js, "web/train.js");
WEB_INCBIN(web_train_css, "web/train.css");

typedef struct web_asset {
    const char *path, *content_type;
    const unsigned char *start, *end;
} web_asset;

static const web_asset assets[] = {
    {"/index.html", "text/html; charset=utf-8", web_index_html_start, web_index_html_end},
    {"/app.js", "text/javascript; charset=utf-8", web_app_js_start, web_app_js_end},
    {"/style.css", "text/css; charset=utf-8", web_style_css_start, web_style_css_end},
    {"/curves.html", "text/html; charset=utf-8", web_curves_html_start, web_curves_html_end},
    {"/curves.js", "text/javascript; charset=utf-8", web_curves_js_start, web_curves_js_end},
    {"/curves.css", "text/css; charset=utf-8", web_curves_css_start, web_curves_css_end},
    {"/train.html", "text/html; charset=utf-8", web_train_html_start, web_train_html_end},
    {"/train.js", "text/javascript; charset=utf-8", web_train_js_start, web_train_js_end},
    {"/train.css", "text/css; charset=utf-8", web_train_css_start, web_train_css_end},
};

const srv_web_asset_view *srv_web_find(const char *path, srv_web_asset_view *out) {
    if (!path) return NULL;
    /* `/` and the page's client-side routes (`/#/chat` never reaches us; the
     * fragment stays in the browser) */
    if (!strcmp(path, "/") || !strcmp(path, "/chat")) path = "/index.html";
    if (!strcmp(path, "/curves")) path = "/curves.html"; /* the sampling lab's designer */
    if (!strcmp(path, "/train")) path = "/train.html";   /* the training view */
    for (size_t i = 0; i < sizeof assets / sizeof assets[0]; i++) {
        if (strcmp(path, assets[i].path)) continue;
        out->content_type = assets[i].content_type;
        out->data = assets[i].start;
        out->size = (size_t)(assets[i].end - assets[i].start);
        /* FNV-1a 64 of the bytes: the ETag changes exactly when the file does */
        uint64_t h = fnv1a64(FNV1A64_INIT, out->data, out->size);
        snprintf(out->etag, sizeof out->etag, "\"%016llx\"", (unsigned long long)h);
        return out;
    }
    return NULL;
}

int srv_web_respond(srv_conn *c, const char *url) {
    srv_web_asset_view v;
    if (!srv_web_find(url, &v)) return -1;
    const char *inm = srv_header(c, "If-None-Match");
    int not_modified = inm && strstr(inm, v.etag) != NULL;
    /* spelled Content-Type here; the API answers keep mlx_lm.server's Content-type */
    const char *const headers[] = {"Content-Type", v.content_type, "ETag", v.etag,
                                   /* revalidate every time: the page must change when the binary does, and a 304
                                    * costs one round trip on loopback */
                                   "Cache-Control", "no-cache", "X-Content-Type-Options", "nosniff",
                                   /* the page talks only to this server; no inline scripts, no remote anything */
                                   "Content-Security-Policy",
                                   "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                                   "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                                   "Referrer-Policy", "no-referrer", NULL};
    return srv_respond_bytes(c, not_modified ? 304 : 200, NULL, v.data, not_modified ? 0 : v.size, headers);
}
