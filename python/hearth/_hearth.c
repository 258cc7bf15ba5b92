/* _hearth.c: the CPython extension behind the `hearth` package: thin types over
 * include/hearth.h (Model, Engine, Embedder) and fit. Every call into the library that
 * computes or reads files runs with the GIL released; a Python token callback takes the
 * GIL back for the duration of its call only. The Python API (hearth/__init__.py) builds
 * on these; this file holds no logic the library has. */
#define PY_SSIZE_T_CLEAN
#include "base/sbuf.h" /* bindings may use base/ (docs/design.md's layers); linked from libhearth.a */
#include "hearth.h"
#include <Python.h>
#include <stdlib.h>
#include <string.h>

static PyObject *HearthError;

/* hearth.Error(message) with .status: the status name ("not_found", "format_error", ...) */
static PyObject *raise_err(const hearth_error *err) {
    PyObject *e = PyObject_CallFunction(HearthError, "s", err->message);
    if (!e) return NULL;
    PyObject *status = PyUnicode_FromString(hearth_status_name(err->status));
    if (status) {
        PyObject_SetAttrString(e, "status", status);
        Py_DECREF(status);
    }
    PyErr_SetObject(HearthError, e);
    Py_DECREF(e);
    return NULL;
}

/* list[int] -> int32 array (caller frees) */
static int32_t *ids_from(PyObject *seq, size_t *n) {
    PyObject *fast = PySequence_Fast(seq, "token ids must be a sequence of ints");
    if (!fast) return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(len ? len : 1));
    if (!ids) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            free(ids);
            Py_DECREF(fast);
            return NULL;
        }
        if (v < 0 || v > INT32_MAX) {
            free(ids);
            Py_DECREF(fast);
            PyErr_Format(PyExc_ValueError, "token id %ld out of range", v);
            return NULL;
        }
        ids[i] = (int32_t)v;
    }
    Py_DECREF(fast);
    *n = (size_t)len;
    return ids;
}

static PyObject *ids_to_list(const int32_t *ids, size_t n) {
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) PyList_SET_ITEM(l, (Py_ssize_t)i, PyLong_FromLong(ids[i]));
    return l;
}

/* ---- Model ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD hearth_model *m;
} ModelObject;

static int model_init(ModelObject *self, PyObject *args, PyObject *kw) {
    const char *name;
    static char *kwlist[] = {"name", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s", kwlist, &name)) return -1;
    hearth_error err = {0};
    hearth_status st;
    hearth_model *m = NULL;
    Py_BEGIN_ALLOW_THREADS st = hearth_model_open(name, &m, &err);
    Py_END_ALLOW_THREADS if (st) {
        raise_err(&err);
        return -1;
    }
    hearth_model_close(self->m);
    self->m = m;
    return 0;
}

static void model_dealloc(ModelObject *self) {
    hearth_model_close(self->m);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int model_ok(ModelObject *self) {
    if (self->m) return 1;
    PyErr_SetString(PyExc_ValueError, "the model is closed");
    return 0;
}

static PyObject *model_close(ModelObject *self, PyObject *unused) {
    hearth_model_close(self->m);
    self->m = NULL;
    Py_RETURN_NONE;
}

static PyObject *model_tokenize(ModelObject *self, PyObject *args, PyObject *kw) {
    const char *text;
    Py_ssize_t len;
    int add_special = 0;
    static char *kwlist[] = {"text", "add_special", NULL};
    if (!model_ok(self) || !PyArg_ParseTupleAndKeywords(args, kw, "s#|p", kwlist, &text, &len, &add_special))
        return NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    hearth_error err = {0};
    hearth_status st;
    Py_BEGIN_ALLOW_THREADS st = hearth_tokenize(self->m, text, (size_t)len, add_special, &ids, &n, &err);
    Py_END_ALLOW_THREADS if (st) return raise_err(&err);
    PyObject *l = ids_to_list(ids, n);
    hearth_free(ids);
    return l;
}

static PyObject *model_detokenize(ModelObject *self, PyObject *args, PyObject *kw) {
    PyObject *seq;
    int skip = 0;
    static char *kwlist[] = {"ids", "skip_special", NULL};
    if (!model_ok(self) || !PyArg_ParseTupleAndKeywords(args, kw, "O|p", kwlist, &seq, &skip)) return NULL;
    size_t n;
    int32_t *ids = ids_from(seq, &n);
    if (!ids) return NULL;
    char *text = NULL;
    hearth_error err = {0};
    hearth_status st = hearth_detokenize(self->m, ids, n, skip, &text, &err);
    free(ids);
    if (st) return raise_err(&err);
    PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    hearth_free(text);
    return s;
}

/* render(messages_json, tools_json | None, add_generation_prompt, extra_json | None) */
static PyObject *model_render(ModelObject *self, PyObject *args) {
    const char *messages, *tools, *extra;
    int add_gen;
    if (!model_ok(self) || !PyArg_ParseTuple(args, "szpz", &messages, &tools, &add_gen, &extra)) return NULL;
    char *out = NULL;
    hearth_error err = {0};
    if (hearth_chat_render(self->m, messages, tools, add_gen, extra, &out, &err)) return raise_err(&err);
    PyObject *s = PyUnicode_FromString(out);
    hearth_free(out);
    return s;
}

