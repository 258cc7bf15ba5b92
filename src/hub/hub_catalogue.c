/* hub_catalogue.c: hearth_choose_model, the appliance's choice: reads this machine
 * (cores, available RAM, the recorded read bandwidth or a quick probe, CUDA devices
 * when built with them), walks data/catalogue.json best first and picks the best entry that fits and
 * decodes at a readable speed. Serves what is on disk now; names a better absent one
 * for a background pull. No network on this path. */
#include "base/err.h"
#include "base/file.h"
#include "hub/hub.h"
#include "io/resolve.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef HEARTH_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* Reading speed: people read about 4-8 words (5-10 tokens) a second, so a model slower
 * than this feels slow in the chat page even when it fits. */
#define HUB_MIN_TOK_S 8.0
/* Beyond the weights, a default engine holds the KV pool at its default context,
 * scratch and the runtime (hearth fit shows 0.5 GB for SmolLM2 135M at 8192); a
 * quarter of the weights plus 512 MiB covers the catalogue's models at their defaults. */
#define HUB_OVERHEAD_FRACTION 0.25
#define HUB_OVERHEAD_BYTES (512.0 * 1024 * 1024)

typedef struct machine {
    int cores, gpus;
    double budget_bytes, bandwidth_gbs;
} machine;

static void read_machine(machine *m, char *text, size_t cap) {
    m->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    hearth_process_memory pm;
    hearth_process_memory_get(&pm);
    m->budget_bytes = pm.available_bytes > 0 ? (double)pm.available_bytes : 0;
    /* the recorded figure (hearth_machine_bandwidth): a fresh probe each start varied by
     * half (16.9-31.4 GB/s on a loaded 2-core VM), enough to flip the choice */
    char source[128] = "";
    if (hearth_machine_bandwidth(&m->bandwidth_gbs, source, sizeof source, NULL)) m->bandwidth_gbs = 0;
    m->gpus = 0;
    double gpu_mem = 0;
#ifdef HEARTH_HAVE_CUDA
    m->gpus = cuda_device_count();
    cuda_device_info info;
    if (m->gpus > 0 && !cuda_device_open(0, &info, NULL)) gpu_mem = (double)info.total_mem;
#endif
    int n = snprintf(text, cap, "%d cores, %.1f GB RAM available, %.1f GB/s read (%s)", m->cores,
                     m->budget_bytes / 1e9, m->bandwidth_gbs, source);
    if (gpu_mem > 0) {
        /* the engine runs on GPU 0 when there is one (HEARTH_DEVICE_AUTO): its memory is
         * the budget and its bandwidth is never the limit for these sizes */
        snprintf(text + n, cap - (size_t)n, ", %d GPU(s), %.1f GB on GPU 0", m->gpus, gpu_mem / 1e9);
        m->budget_bytes = gpu_mem * 0.9;
        m->bandwidth_gbs = 1e9;
    }
    if (m->bandwidth_gbs <= 0) m->bandwidth_gbs = 9.9; /* hearth fit's default (fit.c) */
}

static int suitable(const machine *m, double bytes) {
    double need = bytes * (1 + HUB_OVERHEAD_FRACTION) + HUB_OVERHEAD_BYTES;
    return bytes > 0 && need <= m->budget_bytes && m->bandwidth_gbs * 1e9 / bytes >= HUB_MIN_TOK_S;
}

/* The path of a catalogue entry when its repo is in the HF cache. */
static int present(const char *hub_id, char *path, size_t cap) {
    model_entry e;
    hearth_error err = {0};
    if (resolve_model(hub_id, &e, &err)) return 0;
    int ok = !strcmp(e.source, "hf-cache");
    if (ok) snprintf(path, cap, "%s", e.path);
    resolve_entry_free(&e);
    return ok;
}

hearth_status hearth_choose_model(hearth_choice *c, hearth_error *err) {
    memset(c, 0, sizeof *c);
    char *text = data_file_load("catalogue.json", err);
    if (!text) return err->status;
    json_error_t je;
    json_t *cat = json_loads(text, 0, &je), *models = json_object_get(cat, "models");
    free(text);
    if (!json_is_array(models)) {
        json_decref(cat);
        return err_set(err, HEARTH_ERR_FORMAT, "catalogue.json: expected {\"models\": [...]} (%s)", je.text);
    }
    machine m;
    read_machine(&m, c->machine, sizeof c->machine);
    int have_best = 0;
    size_t i;
    const json_t *e;
    json_array_foreach(models, i, e) {
        const char *id = json_string_value(json_object_get(e, "hub_id")),
                   *name = json_string_value(json_object_get(e, "name"));
        double bytes = json_number_value(json_object_get(e, "approx_bytes"));
        if (!id || !name || !suitable(&m, bytes)) continue;
        if (present(id, c->model, sizeof c->model)) {
            snprintf(c->name, sizeof c->name, "%s", name);
            break;
        }
        if (!have_best) { /* the best suitable entry is absent: worth a background pull */
            have_best = 1;
            const char *inc = json_string_value(json_object_get(e, "include"));
            snprintf(c->better, sizeof c->better, "%s", id);
            snprintf(c->better_include, sizeof c->better_include, "%s", inc ? inc : "");
            snprintf(c->better_name, sizeof c->better_name, "%s", name);
            c->better_bytes = bytes;
        }
    }
    if (!c->model[0]) { /* the make-run default, which get_models.sh always provides */
        const json_t *d = json_object_get(cat, "default");
        const char *local = json_string_value(json_object_get(d, "local")),
                   *name = json_string_value(json_object_get(d, "name"));
        char *cache = resolve_hearth_cache_dir(), *p = cache && local ? path_join(cache, local) : NULL;
        /* elsewhere (HEARTH_CACHE moved, HEARTH_MODELS): "" lets serve find it by name */
        if (p && file_exists(p)) snprintf(c->model, sizeof c->model, "%s", p);
        snprintf(c->name, sizeof c->name, "%s", name ? name : "the default model");
        free(p);
        free(cache);
    }
    json_decref(cat);
    return HEARTH_OK;
}
