/* eval.c: evaluates the template AST — scopes, expressions with Python semantics,
 * statements (if/for/set/macro/call/filter blocks, loop controls) — and owns
 * tpl_render, the entry point. Filters, tests and methods live in their own files;
 * this file must not grow a second copy of them. */
#include "tok/template/tpl_int.h"
#include "tok/template.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scopes ---- */
static tpl_frame *frame_new(tpl_state *st, tpl_frame *parent) {
    tpl_frame *f = tpl_alloc(st, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static void frame_set(tpl_state *st, tpl_frame *f, const char *name, tpl_val v) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) { f->vals[i] = v; return; }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nn = tpl_alloc(st, cap * sizeof *nn);
        tpl_val *nv = tpl_alloc(st, cap * sizeof *nv);
        if (f->n) { memcpy(nn, f->names, f->n * sizeof *nn); memcpy(nv, f->vals, f->n * sizeof *nv); }
        f->names = nn;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static tpl_val *frame_find(tpl_frame *f, const char *name) {
    for (; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (!strcmp(f->names[i], name)) return &f->vals[i];
    return NULL;
}

void tpl_step(tpl_state *st, int line) {
    if (++st->steps > TPL_MAX_STEPS) tpl_fail(st, line, "template ran more than %llu loop iterations and calls", (unsigned long long)TPL_MAX_STEPS);
}

static void out_write(tpl_state *st, int line, const char *s, size_t n) {
    sbuf_append(st->out, s, n);
    if (st->out->oom) tpl_fail(st, line, "out of memory");
    if (st->out->len > TPL_MAX_OUTPUT) tpl_fail(st, line, "output longer than %zu MiB", TPL_MAX_OUTPUT >> 20);
}

__attribute__((noreturn)) static void fail_undefined(tpl_state *st, int line, tpl_val v) {
    tpl_fail(st, line, "%s", v.u.s ? v.u.s : "undefined value");
}

static const char *undef_attr(tpl_state *st, tpl_val obj, const char *name, size_t n) {
    size_t len = strlen(tv_type_name(obj)) + n + 40;
    char *m = tpl_alloc(st, len);
    snprintf(m, len, "'%s object' has no attribute '%.*s'", tv_type_name(obj), (int)n, name);
    return m;
}

static tpl_val make_method(tpl_state *st, tpl_val self, const char *name) {
    tpl_method *m = tpl_alloc(st, sizeof *m);
    m->self = self;
    m->name = name;
    return (tpl_val){.kind = TV_METHOD, .u.meth = m};
}

static tpl_val loop_attr(tpl_state *st, tpl_loop *lp, const char *name) {
    size_t len = lp->items->n, i = lp->index0;
    if (!strcmp(name, "index")) return tv_int((int64_t)i + 1);
    if (!strcmp(name, "index0")) return tv_int((int64_t)i);
    if (!strcmp(name, "revindex")) return tv_int((int64_t)(len - i));
    if (!strcmp(name, "revindex0")) return tv_int((int64_t)(len - i - 1));
    if (!strcmp(name, "first")) return tv_bool(i == 0);
    if (!strcmp(name, "last")) return tv_bool(i + 1 == len);
    if (!strcmp(name, "length")) return tv_int((int64_t)len);
    if (!strcmp(name, "depth")) return tv_int(1);
    if (!strcmp(name, "depth0")) return tv_int(0);
    if (!strcmp(name, "previtem")) return i > 0 ? lp->items->items[i - 1] : tv_undef("there is no previous item");
    if (!strcmp(name, "nextitem")) return i + 1 < len ? lp->items->items[i + 1] : tv_undef("there is no next item");
    (void)st;
    return tv_undef(NULL);
}

/* obj.name: jinja2 tries the Python attribute first, then the item. */
tpl_val tpl_getattr(tpl_state *st, int line, tpl_val obj, const char *name, size_t n) {
    if (obj.kind == TV_UNDEF) fail_undefined(st, line, obj);
    const char *nm = name[n] == 0 ? name : tpl_strdup(st, name, n);
    switch (obj.kind) {
    case TV_DICT:
    case TV_NS: {
        if (obj.kind == TV_DICT && tpl_method_exists(obj, nm)) return make_method(st, obj, nm);
        tpl_val *v = tv_dict_find_str(obj.u.d, name, n);
        if (v) return *v;
        break;
    }
    case TV_STR:
    case TV_LIST:
        if (tpl_method_exists(obj, nm)) return make_method(st, obj, nm);
        break;
    case TV_LOOP: {
        if (!strcmp(nm, "cycle")) return make_method(st, obj, nm);
        tpl_val v = loop_attr(st, obj.u.loop, nm);
        if (v.kind != TV_UNDEF || v.u.s) return v;
        break;
    }
    default: break;
    }
    return tv_undef(undef_attr(st, obj, name, n));
}

/* Python slice bounds (PySlice_AdjustIndices) */
static int64_t slice_len(int64_t len, int64_t *start, int64_t *stop, int64_t step, int has_start, int has_stop) {
    if (!has_start) *start = step < 0 ? len - 1 : 0;
    else {
        if (*start < 0) { *start += len; if (*start < 0) *start = step < 0 ? -1 : 0; }
        else if (*start >= len) *start = step < 0 ? len - 1 : len;
    }
    if (!has_stop) *stop = step < 0 ? -1 : len;
    else {
        if (*stop < 0) { *stop += len; if (*stop < 0) *stop = step < 0 ? -1 : 0; }
        else if (*stop >= len) *stop = step < 0 ? len - 1 : len;
    }
    if (step < 0) return *stop < *start ? (*start - *stop - 1) / (-step) + 1 : 0;
    return *start < *stop ? (*stop - *start - 1) / step + 1 : 0;
}

static int slice_int(tpl_state *st, int line, tpl_val v, int64_t *out) {
    if (v.kind == TV_NONE || v.kind == TV_UNDEF) return 0;
    if (v.kind == TV_INT) { *out = v.u.i; return 1; }
    if (v.kind == TV_BOOL) { *out = v.u.b; return 1; }
    tpl_fail(st, line, "slice indices must be integers or None");
}

static tpl_val do_slice(tpl_state *st, int line, tpl_val obj, tpl_val a, tpl_val b, tpl_val c) {
    int64_t start = 0, stop = 0, step = 1;
    int hs = slice_int(st, line, a, &start), he = slice_int(st, line, b, &stop);
    slice_int(st, line, c, &step);
    if (step == 0) tpl_fail(st, line, "slice step cannot be zero");
    if (step < -INT64_MAX) step = -INT64_MAX;
    if (obj.kind == TV_LIST) {
        int64_t n = slice_len((int64_t)obj.u.l->n, &start, &stop, step, hs, he);
        tpl_val r = tv_list(st, (size_t)n);
        r.u.l->is_tuple = obj.u.l->is_tuple;
        for (int64_t k = 0, i = start; k < n; k++, i += step) tv_list_push(st, r.u.l, obj.u.l->items[i]);
        return r;
    }
    if (obj.kind == TV_STR) {
        tpl_list *cps = tv_iter(st, line, obj);
        int64_t n = slice_len((int64_t)cps->n, &start, &stop, step, hs, he);
        if (step == 1) {
            if (n <= 0) return tv_cstr("");
            const char *s0 = cps->items[start].u.s;
            const char *s1 = cps->items[start + n - 1].u.s + cps->items[start + n - 1].n;
            return (tpl_val){.kind = TV_STR, .n = (size_t)(s1 - s0), .u.s = s0};
        }
        sbuf *t = tpl_tmp_begin(st);
        for (int64_t k = 0, i = start; k < n; k++, i += step) sbuf_append(t, cps->items[i].u.s, cps->items[i].n);
        return tpl_tmp_finish(st, t);
    }
    if (obj.kind == TV_UNDEF) fail_undefined(st, line, obj);
    tpl_fail(st, line, "'%s' object is not subscriptable", tv_type_name(obj));
}

tpl_val tpl_getitem(tpl_state *st, int line, tpl_val obj, tpl_val key) {
    if (obj.kind == TV_UNDEF) fail_undefined(st, line, obj);
    if (obj.kind == TV_DICT || obj.kind == TV_NS) {
        if (obj.kind == TV_DICT) {
            tpl_val *v = tv_dict_find(obj.u.d, key);
            if (v) return *v;
        }
        if (key.kind == TV_STR) return tpl_getattr(st, line, obj, key.u.s, key.n);
        return tv_undef("key not found");
    }
    if ((obj.kind == TV_LIST || obj.kind == TV_STR) && (key.kind == TV_INT || key.kind == TV_BOOL)) {
        int64_t i = key.kind == TV_INT ? key.u.i : key.u.b;
        if (obj.kind == TV_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            if (i < 0 || i >= n) return tv_undef("list index out of range");
            return obj.u.l->items[i];
        }
        tpl_list *cps = tv_iter(st, line, obj);
        int64_t n = (int64_t)cps->n;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return tv_undef("string index out of range");
        return cps->items[i];
    }
    if (key.kind == TV_STR) return tpl_getattr(st, line, obj, key.u.s, key.n);
    return tv_undef("no such item");
}

/* ---- arithmetic ---- */
static int is_num(tpl_val v) { return v.kind == TV_BOOL || v.kind == TV_INT || v.kind == TV_FLOAT; }
static double as_f(tpl_val v) { return v.kind == TV_FLOAT ? v.u.f : v.kind == TV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t as_i(tpl_val v) { return v.kind == TV_INT ? v.u.i : v.u.b; }

static const char *op_sym(int op) {
    static const char *const s[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return op >= OP_ADD && op <= OP_POW ? s[op] : "?";
}

static tpl_val seq_repeat(tpl_state *st, int line, tpl_val seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.kind == TV_STR) {
        if (seq.n && (uint64_t)times > TPL_MAX_OUTPUT / seq.n) tpl_fail(st, line, "string repetition too large");
        sbuf *t = tpl_tmp_begin(st);
        for (int64_t i = 0; i < times; i++) sbuf_append(t, seq.u.s, seq.n);
        return tpl_tmp_finish(st, t);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)times > (TPL_MAX_ARENA / sizeof(tpl_val)) / n) tpl_fail(st, line, "list repetition too large");
    tpl_val r = tv_list(st, n * (size_t)times);
    r.u.l->is_tuple = seq.u.l->is_tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < n; k++) tv_list_push(st, r.u.l, seq.u.l->items[k]);
    return r;
}

tpl_val tpl_binop(tpl_state *st, int line, int op, tpl_val a, tpl_val b) {
    /* str % Undefined is legal Python: Undefined looks like a mapping */
    if (op == OP_MOD && a.kind == TV_STR) return tpl_str_percent(st, line, a, b);
    if (a.kind == TV_UNDEF) fail_undefined(st, line, a);
    if (b.kind == TV_UNDEF) fail_undefined(st, line, b);
    if (is_num(a) && is_num(b)) {
        int fl = a.kind == TV_FLOAT || b.kind == TV_FLOAT;
        if (!fl) {
            int64_t x = as_i(a), y = as_i(b), r;
            switch (op) {
            case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; return tv_int(r);
            case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; return tv_int(r);
            case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; return tv_int(r);
            case OP_DIV: if (!y) tpl_fail(st, line, "division by zero"); return tv_float((double)x / (double)y);
            case OP_FLOORDIV:
            case OP_MOD: {
                if (!y) tpl_fail(st, line, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto overflow;
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                return tv_int(op == OP_MOD ? m : q);
            }
            case OP_POW: {
                if (y < 0) {
                    if (x == 0) tpl_fail(st, line, "0.0 cannot be raised to a negative power");
                    return tv_float(pow((double)x, (double)y));
                }
                int64_t res = 1, base = x;
                while (y) {
                    if (y & 1) { if (__builtin_mul_overflow(res, base, &res)) goto overflow; }
                    y >>= 1;
                    if (y && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                return tv_int(res);
            }
            }
        }
        double x = as_f(a), y = as_f(b);
        switch (op) {
        case OP_ADD: return tv_float(x + y);
        case OP_SUB: return tv_float(x - y);
        case OP_MUL: return tv_float(x * y);
        case OP_DIV: if (y == 0) tpl_fail(st, line, "float division by zero"); return tv_float(x / y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0) tpl_fail(st, line, "float modulo by zero");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            else if (m == 0) m = copysign(0.0, y);
            if (op == OP_MOD) return tv_float(m);
            double q = (x - m) / y;
            double fq = floor(q);
            if (q - fq > 0.5) fq += 1;
            return tv_float(fq == 0 ? copysign(0.0, x / y) : fq);
        }
        case OP_POW:
            if (x == 0 && y < 0) tpl_fail(st, line, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) tpl_fail(st, line, "unsupported: complex result of **");
            return tv_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.kind == TV_STR && b.kind == TV_STR) {
        sbuf *t = tpl_tmp_begin(st);
        sbuf_append(t, a.u.s, a.n);
        sbuf_append(t, b.u.s, b.n);
        return tpl_tmp_finish(st, t);
    }
    if (op == OP_ADD && a.kind == TV_LIST && b.kind == TV_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
        tpl_val r = tv_list(st, a.u.l->n + b.u.l->n);
        r.u.l->is_tuple = a.u.l->is_tuple;
        for (size_t i = 0; i < a.u.l->n; i++) tv_list_push(st, r.u.l, a.u.l->items[i]);
        for (size_t i = 0; i < b.u.l->n; i++) tv_list_push(st, r.u.l, b.u.l->items[i]);
        return r;
    }
    if (op == OP_MUL) {
        if ((a.kind == TV_STR || a.kind == TV_LIST) && (b.kind == TV_INT || b.kind == TV_BOOL)) return seq_repeat(st, line, a, as_i(b));
        if ((b.kind == TV_STR || b.kind == TV_LIST) && (a.kind == TV_INT || a.kind == TV_BOOL)) return seq_repeat(st, line, b, as_i(a));
    }
    tpl_fail(st, line, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), tv_type_name(a), tv_type_name(b));
overflow:
    tpl_fail(st, line, "integer overflow in '%s'", op_sym(op));
}

static int contains(tpl_state *st, int line, tpl_val item, tpl_val seq) {
    switch (seq.kind) {
    case TV_STR:
        if (item.kind != TV_STR) tpl_fail(st, line, "'in <string>' requires string as left operand, not %s", tv_type_name(item));
        if (!item.n) return 1;
        for (size_t i = 0; i + item.n <= seq.n; i++)
            if (!memcmp(seq.u.s + i, item.u.s, item.n)) return 1;
        return 0;
    case TV_LIST:
        for (size_t i = 0; i < seq.u.l->n; i++)
            if (tv_equal(seq.u.l->items[i], item)) return 1;
        return 0;
    case TV_DICT:
        if ((item.kind == TV_LIST && !item.u.l->is_tuple) || item.kind == TV_DICT || item.kind == TV_NS)
            tpl_fail(st, line, "unhashable type: '%s'", tv_type_name(item));
        return tv_dict_find(seq.u.d, item) != NULL;
    case TV_UNDEF: return 0;
    default: tpl_fail(st, line, "argument of type '%s' is not iterable", tv_type_name(seq));
    }
}

static int compare_op(tpl_state *st, int line, int op, tpl_val a, tpl_val b) {
    switch (op) {
    case OP_EQ: return tv_equal(a, b);
    case OP_NE: return !tv_equal(a, b);
    case OP_IN: return contains(st, line, a, b);
    case OP_NOTIN: return !contains(st, line, a, b);
    default: break;
    }
    if (a.kind == TV_UNDEF) fail_undefined(st, line, a);
    if (b.kind == TV_UNDEF) fail_undefined(st, line, b);
    int c = tv_compare(st, line, a, b);
    switch (op) {
    case OP_LT: return c < 0;
    case OP_LE: return c <= 0;
    case OP_GT: return c > 0;
    default: return c >= 0;
    }
}

/* ---- calls ---- */
static void exec_body(tpl_state *st, tpl_frame *f, tpl_node *body);

static tpl_val invoke_macro(tpl_state *st, int line, tpl_macro *m, tpl_val *args, size_t n_args, const char **kwn,
                            tpl_val *kwv, size_t n_kw, tpl_val caller) {
    tpl_node *def = m->def;
    const char *mname = def->kind == N_MACRO ? def->name : "caller";
    if (n_args > def->n_params) tpl_fail(st, line, "macro '%s' takes not more than %zu argument(s)", mname, def->n_params);
    if (++st->macro_depth > TPL_MAX_MACRO_DEPTH) tpl_fail(st, line, "macro calls nested too deeply");
    tpl_step(st, line);
    tpl_frame *f = frame_new(st, m->closure);
    for (size_t k = 0; k < n_kw; k++) {
        size_t p;
        for (p = 0; p < def->n_params; p++)
            if (!strcmp(def->kwnames[p], kwn[k])) break;
        if (p == def->n_params) {
            if (!strcmp(kwn[k], "caller") && def->kind == N_MACRO && def->negated) { caller = kwv[k]; continue; }
            tpl_fail(st, line, "macro '%s' takes no keyword argument '%s'", mname, kwn[k]);
        }
        if (p < n_args) tpl_fail(st, line, "macro '%s' got multiple values for argument '%s'", mname, kwn[k]);
    }
    for (size_t p = 0; p < def->n_params; p++) {
        tpl_val v;
        int found = 0;
        if (p < n_args) { v = args[p]; found = 1; }
        for (size_t k = 0; !found && k < n_kw; k++)
            if (!strcmp(def->kwnames[p], kwn[k])) { v = kwv[k]; found = 1; }
        if (!found) {
            tpl_node *d = def->kwvals.items[p];
            v = d ? tpl_eval(st, f, d) : tv_undef("parameter was not provided");
        }
        frame_set(st, f, def->kwnames[p], v);
    }
    if (caller.kind != TV_UNDEF) {
        /* jinja2 only lets macros that mention caller receive one */
        if (!def->negated) tpl_fail(st, line, "macro '%s' takes no keyword argument 'caller'", mname);
        frame_set(st, f, "caller", caller);
    }
    sbuf *saved = st->out, *buf = tpl_tmp_begin(st);
    int saved_ctl = st->loop_ctl;
    st->out = buf;
    exec_body(st, f, def->body);
    st->out = saved;
    st->loop_ctl = saved_ctl;
    st->macro_depth--;
    return tpl_tmp_finish(st, buf);
}

tpl_val tpl_call_value(tpl_state *st, tpl_frame *f, int line, tpl_val fn, tpl_val *args, size_t n_args,
                       const char **kwn, tpl_val *kwv, size_t n_kw) {
    (void)f;
    switch (fn.kind) {
    case TV_MACRO: return invoke_macro(st, line, fn.u.m, args, n_args, kwn, kwv, n_kw, tv_undef(NULL));
    case TV_FUNC: return tpl_global_call(st, line, fn.u.fn, args, n_args, kwn, kwv, n_kw);
    case TV_METHOD: return tpl_method_call(st, line, fn.u.meth->self, fn.u.meth->name, args, n_args, kwn, kwv, n_kw);
    case TV_UNDEF: fail_undefined(st, line, fn);
    default: tpl_fail(st, line, "'%s' object is not callable", tv_type_name(fn));
    }
}

typedef struct call_args {
    tpl_val *args, *kwv;
    size_t n_args, n_kw;
    const char **kwn;
} call_args;

static call_args eval_args(tpl_state *st, tpl_frame *f, tpl_node *n) {
    call_args a = {.n_args = n->args.n, .n_kw = n->kwvals.n, .kwn = n->kwnames};
    a.args = tpl_alloc(st, (a.n_args + 1) * sizeof(tpl_val));
    a.kwv = tpl_alloc(st, (a.n_kw + 1) * sizeof(tpl_val));
    for (size_t i = 0; i < a.n_args; i++) a.args[i] = tpl_eval(st, f, n->args.items[i]);
    for (size_t i = 0; i < a.n_kw; i++) a.kwv[i] = tpl_eval(st, f, n->kwvals.items[i]);
    return a;
}

/* Applies a parsed filter chain (nodes whose innermost input is NULL) to v. */
static tpl_val apply_filters(tpl_state *st, tpl_frame *f, tpl_node *chain, tpl_val v) {
    if (!chain) return v;
    if (chain->kind != N_FILTER) return v;
    v = apply_filters(st, f, chain->a, v);
    call_args a = eval_args(st, f, chain);
    return tpl_filter(st, f, chain->line, chain->name, v, a.args, a.n_args, a.kwn, a.kwv, a.n_kw);
}

tpl_val tpl_eval(tpl_state *st, tpl_frame *f, tpl_node *e) {
    if (++st->depth > TPL_MAX_RUN_DEPTH) tpl_fail(st, e->line, "template recursion too deep");
    tpl_val r;
    switch (e->kind) {
    case N_CONST: r = e->value; break;
    case N_NAME: {
        tpl_val *v = frame_find(f, e->name);
        if (v) r = *v;
        else {
            size_t len = strlen(e->name) + 20;
            char *m = tpl_alloc(st, len);
            snprintf(m, len, "'%s' is undefined", e->name);
            r = tv_undef(m);
        }
        break;
    }
    case N_LIST:
    case N_TUPLE:
        r = tv_list(st, e->args.n);
        r.u.l->is_tuple = e->kind == N_TUPLE;
        for (size_t i = 0; i < e->args.n; i++) tv_list_push(st, r.u.l, tpl_eval(st, f, e->args.items[i]));
        break;
    case N_DICT:
        r = tv_dict(st, e->args.n);
        for (size_t i = 0; i < e->args.n; i++) {
            tpl_val k = tpl_eval(st, f, e->args.items[i]);
            if (k.kind == TV_LIST && !k.u.l->is_tuple) tpl_fail(st, e->line, "unhashable type: 'list'");
            if (k.kind == TV_DICT || k.kind == TV_NS) tpl_fail(st, e->line, "unhashable type: 'dict'");
            tv_dict_set(st, r.u.d, k, tpl_eval(st, f, e->kwvals.items[i]));
        }
        break;
    case N_GETATTR: {
        tpl_val o = tpl_eval(st, f, e->a);
        r = tpl_getattr(st, e->line, o, e->name, strlen(e->name));
        break;
    }
    case N_GETITEM: {
        tpl_val o = tpl_eval(st, f, e->a);
        if (e->b->kind == N_SLICE) {
            tpl_node *s = e->b;
            tpl_val a = s->a ? tpl_eval(st, f, s->a) : tv_none();
            tpl_val b = s->b ? tpl_eval(st, f, s->b) : tv_none();
            tpl_val c = s->c ? tpl_eval(st, f, s->c) : tv_none();
            r = do_slice(st, e->line, o, a, b, c);
        } else
            r = tpl_getitem(st, e->line, o, tpl_eval(st, f, e->b));
        break;
    }
    case N_SLICE: tpl_fail(st, e->line, "unsupported construct: slice outside of a subscript");
    case N_CALL: {
        tpl_val fn = tpl_eval(st, f, e->a);
        call_args a = eval_args(st, f, e);
        r = tpl_call_value(st, f, e->line, fn, a.args, a.n_args, a.kwn, a.kwv, a.n_kw);
        break;
    }
    case N_FILTER: {
        tpl_val v = tpl_eval(st, f, e->a);
        call_args a = eval_args(st, f, e);
        r = tpl_filter(st, f, e->line, e->name, v, a.args, a.n_args, a.kwn, a.kwv, a.n_kw);
        break;
    }
    case N_TEST: {
        tpl_val v = tpl_eval(st, f, e->a);
        call_args a = eval_args(st, f, e);
        if (a.n_kw) tpl_fail(st, e->line, "unsupported construct: keyword arguments to test '%s'", e->name);
        int t = tpl_test(st, e->line, e->name, v, a.args, a.n_args);
        r = tv_bool(e->negated ? !t : t);
        break;
    }
    case N_BINOP: {
        tpl_val a = tpl_eval(st, f, e->a);
        tpl_val b = tpl_eval(st, f, e->b);
        r = tpl_binop(st, e->line, e->op, a, b);
        break;
    }
    case N_UNARY: {
        tpl_val a = tpl_eval(st, f, e->a);
        if (a.kind == TV_UNDEF) fail_undefined(st, e->line, a);
        if (a.kind == TV_FLOAT) r = tv_float(e->op == OP_NEG ? -a.u.f : a.u.f);
        else if (a.kind == TV_INT || a.kind == TV_BOOL) {
            int64_t x = as_i(a);
            if (e->op == OP_NEG && x == INT64_MIN) tpl_fail(st, e->line, "integer overflow in unary '-'");
            r = tv_int(e->op == OP_NEG ? -x : x);
        } else
            tpl_fail(st, e->line, "bad operand type for unary %s: '%s'", e->op == OP_NEG ? "-" : "+", tv_type_name(a));
        break;
    }
    case N_AND: {
        tpl_val a = tpl_eval(st, f, e->a);
        r = tv_truthy(a) ? tpl_eval(st, f, e->b) : a;
        break;
    }
    case N_OR: {
        tpl_val a = tpl_eval(st, f, e->a);
        r = tv_truthy(a) ? a : tpl_eval(st, f, e->b);
        break;
    }
    case N_NOT: r = tv_bool(!tv_truthy(tpl_eval(st, f, e->a))); break;
    case N_COMPARE: {
        tpl_val a = tpl_eval(st, f, e->a);
        r = tv_bool(1);
        for (size_t i = 0; i < e->ops.n; i++) {
            tpl_val b = tpl_eval(st, f, e->ops.items[i]);
            if (!compare_op(st, e->line, e->cmp_ops[i], a, b)) { r = tv_bool(0); break; }
            a = b;
        }
        break;
    }
    case N_COND:
        if (tv_truthy(tpl_eval(st, f, e->a))) r = tpl_eval(st, f, e->b);
        else r = e->c ? tpl_eval(st, f, e->c) : tv_undef("the inline if-expression evaluated to false and no else section was defined");
        break;
    case N_CONCAT: {
        sbuf *t = tpl_tmp_begin(st);
        for (size_t i = 0; i < e->args.n; i++) tv_to_str(st, t, tpl_eval(st, f, e->args.items[i]));
        r = tpl_tmp_finish(st, t);
        break;
    }
    default: tpl_fail(st, e->line, "internal error: statement used as expression");
    }
    st->depth--;
    return r;
}

/* ---- statements ---- */
static void assign(tpl_state *st, tpl_frame *f, tpl_node *target, tpl_val v) {
    if (target->kind == N_NAME) { frame_set(st, f, target->name, v); return; }
    if (target->kind == N_GETATTR) {
        tpl_val *ns = frame_find(f, target->a->name);
        if (!ns || ns->kind != TV_NS) tpl_fail(st, target->line, "cannot assign attribute on non-namespace object");
        if (target->name[0] == '_') tpl_fail(st, target->line, "chat templates cannot store underscore-prefixed attributes on a namespace");
        tv_dict_set(st, ns->u.d, tv_cstr(target->name), v);
        return;
    }
    /* tuple unpacking */
    tpl_list *items = tv_iter(st, target->line, v);
    if (v.kind == TV_UNDEF) tpl_fail(st, target->line, "cannot unpack an undefined value");
    if (items->n != target->args.n)
        tpl_fail(st, target->line, "%s values to unpack (expected %zu, got %zu)", items->n > target->args.n ? "too many" : "not enough",
                 target->args.n, items->n);
    for (size_t i = 0; i < items->n; i++) assign(st, f, target->args.items[i], items->items[i]);
}

static void exec_for(tpl_state *st, tpl_frame *f, tpl_node *s) {
    tpl_val it = tpl_eval(st, f, s->b);
    tpl_list *src = tv_iter(st, s->line, it);
    tpl_list *items;
    {
        /* snapshot (and filter): the loop must not see later mutation */
        tpl_val l = tv_list(st, src->n);
        tpl_frame *ff = NULL;
        for (size_t i = 0; i < src->n; i++) {
            tpl_val v = src->items[i];
            if (s->c) {
                tpl_step(st, s->line);
                if (!ff) ff = frame_new(st, f);
                ff->n = 0; /* one scratch frame for all items: memory stays flat */
                assign(st, ff, s->a, v);
                if (!tv_truthy(tpl_eval(st, ff, s->c))) continue;
            }
            tv_list_push(st, l.u.l, v);
        }
        items = l.u.l;
    }
    tpl_loop *lp = tpl_alloc(st, sizeof *lp);
    lp->items = items;
    /* Each iteration starts with an empty scope (jinja2 forgets body assignments
     * between iterations); the frame is reused unless a macro captured it. */
    tpl_frame *lf = NULL;
    int completed = 0;
    for (size_t i = 0; i < items->n; i++) {
        tpl_step(st, s->line);
        if (!lf || lf->captured) lf = frame_new(st, f);
        lf->n = 0;
        lp->index0 = i;
        frame_set(st, lf, "loop", (tpl_val){.kind = TV_LOOP, .u.loop = lp});
        assign(st, lf, s->a, items->items[i]);
        exec_body(st, lf, s->body);
        /* jinja2 runs `else` unless some iteration's body ran to its end: a body
         * left by break or continue does not count */
        if (!st->loop_ctl) completed = 1;
        if (st->loop_ctl == 1) { st->loop_ctl = 0; break; }
        st->loop_ctl = 0;
    }
    if (!completed && s->else_body) exec_body(st, frame_new(st, f), s->else_body);
}

static tpl_val capture(tpl_state *st, tpl_frame *f, tpl_node *body) {
    sbuf *saved = st->out, *buf = tpl_tmp_begin(st);
    st->out = buf;
    exec_body(st, f, body);
    st->out = saved;
    return tpl_tmp_finish(st, buf);
}

static void exec_body(tpl_state *st, tpl_frame *f, tpl_node *body) {
    for (size_t i = 0; i < body->args.n && !st->loop_ctl; i++) tpl_exec(st, f, body->args.items[i]);
}

void tpl_exec(tpl_state *st, tpl_frame *f, tpl_node *s) {
    if (++st->depth > TPL_MAX_RUN_DEPTH) tpl_fail(st, s->line, "template recursion too deep");
    switch (s->kind) {
    case N_BODY: exec_body(st, f, s); break;
    case N_DATA: out_write(st, s->line, s->value.u.s, s->value.n); break;
    case N_OUTPUT: {
        tpl_val v = tpl_eval(st, f, s->a);
        if (v.kind == TV_STR) out_write(st, s->line, v.u.s, v.n);
        else {
            v = tv_stringify(st, v);
            out_write(st, s->line, v.u.s, v.n);
        }
        break;
    }
    case N_IF:
        if (tv_truthy(tpl_eval(st, f, s->a))) exec_body(st, f, s->body);
        else if (s->else_body) exec_body(st, f, s->else_body);
        break;
    case N_FOR: exec_for(st, f, s); break;
    case N_SET: assign(st, f, s->a, tpl_eval(st, f, s->b)); break;
    case N_SET_BLOCK: {
        /* like filter blocks, the body is a scope of its own */
        tpl_val v = capture(st, frame_new(st, f), s->body);
        assign(st, f, s->a, apply_filters(st, f, s->c, v));
        break;
    }
    case N_MACRO: {
        tpl_macro *m = tpl_alloc(st, sizeof *m);
        m->def = s;
        m->closure = f;
        m->caller = tv_undef(NULL);
        for (tpl_frame *c = f; c; c = c->parent) c->captured = 1;
        frame_set(st, f, s->name, (tpl_val){.kind = TV_MACRO, .u.m = m});
        break;
    }
    case N_CALL_BLOCK: {
        tpl_macro *cm = tpl_alloc(st, sizeof *cm);
        cm->def = s;
        cm->closure = f;
        for (tpl_frame *c = f; c; c = c->parent) c->captured = 1;
        cm->caller = tv_undef(NULL);
        tpl_val fn = tpl_eval(st, f, s->a->a);
        if (fn.kind != TV_MACRO) tpl_fail(st, s->line, "{%% call %%} needs a macro");
        call_args a = eval_args(st, f, s->a);
        tpl_val r = invoke_macro(st, s->line, fn.u.m, a.args, a.n_args, a.kwn, a.kwv, a.n_kw,
                                 (tpl_val){.kind = TV_MACRO, .u.m = cm});
        out_write(st, s->line, r.u.s, r.n);
        break;
    }
    case N_FILTER_BLOCK: {
        /* the body gets its own scope: assignments inside do not leak out */
        tpl_val v = apply_filters(st, f, s->c, capture(st, frame_new(st, f), s->body));
        v = tv_stringify(st, v);
        out_write(st, s->line, v.u.s, v.n);
        break;
    }
    case N_BREAK: st->loop_ctl = 1; break;
    case N_CONTINUE: st->loop_ctl = 2; break;
    case N_WITH: {
        tpl_frame *wf = frame_new(st, f);
        for (size_t i = 0; i < s->args.n; i++) assign(st, wf, s->args.items[i], tpl_eval(st, f, s->kwvals.items[i]));
        exec_body(st, wf, s->body);
        break;
    }
    default: tpl_fail(st, s->line, "internal error: expression used as statement");
    }
    st->depth--;
}

hearth_status tpl_render(const char *src, size_t len, const json_t *context, char **out, hearth_error *err) {
    return tpl_render_len(src, len, context, out, NULL, err);
}

hearth_status tpl_render_len(const char *src, size_t len, const json_t *context, char **out, size_t *out_len,
                             hearth_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!src || !out) return err_set(err, HEARTH_ERR_INVALID, "tpl_render: template source and output are required");
    if (context && !json_is_object(context)) return err_set(err, HEARTH_ERR_INVALID, "tpl_render: context must be a JSON object");
    tpl_state *st = calloc(1, sizeof *st);
    sbuf *result = calloc(1, sizeof *result);
    if (!st || !result) {
        free(st);
        free(result);
        return err_set(err, HEARTH_ERR_NOMEM, "tpl_render: out of memory");
    }
    hearth_error local;
    st->err = err ? err : &local;
    sbuf_init(result);
    st->out = result;
    hearth_status rc = HEARTH_OK;
    if (setjmp(st->fail) == 0) {
        tpl_tok *toks;
        size_t n_toks;
        tpl_lex(st, src, len, &toks, &n_toks);
        tpl_node *root = tpl_parse(st, toks, n_toks);
        tpl_frame *globals = frame_new(st, NULL);
        static const struct { const char *name; int fn; } builtins[] = {
            {"range", FN_RANGE}, {"namespace", FN_NAMESPACE}, {"raise_exception", FN_RAISE},
            {"strftime_now", FN_STRFTIME}, {"dict", FN_DICT},
        };
        for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
            frame_set(st, globals, builtins[i].name, (tpl_val){.kind = TV_FUNC, .u.fn = builtins[i].fn});
        tpl_frame *top = frame_new(st, globals);
        if (context) {
            const char *k;
            json_t *v;
            json_object_foreach((json_t *)context, k, v) {
                frame_set(st, top, tpl_strdup(st, k, strlen(k)), tv_from_json(st, v, 0));
            }
        }
        exec_body(st, top, root);
        if (out_len) *out_len = result->len;
        *out = sbuf_steal(result);
    } else {
        rc = st->err->status;
        for (int i = 0; i < st->n_temps; i++) sbuf_free(st->temps[i]);
        sbuf_free(result);
    }
    tpl_arena_free(&st->arena);
    free(result);
    free(st);
    return rc;
}