static PyObject *model_info_json(ModelObject *self, PyObject *unused) {
    if (!model_ok(self)) return NULL;
    char *j = hearth_model_info_json(self->m);
    if (!j) return PyErr_NoMemory();
    PyObject *s = PyUnicode_FromString(j);
    hearth_free(j);
    return s;
}

static PyObject *model_get_path(ModelObject *self, void *c) {
    return model_ok(self) ? PyUnicode_FromString(hearth_model_path(self->m)) : NULL;
}
static PyObject *model_get_vocab(ModelObject *self, void *c) {
    return model_ok(self) ? PyLong_FromLong(hearth_vocab_size(self->m)) : NULL;
}
static PyObject *model_get_is_embedding(ModelObject *self, void *c) {
    return model_ok(self) ? PyBool_FromLong(hearth_model_is_embedding(self->m)) : NULL;
}
static PyObject *model_get_template(ModelObject *self, void *c) {
    if (!model_ok(self)) return NULL;
    const char *t = hearth_model_chat_template(self->m);
    if (!t) Py_RETURN_NONE;
    return PyUnicode_FromString(t);
}

static PyMethodDef model_methods[] = {
    {"close", (PyCFunction)model_close, METH_NOARGS, "Frees the model (engines made from it must be closed first)."},
    {"tokenize", (PyCFunction)(void (*)(void))model_tokenize, METH_VARARGS | METH_KEYWORDS, "text -> token ids"},
    {"detokenize", (PyCFunction)(void (*)(void))model_detokenize, METH_VARARGS | METH_KEYWORDS, "ids -> text"},
    {"render", (PyCFunction)model_render, METH_VARARGS, "renders the chat template"},
    {"info_json", (PyCFunction)model_info_json, METH_NOARGS, "the model's description as JSON"},
    {NULL}};
static PyGetSetDef model_getset[] = {{"path", (getter)model_get_path, NULL, NULL, NULL},
                                     {"vocab_size", (getter)model_get_vocab, NULL, NULL, NULL},
                                     {"is_embedding", (getter)model_get_is_embedding, NULL, NULL, NULL},
                                     {"chat_template_source", (getter)model_get_template, NULL, NULL, NULL},
                                     {NULL}};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hearth._hearth.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)model_init,
    .tp_dealloc = (destructor)model_dealloc,
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};

/* ---- engine options (shared by Engine and fit) ------------------------------------- */

