/* browser.c: opens the chat page in the desktop's browser for `hearth` with no
 * arguments. Best effort only: without a display or xdg-open it does nothing, and
 * it never waits for the browser or fails the server. */
#define _GNU_SOURCE
#include "cli/cli.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Finds prog on PATH; fills out with its full path. */
static int find_on_path(const char *prog, char *out, size_t cap) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    for (const char *p = path; *p;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        int w = snprintf(out, cap, "%.*s/%s", (int)n, p, prog);
        if (n && w > 0 && (size_t)w < cap && !access(out, X_OK)) return 1;
        p += n + (colon != NULL);
    }
    return 0;
}

int cli_open_browser(const char *url) {
    const char *x = getenv("DISPLAY"), *w = getenv("WAYLAND_DISPLAY");
    if (!(x && x[0]) && !(w && w[0])) return 0; /* a headless box: printing the URL is all we can do */
    char prog[4096];
    if (!find_on_path("xdg-open", prog, sizeof prog)) return 0;
    /* Fork twice so xdg-open (which may wait for the browser to exit) is adopted by
     * init and never left as our zombie. The server's threads are running, so the
     * children only call async-signal-safe functions before exec. */
    pid_t child = fork();
    if (child < 0) return 0;
    if (child == 0) {
        if (fork() == 0) {
            int null = open("/dev/null", O_RDWR); /* its chatter would interleave with the server log */
            if (null >= 0) {
                dup2(null, STDIN_FILENO);
                dup2(null, STDOUT_FILENO);
                dup2(null, STDERR_FILENO);
            }
            char *argv[] = {"xdg-open", (char *)url, NULL};
            execv(prog, argv);
        }
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    return 1;
}
