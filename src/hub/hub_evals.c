/* hub_evals.c: the evals database, $HEARTH_CACHE/evals.sqlite: one table `runs`, one
 * row per fit prediction, fit check (predicted vs measured peak), benchmark or bandwidth
 * probe, and this machine's read bandwidth from it (hearth_machine_bandwidth). The
 * schema is documented in docs/cli.md (hearth evals); columns are only ever added. */
#include "backend/cpu/bandwidth.h"
#include "base/err.h"
#include "hub/hub.h"
#include "io/resolve.h"
#include <errno.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *evals_schema = "CREATE TABLE IF NOT EXISTS runs ("
                                  " id INTEGER PRIMARY KEY AUTOINCREMENT,"
                                  " time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),"
                                  " kind TEXT NOT NULL," /* fit | fit-check | bench */
                                  " model TEXT NOT NULL,"
                                  " context INTEGER,"
                                  " predicted_peak_bytes INTEGER," /* NULL when not predicted */
                                  " measured_peak_bytes INTEGER,"  /* NULL when not measured */
                                  " tok_s REAL,"                   /* NULL when not measured */
                                  " hearth_version TEXT,"
                                  " details TEXT)"; /* a JSON object: the full report */

static hearth_status evals_open(sqlite3 **db, hearth_error *err) {
    char *dir = resolve_hearth_cache_dir();
    if (!dir) return err_set(err, HEARTH_ERR_NOMEM, "evals: out of memory");
    mkdir(dir, 0755); /* the cache may not exist yet; its parent (~/.cache) usually does */
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (path) snprintf(path, n, "%s/evals.sqlite", dir);
    free(dir);
    if (!path) return err_set(err, HEARTH_ERR_NOMEM, "evals: out of memory");
    hearth_status st = HEARTH_OK;
    char *msg = NULL;
    if (sqlite3_open(path, db) != SQLITE_OK)
        st = err_set(err, HEARTH_ERR_IO, "evals: %s: %s", path, sqlite3_errmsg(*db));
    else {
        sqlite3_busy_timeout(*db, 5000); /* a bench and a fit check may write at once */
        if (sqlite3_exec(*db, evals_schema, NULL, NULL, &msg) != SQLITE_OK)
            st = err_set(err, HEARTH_ERR_IO, "evals: %s: %s", path, msg ? msg : "cannot create the table");
    }
    sqlite3_free(msg);
    if (st) {
        sqlite3_close(*db);
        *db = NULL;
    }
    free(path);
    return st;
}

static void bind_opt_int(sqlite3_stmt *s, int i, long long v) {
    if (v < 0)
        sqlite3_bind_null(s, i);
    else
        sqlite3_bind_int64(s, i, v);
}

hearth_status hearth_evals_record(const hearth_eval_row *r, hearth_error *err) {
    if (!r || !r->kind || !r->model) return err_set(err, HEARTH_ERR_INVALID, "evals: a row needs a kind and a model");
    sqlite3 *db;
    hearth_status st = evals_open(&db, err);
    if (st) return st;
    sqlite3_stmt *s = NULL;
    const char *sql = "INSERT INTO runs (kind, model, context, predicted_peak_bytes, measured_peak_bytes, tok_s, "
                      "hearth_version, details) VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) {
        st = err_set(err, HEARTH_ERR_IO, "evals: %s", sqlite3_errmsg(db));
    } else {
        sqlite3_bind_text(s, 1, r->kind, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 2, r->model, -1, SQLITE_TRANSIENT);
        bind_opt_int(s, 3, r->context > 0 ? r->context : -1);
        bind_opt_int(s, 4, r->predicted_peak_bytes);
        bind_opt_int(s, 5, r->measured_peak_bytes);
        if (r->tok_s < 0)
            sqlite3_bind_null(s, 6);
        else
            sqlite3_bind_double(s, 6, r->tok_s);
        sqlite3_bind_text(s, 7, HEARTH_VERSION, -1, SQLITE_STATIC);
        if (r->details_json)
            sqlite3_bind_text(s, 8, r->details_json, -1, SQLITE_TRANSIENT);
        else
            sqlite3_bind_null(s, 8);
        if (sqlite3_step(s) != SQLITE_DONE) st = err_set(err, HEARTH_ERR_IO, "evals: %s", sqlite3_errmsg(db));
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return st;
}