static int parse_engine_options(PyObject *kw_dict, hearth_engine_options *o) {
    /* kw_dict: threads, ctx, max_sequences, kv_quant, device, deterministic, cuda_exact, kv_budget,
     * max_step_tokens */
    memset(o, 0, sizeof *o);
    o->device = HEARTH_DEVICE_CPU;
    if (!kw_dict) return 0;
    PyObject *v;
    struct {
        const char *key;
        int *dst;
    } ints[] = {{"threads", &o->n_threads},           {"ctx", &o->context_length},
                {"max_sequences", &o->max_sequences}, {"max_step_tokens", &o->max_step_tokens},
                {"deterministic", &o->deterministic}, {"kv_blocks", &o->kv_blocks},
                {"cuda_exact", &o->cuda_exact}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if ((v = PyDict_GetItemString(kw_dict, ints[i].key)) && v != Py_None) {
            long x = PyLong_AsLong(v);
            if (x == -1 && PyErr_Occurred()) return -1;
            if (x < 0 || x > INT32_MAX) {
                PyErr_Format(PyExc_ValueError, "%s must be >= 0", ints[i].key);
                return -1;
            }
            *ints[i].dst = (int)x;
        }
    if ((v = PyDict_GetItemString(kw_dict, "kv_quant")) && v != Py_None) {
        const char *s = PyUnicode_AsUTF8(v);
        if (!s) return -1;
        if (!hearth_kv_quant_parse(s, &o->kv_quant)) {
            PyErr_Format(PyExc_ValueError, "kv_quant '%s': use none, int8, fp8 or f16", s);
            return -1;
        }
    }
    if ((v = PyDict_GetItemString(kw_dict, "device")) && v != Py_None) {
        const char *s = PyUnicode_AsUTF8(v);
        if (!s) return -1;
        if (!hearth_device_parse(s, &o->device)) {
            PyErr_Format(PyExc_ValueError, "device '%s': use cpu, cuda or auto", s);
            return -1;
        }
    }
    if ((v = PyDict_GetItemString(kw_dict, "kv_budget")) && v != Py_None) {
        o->kv_budget_bytes = PyFloat_AsDouble(v);
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

/* ---- Engine ----------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD hearth_engine *e;
    PyObject *model; /* ModelObject, kept alive */
} EngineObject;

static int engine_init(EngineObject *self, PyObject *args, PyObject *kw) {
    PyObject *model;
    if (!PyArg_ParseTuple(args, "O!", &ModelType, &model)) return -1;
    if (!model_ok((ModelObject *)model)) return -1;
    hearth_engine_options o;
    if (parse_engine_options(kw, &o)) return -1;
    hearth_error err = {0};
    hearth_status st;
    hearth_engine *e = NULL;
    Py_BEGIN_ALLOW_THREADS st = hearth_engine_create(((ModelObject *)model)->m, &o, &e, &err);
    Py_END_ALLOW_THREADS if (st) {
        raise_err(&err);
        return -1;
    }
    hearth_engine_free(self->e);
    Py_XDECREF(self->model);
    self->e = e;
    Py_INCREF(model);
    self->model = model;
    return 0;
}

static void engine_dealloc(EngineObject *self) {
    hearth_engine_free(self->e);
    Py_XDECREF(self->model);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int engine_ok(EngineObject *self) {
    if (self->e) return 1;
    PyErr_SetString(PyExc_ValueError, "the engine is closed");
    return 0;
}

static PyObject *engine_close(EngineObject *self, PyObject *unused) {
    hearth_engine_free(self->e);
    self->e = NULL;
    Py_RETURN_NONE;
}

/* Sampling and limits from a dict (None or absent: the model's defaults). The stop
 * strings are copied into *stops (caller frees each and the array). */
static int parse_params(EngineObject *self, PyObject *d, hearth_generate_params *p, char ***stops) {
    memset(p, 0, sizeof *p);
    *stops = NULL;
    hearth_sampling_defaults(((ModelObject *)self->model)->m, &p->sampling);
    p->max_tokens = 256;
    if (!d) return 0;
    PyObject *v;
    struct {
        const char *key;
        float *dst;
    } fl[] = {{"temperature", &p->sampling.temperature},
              {"top_p", &p->sampling.top_p},
              {"min_p", &p->sampling.min_p},
              {"repetition_penalty", &p->sampling.repetition_penalty},
              {"presence_penalty", &p->sampling.presence_penalty},
              {"frequency_penalty", &p->sampling.frequency_penalty}};
    for (size_t i = 0; i < sizeof fl / sizeof *fl; i++)
        if ((v = PyDict_GetItemString(d, fl[i].key)) && v != Py_None) {
            double x = PyFloat_AsDouble(v);
            if (x == -1 && PyErr_Occurred()) return -1;
            *fl[i].dst = (float)x;
        }
    struct {
        const char *key;
        int *dst;
    } in[] = {{"top_k", &p->sampling.top_k}, {"max_tokens", &p->max_tokens}, {"ignore_eos", &p->ignore_eos}};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++)
        if ((v = PyDict_GetItemString(d, in[i].key)) && v != Py_None) {
            long x = PyLong_AsLong(v);
            if (x == -1 && PyErr_Occurred()) return -1;
            *in[i].dst = (int)x;
        }
    if ((v = PyDict_GetItemString(d, "seed")) && v != Py_None) {
        unsigned long long s = PyLong_AsUnsignedLongLong(v);
        if (PyErr_Occurred()) return -1;
        p->sampling.has_seed = 1;
        p->sampling.seed = s;
    }
    if ((v = PyDict_GetItemString(d, "stop")) && v != Py_None) {
        PyObject *fast = PySequence_Fast(v, "stop must be a list of strings");
        if (!fast) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
        *stops = calloc((size_t)n + 1, sizeof(char *));
        for (Py_ssize_t i = 0; *stops && i < n; i++) {
            const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
            if (!s) {
                Py_DECREF(fast);
                return -1;
            }
            (*stops)[i] = strdup(s);
        }
        Py_DECREF(fast);
        if (!*stops) {
            PyErr_NoMemory();
            return -1;
        }
        p->stop = (const char *const *)*stops;
        p->n_stop = (size_t)n;
    }
    if (p->max_tokens < 1) {
        PyErr_SetString(PyExc_ValueError, "max_tokens must be at least 1");
        return -1;
    }
    return 0;
}

static void free_stops(char **stops) {
    for (size_t i = 0; stops && stops[i]; i++) free(stops[i]);
    free(stops);
}

typedef struct gen_ctx {
    PyObject *on_token; /* callable(text) -> truthy to stop; NULL: collect only */
    sbuf text;          /* everything emitted (zeroed: empty) */
    int failed;         /* the callback raised */
} gen_ctx;

/* Runs with the GIL released; takes it for the Python callback only. */
static int gen_on_token(void *user, int32_t id, const char *text, const hearth_logprobs *lp) {
    gen_ctx *g = user;
    sbuf_puts(&g->text, text);
    if (g->text.oom) return 1;
    if (!g->on_token || !text[0]) return 0;
    PyGILState_STATE gs = PyGILState_Ensure();
    int stop = 0;
    PyObject *piece = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    PyObject *r = piece ? PyObject_CallOneArg(g->on_token, piece) : NULL;
    Py_XDECREF(piece);
    if (!r) {
        g->failed = stop = 1; /* the exception stays set; raised when generate returns */
    } else {
        stop = PyObject_IsTrue(r) == 1;
        Py_DECREF(r);
    }
    PyGILState_Release(gs);
    return stop;
}

static PyObject *result_tuple(gen_ctx *g, const hearth_generate_result *r) {
    PyObject *text = PyUnicode_DecodeUTF8(g->text.data ? g->text.data : "", (Py_ssize_t)g->text.len, "replace");
    if (!text) return NULL;
    return Py_BuildValue("(N{s:s,s:n,s:n,s:n,s:d,s:d,s:d})", text, "finish_reason", hearth_finish_name(r->finish),
                         "prompt_tokens", (Py_ssize_t)r->prompt_tokens, "completion_tokens",
                         (Py_ssize_t)r->completion_tokens, "cached_tokens", (Py_ssize_t)r->cached_tokens,
                         "prompt_seconds", r->prompt_seconds, "generate_seconds", r->generate_seconds,
                         "first_token_seconds", r->first_token_seconds);
}

/* generate(ids, params: dict, on_token=None, cache_file=None) -> (text, info).
 * cache_file: hearth generate --prompt-cache-file's behaviour (load the matching prefix
 * when the file exists, save the sequence afterwards). */
static PyObject *engine_generate(EngineObject *self, PyObject *args) {
    PyObject *seq, *params, *cb = Py_None;
    const char *cache_file = NULL;
    if (!engine_ok(self) || !PyArg_ParseTuple(args, "OO!|Oz", &seq, &PyDict_Type, &params, &cb, &cache_file))
        return NULL;
    size_t n;
    int32_t *ids = ids_from(seq, &n);
    if (!ids) return NULL;
    hearth_generate_params p;
    char **stops;
    if (parse_params(self, params, &p, &stops)) {
        free(ids);
        free_stops(stops);
        return NULL;
    }
    gen_ctx g = {.on_token = cb == Py_None ? NULL : cb};
    hearth_generate_result r = {0};
    hearth_error err = {0};
    hearth_status st = HEARTH_OK;
    Py_BEGIN_ALLOW_THREADS if (!cache_file) st = hearth_generate(self->e, ids, n, &p, gen_on_token, &g, &r, &err);
    else {
        int s;
        size_t loaded = 0;
        FILE *f = fopen(cache_file, "rb");
        st = hearth_seq_open(self->e, &s, &err);
        if (!st && f) st = hearth_seq_load(self->e, s, cache_file, ids, n, &loaded, &err);
        if (!st) st = hearth_generate_seq(self->e, s, ids, n, &p, gen_on_token, &g, &r, &err);
        if (!st && !g.failed) st = hearth_seq_save(self->e, s, cache_file, &err);
        if (f) fclose(f);
        hearth_seq_close(self->e, s);
    }
    Py_END_ALLOW_THREADS free(ids);
    free_stops(stops);
    PyObject *out = NULL;
    if (g.failed)
        out = NULL; /* the callback's exception */
    else if (st)
        raise_err(&err);
    else
        out = result_tuple(&g, &r);
    sbuf_free(&g.text);
    return out;
}

/* save_session(path, ids): prefills ids into a fresh sequence and saves its KV. */
static PyObject *engine_save_session(EngineObject *self, PyObject *args) {
    const char *path;
    PyObject *seq;
    if (!engine_ok(self) || !PyArg_ParseTuple(args, "sO", &path, &seq)) return NULL;
    size_t n;
    int32_t *ids = ids_from(seq, &n);
    if (!ids) return NULL;
    hearth_error err = {0};
    hearth_status st;
    Py_BEGIN_ALLOW_THREADS int s;
    st = hearth_seq_open(self->e, &s, &err);
    if (!st) {
        st = n ? hearth_seq_append(self->e, s, ids, n, 0, NULL, &err) : HEARTH_OK;
        if (!st) st = hearth_seq_save(self->e, s, path, &err);
        hearth_seq_close(self->e, s);
    }
    Py_END_ALLOW_THREADS free(ids);
    if (st) return raise_err(&err);
    Py_RETURN_NONE;
}

/* check_session(path) -> tokens in the file: loads it whole into a scratch sequence
 * (every check of hearth_seq_load), then lets it go. */
static PyObject *engine_check_session(EngineObject *self, PyObject *args) {
    const char *path;
    if (!engine_ok(self) || !PyArg_ParseTuple(args, "s", &path)) return NULL;
    hearth_error err = {0};
    hearth_status st;
    size_t n = 0;
    Py_BEGIN_ALLOW_THREADS int s;
    st = hearth_seq_open(self->e, &s, &err);
    if (!st) {
        st = hearth_seq_load(self->e, s, path, NULL, 0, &n, &err);
        hearth_seq_close(self->e, s);
    }
    Py_END_ALLOW_THREADS if (st) return raise_err(&err);
    return PyLong_FromSize_t(n);
}

typedef struct batch_item {
    gen_ctx g;
    hearth_generate_result r;
    hearth_generate_params p;
    char **stops;
    int32_t *ids;
    size_t n;
    int done;
    hearth_status st;
    hearth_error err;
} batch_item;

static void batch_done(void *user, hearth_status st, const hearth_error *err) {
    batch_item *it = user;
    it->done = 1;
    it->st = st;
    if (err) it->err = *err;
}

/* batch(list of ids, params) -> list of (text, info): continuous batching on this engine. */
static PyObject *engine_batch(EngineObject *self, PyObject *args) {
    PyObject *prompts, *params;
    if (!engine_ok(self) || !PyArg_ParseTuple(args, "OO!", &prompts, &PyDict_Type, &params)) return NULL;
    PyObject *fast = PySequence_Fast(prompts, "prompts must be a list");
    if (!fast) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    batch_item *items = calloc((size_t)(k ? k : 1), sizeof *items);
    PyObject *out = NULL;
    if (!items) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!(items[i].ids = ids_from(PySequence_Fast_GET_ITEM(fast, i), &items[i].n))) goto done;
        if (parse_params(self, params, &items[i].p, &items[i].stops)) goto done;
    }
    hearth_batch *b = NULL;
    hearth_error err = {0};
    hearth_status st;
    Py_BEGIN_ALLOW_THREADS st = hearth_batch_create(self->e, &b, &err);
    for (Py_ssize_t i = 0; !st && i < k; i++) {
        hearth_batch_request rq = {.prompt = items[i].ids,
                                   .n_prompt = items[i].n,
                                   .params = &items[i].p,
                                   .on_token = gen_on_token,
                                   .on_done = batch_done,
                                   .result = &items[i].r,
                                   .user = &items[i]};
        /* gen_on_token reaches user as gen_ctx: the item begins with it */
        if ((st = hearth_batch_submit(b, &rq, &err))) break;
    }
    while (!st && hearth_batch_step(b) > 0) {
    }
    hearth_batch_free(b);
    Py_END_ALLOW_THREADS if (st) {
        raise_err(&err);
        goto done;
    }
    out = PyList_New(k);
    for (Py_ssize_t i = 0; out && i < k; i++) {
        PyObject *t = items[i].st ? raise_err(&items[i].err) : result_tuple(&items[i].g, &items[i].r);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
done:
    for (Py_ssize_t i = 0; i < k; i++) {
        free(items[i].ids);
        free_stops(items[i].stops);
        sbuf_free(&items[i].g.text);
    }
    free(items);
    Py_DECREF(fast);
    return out;
}

static PyObject *engine_get_ctx(EngineObject *self, void *c) {
    return engine_ok(self) ? PyLong_FromLong(hearth_engine_context_length(self->e)) : NULL;
}
static PyObject *engine_get_bytes(EngineObject *self, void *c) {
    return engine_ok(self) ? PyLong_FromSize_t(hearth_engine_bytes(self->e)) : NULL;
}

static PyMethodDef engine_methods[] = {
    {"close", (PyCFunction)engine_close, METH_NOARGS, "Frees the engine."},
    {"generate", (PyCFunction)engine_generate, METH_VARARGS, "generate(ids, params, on_token, cache_file)"},
    {"batch", (PyCFunction)engine_batch, METH_VARARGS, "batch(list of ids, params)"},
    {"save_session", (PyCFunction)engine_save_session, METH_VARARGS, "save_session(path, ids)"},
    {"check_session", (PyCFunction)engine_check_session, METH_VARARGS, "check_session(path) -> tokens"},
    {NULL}};
static PyGetSetDef engine_getset[] = {{"context_length", (getter)engine_get_ctx, NULL, NULL, NULL},
                                      {"bytes", (getter)engine_get_bytes, NULL, NULL, NULL},
                                      {NULL}};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hearth._hearth.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
};

