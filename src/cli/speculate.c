/* speculate.c: speculative decoding for the one-request verbs (generate, chat): their
 * flags (--speculate, --draft-model, --num-draft-tokens, as serve's) and the run of one
 * request through a hearth_batch of its own, whose scheduler proposes and verifies tokens
 * (hearth_generate never speculates). Holds no decoding logic of its own. */
#include "cli/cli.h"
#include <limits.h>
#include <stdio.h>
#include <string.h>

int cli_spec_flag(int argc, char **argv, int *i, cli_spec *s, hearth_engine_options *eo, const char *usage, int *rc) {
    const char *a = argv[*i];
    long n;
    *rc = 0;
    if (strcmp(a, "--speculate") && strcmp(a, "--draft-model") && strcmp(a, "--num-draft-tokens")) return 0;
    if (*i + 1 >= argc) {
        *rc = cli_usage_error(usage, "%s: needs a value", a);
        return 1;
    }
    const char *v = argv[++*i];
    if (!strcmp(a, "--speculate")) {
        if ((eo->speculate = hearth_speculate_parse(v)) < 0 || eo->speculate == HEARTH_SPEC_DRAFT)
            *rc = cli_usage_error(usage, "--speculate: '%s' is not lookup, suffix, mtp or none", v);
        s->speculate_given = 1;
    } else if (!strcmp(a, "--draft-model")) {
        s->draft_name = v;
    } else if (cli_parse_long(v, 0, INT_MAX, &n)) {
        *rc = cli_usage_error(usage, "--num-draft-tokens: invalid value '%s'", v);
    } else {
        s->num_draft_tokens = (int)n;
        s->num_draft_given = 1;
    }
    return 1;
}

int cli_spec_open(cli_spec *s, hearth_engine_options *eo, const char *plain_only, const char *usage) {
    /* off unless asked for: the plain path's text is the library's hearth_generate's (and
     * the Python package's) on every kernel tier; a verified step on the SIMD kernels can
     * break a greedy near-tie the other way */
    if (!s->speculate_given && !s->draft_name) eo->speculate = HEARTH_SPEC_NONE;
    if (s->draft_name && eo->speculate == HEARTH_SPEC_NONE)
        return cli_usage_error(usage, "%s",
                               "--draft-model proposes tokens to speculate with: not with --speculate none");
    if (s->num_draft_given && !s->draft_name && eo->speculate != HEARTH_SPEC_MTP)
        return cli_usage_error(usage, "%s", "--num-draft-tokens goes with --draft-model or --speculate mtp");
    if (plain_only && (s->draft_name || (s->speculate_given && eo->speculate != HEARTH_SPEC_NONE)))
        return cli_usage_error(usage, "%s: no speculative decoding with it (leave out --speculate / --draft-model)",
                               plain_only);
    if (plain_only) eo->speculate = HEARTH_SPEC_NONE; /* the default gives way to a flag that needs the plain path */
    if (!s->num_draft_given) s->num_draft_tokens = 3; /* mlx_lm.server's --num-draft-tokens default, as serve's */
    s->mtp = eo->speculate == HEARTH_SPEC_MTP;
    if (s->draft_name && cli_open_model(s->draft_name, &s->draft)) return 1;
    eo->draft_model = s->draft;
    return 0;
}

int cli_spec_start(cli_spec *s, hearth_engine *e, const hearth_engine_options *eo) {
    hearth_error err = {0};
    if (eo->speculate == HEARTH_SPEC_NONE) return 0;
    if (hearth_batch_create(e, &s->batch, &err)) return cli_fail(&err);
    return 0;
}

/* The batch hands on_token and on_done the request's user pointer: this, which relays
 * the tokens to the caller's and notes the end. */
typedef struct spec_user {
    hearth_token_fn on_token;
    void *user;
    int done;
    hearth_status st;
    hearth_error err;
} spec_user;

static int relay_token(void *user, int32_t id, const char *text, const hearth_logprobs *lp) {
    spec_user *u = user;
    return u->on_token ? u->on_token(u->user, id, text, lp) : 0;
}

static void relay_done(void *user, hearth_status st, const hearth_error *err) {
    spec_user *u = user;
    u->done = 1, u->st = st;
    if (err) u->err = *err;
}

hearth_status cli_spec_generate(cli_spec *s, hearth_engine *e, const int32_t *ids, size_t n, hearth_generate_params *gp,
                                hearth_token_fn on_token, void *user, hearth_generate_result *r, hearth_error *err) {
    if (!s->batch) return hearth_generate(e, ids, n, gp, on_token, user, r, err);
    gp->num_draft_tokens = s->draft || s->mtp ? s->num_draft_tokens : 0;
    spec_user u = {.on_token = on_token, .user = user};
    hearth_batch_request q = {.prompt = ids,
                              .n_prompt = n,
                              .params = gp,
                              .on_token = relay_token,
                              .on_done = relay_done,
                              .result = r,
                              .user = &u};
    memset(r, 0, sizeof *r);
    hearth_status st = hearth_batch_submit(s->batch, &q, err);
    if (st) return st;
    while (!u.done && hearth_batch_step(s->batch) > 0) {
    }
    hearth_batch_stats bs;
    hearth_batch_stats_get(s->batch, &bs);
    s->proposed = s->accepted = 0; /* the batch's totals so far */
    for (int k = 0; k < HEARTH_SPEC_KINDS; k++) s->proposed += bs.spec_proposed[k], s->accepted += bs.spec_accepted[k];
    if (u.st) *err = u.err;
    return u.st;
}

void cli_spec_report(const cli_spec *s) {
    if (!s->batch) return;
    fprintf(stderr, "speculative decoding (%s): %llu tokens proposed, %llu accepted\n",
            s->draft ? "draft"
            : s->mtp ? "mtp"
                     : "lookup",
            s->proposed, s->accepted);
}

void cli_spec_end(cli_spec *s, hearth_engine *e) {
    hearth_batch_free(s->batch);
    hearth_engine_free(e);
    hearth_model_close(s->draft); /* after the engine, which runs it */
    s->batch = NULL, s->draft = NULL;
}
