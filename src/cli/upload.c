/* upload.c: `hearth upload <dir> --repo <org/name>[@branch] [--private] [--message M]`:
 * pushes a folder (a converted or quantized model) to a Hugging Face hub repo in one commit
 * (hearth_upload), with a progress bar on stderr for the large files; prints the commit URL.
 * Needs HF_TOKEN (a write token); HF_ENDPOINT picks another hub. */
#include "cli/cli.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *upload_usage =
    "hearth upload <dir> --repo <org/name>[@branch] [--private] [--message TEXT]\n"
    "  pushes every file under <dir> to the Hugging Face hub in one commit (creating the repo if\n"
    "  needed; large files through LFS). Needs HF_TOKEN (a write token); HF_ENDPOINT picks another\n"
    "  hub. Run it again after an interruption: files the hub already holds are not sent again.";

int cli_upload(int argc, char **argv) {
    const char *dir = NULL, *repo = NULL, *message = NULL;
    int priv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            printf("usage: %s\n", upload_usage);
            return 0;
        }
        if (!strcmp(a, "--private"))
            priv = 1;
        else if (!strcmp(a, "--repo") && i + 1 < argc)
            repo = argv[++i];
        else if (!strcmp(a, "--message") && i + 1 < argc)
            message = argv[++i];
        else if (a[0] == '-')
            return cli_usage_error(upload_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!dir)
            dir = a;
        else
            return cli_usage_error(upload_usage, "%s: unexpected argument", a);
    }
    if (!dir) return cli_usage_error(upload_usage, "%s", "need the folder to upload");
    if (!repo) return cli_usage_error(upload_usage, "%s", "need --repo org/name");
    cli_progress p = {.tty = isatty(2), .doing = "uploading"};
    hearth_upload_options o = {.message = message, .private_repo = priv, .on_progress = cli_transfer_progress, .user = &p};
    hearth_error err = {0};
    char *url = NULL;
    if (hearth_upload(dir, repo, &o, &url, &err)) {
        if (p.line_open) fputc('\n', stderr);
        return cli_fail(&err);
    }
    printf("%s\n", url && *url ? url : repo);
    hearth_free(url);
    return 0;
}