/* ---- Embedder --------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD hearth_embedder *e;
    PyObject *model;
} EmbedderObject;

static int embedder_init(EmbedderObject *self, PyObject *args, PyObject *kw) {
    PyObject *model;
    int threads = 0;
    static char *kwlist[] = {"model", "threads", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|i", kwlist, &ModelType, &model, &threads)) return -1;
    if (!model_ok((ModelObject *)model)) return -1;
    hearth_embedder_options o = {.n_threads = threads};
    hearth_error err = {0};
    hearth_status st;
    hearth_embedder *e = NULL;
    Py_BEGIN_ALLOW_THREADS st = hearth_embedder_create(((ModelObject *)model)->m, &o, &e, &err);
    Py_END_ALLOW_THREADS if (st) {
        raise_err(&err);
        return -1;
    }
    hearth_embedder_free(self->e);
    Py_XDECREF(self->model);
    self->e = e;
    Py_INCREF(model);
    self->model = model;
    return 0;
}

static void embedder_dealloc(EmbedderObject *self) {
    hearth_embedder_free(self->e);
    Py_XDECREF(self->model);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* embed(texts, truncate=False) -> list of lists of floats */
static PyObject *embedder_embed(EmbedderObject *self, PyObject *args) {
    PyObject *texts;
    int truncate = 0;
    if (!self->e) {
        PyErr_SetString(PyExc_ValueError, "the embedder is closed");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O|p", &texts, &truncate)) return NULL;
    PyObject *fast = PySequence_Fast(texts, "texts must be a list of strings");
    if (!fast) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    int32_t **ids = calloc((size_t)(k ? k : 1), sizeof *ids);
    size_t *lens = calloc((size_t)(k ? k : 1), sizeof *lens);
    int dim = hearth_embedder_dim(self->e);
    float *vec = malloc(sizeof(float) * (size_t)dim * (size_t)(k ? k : 1));
    PyObject *out = NULL;
    hearth_error err = {0};
    if (!ids || !lens || !vec) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(fast, i), &len);
        if (!s) goto done;
        if (hearth_embed_tokenize(self->e, s, (size_t)len, truncate, &ids[i], &lens[i], &err)) {
            raise_err(&err);
            goto done;
        }
    }
    hearth_status st;
    Py_BEGIN_ALLOW_THREADS st = hearth_embed(self->e, (const int32_t *const *)ids, lens, (size_t)k, vec, &err);
    Py_END_ALLOW_THREADS if (st) {
        raise_err(&err);
        goto done;
    }
    out = PyList_New(k);
    for (Py_ssize_t i = 0; out && i < k; i++) {
        PyObject *row = PyList_New(dim);
        if (!row) {
            Py_CLEAR(out);
            break;
        }
        for (int j = 0; j < dim; j++) PyList_SET_ITEM(row, j, PyFloat_FromDouble(vec[(size_t)i * dim + j]));
        PyList_SET_ITEM(out, i, row);
    }