hearth_status hearth_evals_json(char **out, hearth_error *err) {
    *out = NULL;
    sqlite3 *db;
    hearth_status st = evals_open(&db, err);
    if (st) return st;
    sqlite3_stmt *s = NULL;
    json_t *arr = json_array();
    const char *sql = "SELECT id, time, kind, model, context, predicted_peak_bytes, measured_peak_bytes, tok_s, "
                      "hearth_version, details FROM runs ORDER BY id DESC";
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
        st = err_set(err, HEARTH_ERR_IO, "evals: %s", sqlite3_errmsg(db));
    for (int rc; !st && (rc = sqlite3_step(s)) != SQLITE_DONE;) {
        if (rc != SQLITE_ROW) {
            st = err_set(err, HEARTH_ERR_IO, "evals: %s", sqlite3_errmsg(db));
            break;
        }
        json_t *o = json_object();
        int n = sqlite3_column_count(s);
        for (int c = 0; c < n; c++) {
            const char *name = sqlite3_column_name(s, c);
            json_t *v;
            switch (sqlite3_column_type(s, c)) {
            case SQLITE_INTEGER: v = json_integer(sqlite3_column_int64(s, c)); break;
            case SQLITE_FLOAT: v = json_real(sqlite3_column_double(s, c)); break;
            case SQLITE_NULL: v = json_null(); break;
            default: {
                const char *t = (const char *)sqlite3_column_text(s, c);
                v = !strcmp(name, "details") && t ? json_loads(t, 0, NULL) : NULL;
                if (!v) v = json_string(t ? t : "");
            }
            }
            json_object_set_new(o, name, v);
        }
        json_array_append_new(arr, o);
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    if (!st) *out = json_dumps(arr, JSON_INDENT(2));
    json_decref(arr);
    return st;
}

/* The newest CPU read bandwidth a row holds: a hearth bench run's (details.bandwidth_gbs,
 * device cpu) or an earlier probe's. 0 when there is none. */
static double newest_bandwidth(char *when, size_t cap, char *kind, size_t kind_cap) {
    sqlite3 *db;
    hearth_error ignore = {0};
    if (evals_open(&db, &ignore)) return 0;
    sqlite3_stmt *s = NULL;
    double gbs = 0;
    const char *sql = "SELECT time, kind, details FROM runs WHERE kind IN ('bench', 'probe') ORDER BY id DESC";
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK)
        while (gbs <= 0 && sqlite3_step(s) == SQLITE_ROW) {
            const char *t = (const char *)sqlite3_column_text(s, 2);
            json_t *d = t ? json_loads(t, 0, NULL) : NULL;
            const char *dev = json_string_value(json_object_get(d, "device"));
            if (dev && !strcmp(dev, "cpu") && json_number_value(json_object_get(d, "bandwidth_gbs")) > 0) {
                gbs = json_number_value(json_object_get(d, "bandwidth_gbs"));
                snprintf(when, cap, "%s", (const char *)sqlite3_column_text(s, 0));
                snprintf(kind, kind_cap, "%s", (const char *)sqlite3_column_text(s, 1));
            }
            json_decref(d);
        }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return gbs;
}

/* A 256 MiB read, best of 2, on every core: about 0.1 s, far past any cache, close to
 * hearth bench's 1 GiB figure (bench/results/kernels.md). */
#define HUB_PROBE_BYTES ((size_t)256 << 20)

hearth_status hearth_machine_bandwidth(double *gbs, char *source, size_t cap, hearth_error *err) {
    char when[64] = "", kind[16] = "";
    if ((*gbs = newest_bandwidth(when, sizeof when, kind, sizeof kind)) > 0) {
        snprintf(source, cap, "%s %s", !strcmp(kind, "bench") ? "hearth bench" : "probe", when);
        return HEARTH_OK;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threadpool *tp = NULL;
    hearth_status st = tp_create(cores > 0 ? (int)cores : 1, &tp, err);
    if (st) return st;
    *gbs = cpu_read_bandwidth_gbs(tp, HUB_PROBE_BYTES, 2);
    tp_destroy(tp);
    if (*gbs <= 0) return err_set(err, HEARTH_ERR_NOMEM, "cannot allocate the bandwidth probe's 256 MiB");
    /* recorded, so that every later choice and fit on this machine uses the same figure */
    char details[160];
    snprintf(details, sizeof details, "{\"device\": \"cpu\", \"bandwidth_gbs\": %.17g, \"threads\": %ld, \"bytes\": %zu}",
             *gbs, cores > 0 ? cores : 1, HUB_PROBE_BYTES);
    hearth_eval_row row = {.kind = "probe", .model = "-", .predicted_peak_bytes = -1, .measured_peak_bytes = -1,
                           .tok_s = -1, .details_json = details};
    hearth_error ignore = {0};
    int kept = hearth_evals_record(&row, &ignore) == HEARTH_OK;
    snprintf(source, cap, kept ? "probe now (recorded in the evals db)" : "probe now");
    return HEARTH_OK;
}
