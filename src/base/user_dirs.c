/* user_dirs.c: see user_dirs.h. */
#define _GNU_SOURCE
#include "base/user_dirs.h"
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *set(const char *env) {
    const char *v = env ? getenv(env) : NULL;
    return v && *v ? v : NULL;
}

static const char *home_dir(void) {
    const char *h = set("HOME");
    if (h) return h;
    struct passwd *pw = getpwuid(getuid());
    return pw && pw->pw_dir && *pw->pw_dir ? pw->pw_dir : NULL;
}

static char *join(const char *a, const char *b, const char *c) {
    size_t n = strlen(a) + (b ? strlen(b) : 0) + (c ? strlen(c) : 0) + 3;
    char *out = malloc(n);
    if (!out) return NULL;
    snprintf(out, n, "%s%s%s%s%s", a, b && *b ? "/" : "", b ? b : "", c && *c ? "/" : "", c ? c : "");
    return out;
}

char *user_path(const char *override_env, user_base base, const char *rel) {
    const char *v = set(override_env);
    if (v) return strdup(v);
    const char *xdg = base == USER_CONFIG ? set("XDG_CONFIG_HOME") : base == USER_DATA ? set("XDG_DATA_HOME") : NULL;
    if (xdg) return join(xdg, rel, NULL);
    const char *home = home_dir();
    if (!home) return NULL;
    return join(home, base == USER_CONFIG ? ".config" : base == USER_DATA ? ".local/share" : NULL, rel);
}

const char *user_setting(const char *given, const char *env) {
    if (given && *given) return given;
    return set(env);
}
