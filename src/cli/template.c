/* template.c: `hearth template`: renders a conversation through the model's chat
 * template and prints exactly the prompt on stdout, nothing else. */
#include "cli/cli.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *tpl_usage =
    "hearth template <model> --messages file.json [--tools file.json] [--no-generation-prompt]\n"
    "       [--chat-template file|text] [--chat-template-args json]\n"
    "  --messages: a JSON array of messages, or an object {\"messages\": [...], \"tools\": [...], \"extra\": {...}}";

/* Splits a {"messages","tools","extra"} object into its JSON texts. */
static int split_conversation(char *text, char **messages, char **tools, char **extra) {
    json_t *j = json_loads(text, 0, NULL);
    if (!json_is_object(j)) { json_decref(j); *messages = text; return 0; }
    const json_t *msg = json_object_get(j, "messages"), *t = json_object_get(j, "tools"),
                 *x = json_object_get(j, "extra");
    *messages = msg ? json_dumps(msg, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER) : strdup("null");
    if (json_is_array(t) && !*tools) *tools = json_dumps(t, JSON_PRESERVE_ORDER);
    if (json_is_object(x) && !*extra) *extra = json_dumps(x, JSON_PRESERVE_ORDER);
    json_decref(j);
    free(text);
    return 1;
}

int cli_template(int argc, char **argv) {
    const char *model = NULL, *msg_path = NULL, *tools_path = NULL, *tpl_arg = NULL, *args = NULL;
    int gen_prompt = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (cli_is_help(a)) { printf("usage: %s\n", tpl_usage); return 0; }
        if (!strcmp(a, "--messages") && has) msg_path = argv[++i];
        else if (!strcmp(a, "--tools") && has) tools_path = argv[++i];
        else if (!strcmp(a, "--chat-template") && has) tpl_arg = argv[++i];
        else if (!strcmp(a, "--chat-template-args") && has) args = argv[++i];
        else if (!strcmp(a, "--no-generation-prompt")) gen_prompt = 0;
        else if (a[0] == '-') return cli_usage_error(tpl_usage, "%s: unknown flag, or a flag without its value", a);
        else if (!model) model = a;
        else return cli_usage_error(tpl_usage, "%s: unexpected argument", a);
    }
    if (!model || !msg_path) return cli_usage_error(tpl_usage, "%s", "need a model and --messages");
    char *messages = cli_read_file(msg_path), *tools = NULL, *extra = args ? strdup(args) : NULL, *tpl = NULL;
    if (!messages) return 1;
    if (tools_path && !(tools = cli_read_file(tools_path))) { free(messages); return 1; }
    split_conversation(messages, &messages, &tools, &extra);
    if (tpl_arg) {
        FILE *f = fopen(tpl_arg, "rb");
        if (f) { fclose(f); tpl = cli_read_file(tpl_arg); }
        else tpl = strdup(tpl_arg); /* given inline, as mlx_lm.server's --chat-template */
    }
    hearth_model *m = NULL;
    int rc = cli_open_model(model, &m);
    hearth_error err = {0};
    if (!rc && tpl && hearth_model_set_chat_template(m, tpl, &err)) rc = cli_fail(&err);
    char *out = NULL;
    if (!rc && hearth_chat_render(m, messages, tools, gen_prompt, extra, &out, &err)) rc = cli_fail(&err);
    if (!rc) { fputs(out, stdout); hearth_free(out); }
    hearth_model_close(m);
    free(messages);
    free(tools);
    free(extra);
    free(tpl);
    return rc;
}
