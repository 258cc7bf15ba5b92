/* model.c: opening and closing models (public API): resolves the name, reads config and
 * tensor catalog, loads tokenizer and chat templates. Loads no weights for compute. */
#define _GNU_SOURCE
#include "api/model_internal.h"
#include "base/err.h"
#include "base/file.h"
#include "base/sbuf.h"
#include "io/json_text.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hearth_free(void *p) { free(p); }

static json_t *load_json_file(const char *dir, const char *name, hearth_status *st, hearth_error *err) {
    char *path = path_join(dir, name);
    json_t *j = NULL;
    *st = HEARTH_OK;
    char *text = NULL;
    size_t len = 0;
    if (path && file_exists(path) && (*st = file_read_all(path, &text, &len, err)) == HEARTH_OK) {
        json_error_t je;
        j = json_loadb_big_ints(text, len, JSON_DECODE_ANY, &je);
        if (!j) *st = err_set(err, HEARTH_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
        else if (!json_is_object(j)) {
            json_decref(j);
            j = NULL;
            *st = err_set(err, HEARTH_ERR_FORMAT, "%s: expected a JSON object", path);
        }
    }
    free(text);
    free(path);
    return j;
}

/* Special tokens in tokenizer_config.json are strings or {"content": "..."} objects. */
static char *token_string(const json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

/* chat_template may be a string or a list of {name, template}. */
static void take_template_value(hearth_model *m, const json_t *v, const char *source) {
    if (json_is_string(v)) {
        m->chat_template = strdup(json_string_value(v));
    } else if (json_is_array(v)) {
        size_t i;
        const json_t *item;
        json_array_foreach(v, i, item) {
            const char *name = json_string_value(json_object_get(item, "name"));
            const char *tpl = json_string_value(json_object_get(item, "template"));
            if (!name || !tpl) continue;
            if (!strcmp(name, "default") && !m->chat_template) m->chat_template = strdup(tpl);
            if (!strcmp(name, "tool_use") && !m->chat_template_tool_use) m->chat_template_tool_use = strdup(tpl);
        }
    }
    if (m->chat_template || m->chat_template_tool_use) m->chat_template_source = source;
}

/* Same precedence as transformers: chat_template.jinja, chat_template.json, then
 * tokenizer_config.json. */
static void load_dir_templates(hearth_model *m, const char *dir) {
    char *path = path_join(dir, "chat_template.jinja"), *text = NULL;
    if (path && file_exists(path) && file_read_all(path, &text, NULL, NULL) == HEARTH_OK) {
        m->chat_template = text;
        m->chat_template_source = "chat_template.jinja";
    }
    free(path);
    if (!m->chat_template) {
        hearth_status st;
        json_t *j = load_json_file(dir, "chat_template.json", &st, NULL);
        if (j) take_template_value(m, json_object_get(j, "chat_template"), "chat_template.json");
        json_decref(j);
    }
    if (!m->chat_template && m->tokenizer_config)
        take_template_value(m, json_object_get(m->tokenizer_config, "chat_template"), "tokenizer_config.json");
    if (m->tokenizer_config) {
        m->bos_token = token_string(json_object_get(m->tokenizer_config, "bos_token"));
        m->eos_token = token_string(json_object_get(m->tokenizer_config, "eos_token"));
    }
}

static void load_gguf_templates(hearth_model *m) {
    m->chat_template = gguf_get_str(&m->gguf, "tokenizer.chat_template");
    m->chat_template_tool_use = gguf_get_str(&m->gguf, "tokenizer.chat_template.tool_use");
    if (m->chat_template || m->chat_template_tool_use) m->chat_template_source = "gguf:tokenizer.chat_template";
}

static void fill_special_from_tokenizer(hearth_model *m) {
    if (!m->tok) return;
    int32_t b = tok_bos_id(m->tok), e = tok_eos_id(m->tok);
    if (!m->bos_token && b >= 0 && tok_token_str(m->tok, b)) m->bos_token = strdup(tok_token_str(m->tok, b));
    if (!m->eos_token && e >= 0 && tok_token_str(m->tok, e)) m->eos_token = strdup(tok_token_str(m->tok, e));
}

static hearth_status open_dir(hearth_model *m, hearth_error *err) {
    const char *dir = m->entry.path;
    hearth_status st;
    char *cfg_path = path_join(dir, "config.json");
    m->config = load_json_file(dir, "config.json", &st, err);
    free(cfg_path);
    if (st) return st;
    if (!m->config) return err_set(err, HEARTH_ERR_FORMAT, "%s: no config.json", dir);
    m->generation_config = load_json_file(dir, "generation_config.json", &st, err);
    if (st) return st;
    m->tokenizer_config = load_json_file(dir, "tokenizer_config.json", &st, err);
    if (st) return st;
    if ((st = mlxq_config_parse(m->config, "config.json", &m->quant, err))) {
        err_prefix(err, "%s", dir);
        return st;
    }
    if ((st = st_set_open(dir, &m->st, err))) return st;
    hearth_error terr = {0};
    if (tok_load_hf_dir(dir, &m->tok, &terr)) snprintf(m->tok_error, sizeof m->tok_error, "%s", terr.message);
    load_dir_templates(m, dir);
    return HEARTH_OK;
}

static hearth_status open_gguf(hearth_model *m, hearth_error *err) {
    hearth_status st = gguf_open(m->entry.path, &m->gguf, err);
    if (st) return st;
    hearth_error terr = {0};
    if (tok_load_gguf(&m->gguf, &m->tok, &terr)) snprintf(m->tok_error, sizeof m->tok_error, "%s", terr.message);
    load_gguf_templates(m);
    return HEARTH_OK;
}

hearth_status hearth_model_open(const char *name_or_path, hearth_model **out, hearth_error *err) {
    *out = NULL;
    hearth_model *m = calloc(1, sizeof *m);
    if (!m) return err_set(err, HEARTH_ERR_NOMEM, "out of memory");
    hearth_status st = resolve_model(name_or_path, &m->entry, err);
    if (!st) st = m->entry.format == MODEL_FORMAT_GGUF ? open_gguf(m, err) : open_dir(m, err);
    if (!st) {
        fill_special_from_tokenizer(m);
        st = model_summarize(m, err);
    }
    if (st) {
        hearth_model_close(m);
        return st;
    }
    *out = m;
    return HEARTH_OK;
}

void hearth_model_close(hearth_model *m) {
    if (!m) return;
    json_decref(m->config);
    json_decref(m->generation_config);
    json_decref(m->tokenizer_config);
    if (m->entry.format == MODEL_FORMAT_GGUF) gguf_close(&m->gguf);
    else st_set_close(&m->st);
    mlxq_config_free(&m->quant);
    tok_free(m->tok);
    free(m->chat_template);
    free(m->chat_template_tool_use);
    free(m->bos_token);
    free(m->eos_token);
    resolve_entry_free(&m->entry);
    free(m);
}

const char *hearth_model_path(const hearth_model *m) { return m->entry.path; }