done:
    for (Py_ssize_t i = 0; ids && i < k; i++) hearth_free(ids[i]);
    free(ids);
    free(lens);
    free(vec);
    Py_DECREF(fast);
    return out;
}

static PyObject *embedder_get_dim(EmbedderObject *self, void *c) {
    if (!self->e) {
        PyErr_SetString(PyExc_ValueError, "the embedder is closed");
        return NULL;
    }
    return PyLong_FromLong(hearth_embedder_dim(self->e));
}
static PyObject *embedder_close(EmbedderObject *self, PyObject *unused) {
    hearth_embedder_free(self->e);
    self->e = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef embedder_methods[] = {
    {"embed", (PyCFunction)embedder_embed, METH_VARARGS, "embed(texts, truncate=False)"},
    {"close", (PyCFunction)embedder_close, METH_NOARGS, "Frees the embedder."},
    {NULL}};
static PyGetSetDef embedder_getset[] = {{"dim", (getter)embedder_get_dim, NULL, NULL, NULL}, {NULL}};

static PyTypeObject EmbedderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hearth._hearth.Embedder",
    .tp_basicsize = sizeof(EmbedderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)embedder_init,
    .tp_dealloc = (destructor)embedder_dealloc,
    .tp_methods = embedder_methods,
    .tp_getset = embedder_getset,
};

