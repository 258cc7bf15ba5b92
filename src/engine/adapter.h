/* adapter.h: LoRA / DoRA adapters in the engine: reading an adapter folder (MLX's
 * adapters.safetensors or PEFT's adapter_model.safetensors, each with adapter_config.json)
 * against a loaded model, all or nothing, into the float32 pairs the ops apply
 * (op_adapter); the registry of mounted adapters (mount and unmount from any thread) and
 * the refcounted adapter sets a request's rows use. Parses no HTTP. */
#ifndef HEARTH_ENGINE_ADAPTER_H
#define HEARTH_ENGINE_ADAPTER_H
#include "hearth.h"
#include "model/model.h"
#include <pthread.h>

/* The most adapters one request combines ("a+b+..."). */
#define ADAPTER_MAX_SET 8
/* Freed adapters' serials the registry holds for the engine (adapter_registry_take_gone). */
#define ADAPTER_GONE_MAX 64

typedef struct adapter {
    char *id, *path;
    const char *format; /* "mlx" or "peft" */
    int dora;
    int rank;
    float scale;
    int n_layers;       /* layers it updates */
    unsigned modules;   /* bit p: it updates projection p (op_proj) somewhere */
    size_t bytes;       /* its float32 pairs and DoRA factors */
    uint64_t serial;    /* unique per mount: the prefix cache's namespace */
    op_lora *proj;      /* [model layers * OP_N_PROJ] */
    float *data;
    op_adapter ops;
    int refs;           /* the registry's and every set's that names it */
    struct adapter *next;
} adapter;

/* Reads the adapter in folder path for model m (its shapes, its GGUF row order): fails,
 * naming the file and the mismatch (rank, target module, layer, base shape), on anything
 * it cannot apply exactly. */
hearth_status adapter_load(const model *m, const char *path, adapter **out, hearth_error *err);
/* adapter_load's work on the files' bytes (config: adapter_config.json's text; tensors: the
 * safetensors image) for the folder named path, MLX or PEFT layout (the fuzz target's entry). */
hearth_status adapter_parse(const model *m, const char *path, int peft, const char *config, size_t config_len,
                            const uint8_t *tensors, size_t tensors_len, adapter **out, hearth_error *err);
void adapter_free(adapter *a);
/* Projection p's (op_proj) name as /v1/adapters lists it ("q_proj", "router", "experts.gate_proj", ...). */
const char *adapter_proj_name(int p);
/* Its module path inside a decoder layer ("self_attn.q_proj"; alt 1: the second spelling
 * some families use, e.g. Gemma 4's "router.proj", or NULL). */
const char *adapter_proj_path(int p, int alt);

/* The adapters one request uses: refcounted, shared by the request and its slot. */
typedef struct adapter_set {
    op_adapter_set ops;
    const op_adapter *list[ADAPTER_MAX_SET];
    adapter *members[ADAPTER_MAX_SET];
    uint64_t ns; /* the prefix cache namespace of this combination */
    int refs;
} adapter_set;

typedef struct adapter_registry {
    pthread_mutex_t mu;
    adapter *head;   /* mount order */
    char *default_id; /* the adapter of requests that name none (NULL: the base) */
    uint64_t next_serial;
    /* serials of adapters freed since the engine last took them (adapter_registry_take_gone):
     * a device backend drops their copies; past ADAPTER_GONE_MAX the oldest are forgotten
     * (the backend's LRU drops those copies instead) */
    uint64_t gone[ADAPTER_GONE_MAX];
    int n_gone;
} adapter_registry;

void adapter_registry_init(adapter_registry *r);
void adapter_registry_free(adapter_registry *r);
/* Adds a loaded adapter under its id (fails if the id is taken; a is then still the caller's). */
hearth_status adapter_registry_add(adapter_registry *r, adapter *a, hearth_error *err);
/* Removes id (HEARTH_ERR_NOT_FOUND if absent); requests using it finish with it. */
hearth_status adapter_registry_remove(adapter_registry *r, const char *id, hearth_error *err);
hearth_status adapter_registry_set_default(adapter_registry *r, const char *id, hearth_error *err);
/* The set a request spec names: NULL spec: the default adapter; "none" or "" or the
 * default with none mounted: *out NULL (the base); "id" or "a+b": those adapters. */
hearth_status adapter_registry_resolve(adapter_registry *r, const char *spec, adapter_set **out, hearth_error *err);
/* Moves the serials of adapters freed since the last call into keys (at most cap), returns how many. */
int adapter_registry_take_gone(adapter_registry *r, uint64_t *keys, int cap);
void adapter_set_retain(adapter_registry *r, adapter_set *s);
void adapter_set_release(adapter_registry *r, adapter_set *s);
/* [{id, path, format, type, rank, scale, size_bytes, layers, modules, default}] */
char *adapter_registry_json(adapter_registry *r);
/* The id of the mounted adapter whose id or path is name, copied into id (cap bytes):
 * 0; none: -1; an id longer than cap: -2. */
int adapter_registry_find_name(adapter_registry *r, const char *name, char *id, size_t cap);
#endif