/* ---- fit -------------------------------------------------------------------------- */

/* fit(model, **engine options) -> JSON text of hearth_fit's report */
static PyObject *py_fit(PyObject *mod, PyObject *args, PyObject *kw) {
    PyObject *model;
    if (!PyArg_ParseTuple(args, "O!", &ModelType, &model)) return NULL;
    if (!model_ok((ModelObject *)model)) return NULL;
    hearth_fit_options fo = {0};
    if (parse_engine_options(kw, &fo.engine)) return NULL;
    char *json = NULL;
    hearth_error err = {0};
    hearth_status st;
    Py_BEGIN_ALLOW_THREADS st = hearth_fit(((ModelObject *)model)->m, &fo, &json, &err);
    Py_END_ALLOW_THREADS if (st) return raise_err(&err);
    PyObject *s = PyUnicode_FromString(json);
    hearth_free(json);
    return s;
}

static PyMethodDef module_methods[] = {
    {"fit", (PyCFunction)(void (*)(void))py_fit, METH_VARARGS | METH_KEYWORDS, "fit(model, **options) -> JSON"},
    {NULL}};

static struct PyModuleDef hearth_module = {PyModuleDef_HEAD_INIT, "hearth._hearth",
                                           "CPython bindings over libhearth (include/hearth.h)", -1, module_methods};

PyMODINIT_FUNC PyInit__hearth(void) {
    if (PyType_Ready(&ModelType) || PyType_Ready(&EngineType) || PyType_Ready(&EmbedderType)) return NULL;
    PyObject *m = PyModule_Create(&hearth_module);
    if (!m) return NULL;
    HearthError = PyErr_NewException("hearth.Error", PyExc_RuntimeError, NULL);
    Py_INCREF(&ModelType);
    Py_INCREF(&EngineType);
    Py_INCREF(&EmbedderType);
    PyModule_AddObject(m, "Model", (PyObject *)&ModelType);
    PyModule_AddObject(m, "Engine", (PyObject *)&EngineType);
    PyModule_AddObject(m, "Embedder", (PyObject *)&EmbedderType);
    PyModule_AddObject(m, "Error", HearthError);
    PyModule_AddStringConstant(m, "VERSION", HEARTH_VERSION);
    PyModule_AddIntConstant(m, "API_VERSION", HEARTH_API_VERSION);
    return m;
}
