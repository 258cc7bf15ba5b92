/* hearth.h: the public C API of libhearth, a local LLM runtime, and nothing else.
 * Everything a consumer (the CLI, the server, an embedding app) may call lives here;
 * internal structs stay opaque and internal functions live in headers under src/.
 * Functions that can fail return a hearth_status and fill a caller-owned hearth_error
 * with a message a user can act on. Build against it with `pkg-config --cflags --libs
 * hearth`; examples/ shows each part in use. */
#ifndef HEARTH_H
#define HEARTH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HEARTH_VERSION "0.1.0"
/* The version of this API: raised when a declaration here changes incompatibly (a
 * removed or changed function, a struct whose layout changes), which also changes the
 * shared library's soname (libhearth.so.<HEARTH_API_VERSION - 1>). */
#define HEARTH_API_VERSION 2

typedef enum hearth_status {
    HEARTH_OK = 0,
    HEARTH_ERR_IO,          /* a file could not be opened or read */
    HEARTH_ERR_FORMAT,      /* a file or input is malformed */
    HEARTH_ERR_UNSUPPORTED, /* valid, but not something hearth handles (yet) */
    HEARTH_ERR_NOT_FOUND,   /* a model, tensor or key does not exist */
    HEARTH_ERR_AMBIGUOUS,   /* a short model name matched several models */
    HEARTH_ERR_INVALID,     /* bad argument from the caller */
    HEARTH_ERR_NOMEM,       /* out of memory */
    HEARTH_ERR_TEMPLATE,    /* a chat template failed to render (incl. raise_exception) */
} hearth_status;

typedef struct hearth_error {
    hearth_status status;
    char message[1024];
} hearth_error;

/* Frees memory returned by any hearth_* function (strings, id arrays). */
void hearth_free(void *p);
/* The name of a status ("ok", "io_error", "format_error", ...), for messages and logs. */
const char *hearth_status_name(hearth_status s);

/* ---- models ------------------------------------------------------------ */

typedef struct hearth_model hearth_model;

/* Opens a model without loading weights for compute: parses config.json or GGUF
 * metadata, maps the tensor index, loads the tokenizer and chat template.
 * name_or_path: a model folder, a .gguf file, a Hugging Face repo id present in the
 * HF cache (org/name), or an unambiguous substring of a known model's name
 * (searched in the HF cache and in the folders listed in $HEARTH_MODELS). */
hearth_status hearth_model_open(const char *name_or_path, hearth_model **out, hearth_error *err);
/* Frees the model (NULL is fine); every engine or embedder made from it must be freed first. */
void hearth_model_close(hearth_model *m);

/* A JSON object describing the model: architecture, sizes, quantization, tokenizer,
 * chat template, files. Caller frees with hearth_free. */
char *hearth_model_info_json(const hearth_model *m);
/* The resolved path of the model (folder or .gguf file). */
const char *hearth_model_path(const hearth_model *m);

/* The model's tensors as a JSON array of {name, dtype, shape, bytes}; MLX-quantized
 * weights also carry {"bits", "group_size"} and their logical (unpacked) shape. */
char *hearth_model_tensors_json(const hearth_model *m);
/* Dequantizes one tensor to float32 (caller frees *data with hearth_free). */
hearth_status hearth_model_tensor_f32(const hearth_model *m, const char *name, float **data, size_t *n_elems,
                                      hearth_error *err);

/* ---- tokenizer --------------------------------------------------------- */

/* Encodes UTF-8 text to token ids. add_special: add BOS/EOS etc. the way the
 * tokenizer's post-processor does; special-token strings inside the text are
 * recognised either way. *ids is allocated; caller frees with hearth_free. */
hearth_status hearth_tokenize(const hearth_model *m, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids, hearth_error *err);
/* Decodes ids to UTF-8 text (NUL-terminated, caller frees). skip_special drops
 * special tokens from the output. */
hearth_status hearth_detokenize(const hearth_model *m, const int32_t *ids, size_t n_ids, int skip_special,
                                char **text, hearth_error *err);

/* Incremental decoding for streaming: feed one id at a time, receive the text that
 * became final. Never emits a broken UTF-8 sequence. */
typedef struct hearth_detok_stream hearth_detok_stream;
hearth_detok_stream *hearth_detok_stream_new(const hearth_model *m, int skip_special);
/* Returns the newly final text (valid until the next call), possibly "". */
const char *hearth_detok_stream_push(hearth_detok_stream *s, int32_t id);
/* Flushes what is held back at the end of generation. */
const char *hearth_detok_stream_finish(hearth_detok_stream *s);
void hearth_detok_stream_free(hearth_detok_stream *s);

/* The tokenizer's vocabulary size (ids 0..size-1 decode). */
int32_t hearth_vocab_size(const hearth_model *m);
/* The raw vocabulary string of a token (e.g. "\u0120word" for byte-level BPE), or NULL. */
const char *hearth_token_piece(const hearth_model *m, int32_t id);
/* The model's default chat template source, or NULL (valid while the model is open). */
const char *hearth_model_chat_template(const hearth_model *m);
/* A string value of tokenizer_config.json (e.g. "tool_parser_type"), or NULL. */
const char *hearth_model_tokenizer_config_string(const hearth_model *m, const char *key);
/* The id of a token string or -1. */
int32_t hearth_token_id(const hearth_model *m, const char *token);

/* ---- chat templates ---------------------------------------------------- */

/* Renders the model's chat template. messages_json: a JSON array of OpenAI-style
 * messages; tools_json: a JSON array of tools or NULL; extra_json: a JSON object of
 * extra template variables (e.g. {"enable_thinking": false}) or NULL.
 * Caller frees *out with hearth_free. */
hearth_status hearth_chat_render(const hearth_model *m, const char *messages_json, const char *tools_json,
                                 int add_generation_prompt, const char *extra_json, char **out,
                                 hearth_error *err);

/* Replaces the model's chat template (e.g. from --chat-template); NULL restores none. */
hearth_status hearth_model_set_chat_template(hearth_model *m, const char *template_src, hearth_error *err);

/* ---- generation -------------------------------------------------------- */

typedef struct hearth_engine hearth_engine;

/* KV storage: float32, or int8 with one float scale per position and KV head
 * (symmetric absmax, quantized once when the position is appended), or fp8 e4m3 with the
 * same per-row scale (GPU only: the CPU engine refuses it). */
typedef enum hearth_kv_quant {
    HEARTH_KV_FLOAT = 0,
    HEARTH_KV_INT8 = 1,
    HEARTH_KV_FP8 = 2, /* the CUDA backend only */
    HEARTH_KV_F16 = 3  /* the CUDA backend only: IEEE half, no scales */
} hearth_kv_quant;
/* "none"/"float"/"f32", "int8", "fp8"/"fp8_e4m3" or "f16"/"fp16"/"float16" -> *out (a
 * hearth_kv_quant); returns 0 if the name is unknown. */
int hearth_kv_quant_parse(const char *name, int *out);
/* "none", "int8", "fp8" or "f16" ("?" for an unknown value). */
const char *hearth_kv_quant_name(int quant);

/* Where the forward pass runs. auto: the GPU when the CUDA backend is compiled in and a
 * device is present, else the CPU. */
typedef enum hearth_device { HEARTH_DEVICE_CPU = 0, HEARTH_DEVICE_CUDA = 1, HEARTH_DEVICE_AUTO = 2 } hearth_device;
/* "cpu", "cuda" or "auto" -> *out; 0 if the name is unknown. */
int hearth_device_parse(const char *name, int *out);
/* The device the engine runs on (HEARTH_DEVICE_CPU or HEARTH_DEVICE_CUDA). */
int hearth_engine_device(const hearth_engine *e);
/* The highest GPU memory in use seen so far (cudaMemGetInfo total - free, sampled now and
 * kept as a high-water mark; it counts every process on the GPU): what /stats peak_bytes
 * reports for a GPU engine. 0 without a GPU. Any thread. */
size_t hearth_device_peak_bytes(void);

/* Requests `hearth serve` generates at once when --max-sequences is not given; `hearth fit`
 * and the model library assume the same. */
#define HEARTH_SERVE_MAX_SEQUENCES 8

typedef struct hearth_engine_options {
    int n_threads;       /* 0: all cores */
    int context_length;  /* 0: the model's own limit, cut to the largest that fits in free
                            memory when one sequence of it would not (with the default pool) */
    int max_step_tokens; /* tokens per forward step (prefill chunk); 0: 256 */
    int max_sequences;   /* sequences held at once; 0: 1 */
    int use_mmap;        /* 1: use the weight matrices in place in the file mapping instead of
                            copying them into resident memory (for models larger than RAM);
                            -1: always copy; 0: copy on the CPU, map on the GPU (where each
                            weight's file pages leave the process once its device copy is
                            made, so the host holds no second copy of the weights) */
    int kv_blocks;       /* KV pool size in blocks of 16 positions; 0 (and no kv_budget_bytes):
                            max_sequences x context, cut to what fits in free memory after the
                            weights, scratch and buffers (at least one context; the batch
                            scheduler admits requests as blocks free up) */
    double kv_budget_bytes; /* > 0 and kv_blocks 0: as many blocks as fit in these bytes */
    int kv_quant;        /* hearth_kv_quant: how the KV pool stores keys and values */
    int deterministic;   /* 1: batch-invariant numerics: a sequence's logits do not depend on
                            what else is in the step (slower prefill; see docs/server.md) */
    int device;          /* hearth_device: where the forward pass runs (0: cpu) */
    int cuda_exact;      /* 1: on the GPU, f32 prefill GEMMs and attention instead of bf16 tensor
                            cores (the exact parity tier, whose greedy tokens equal the CPU
                            reference tier's); no effect on the CPU */
    int expert_offload;  /* > 0 (--expert-offload N, N >= 3): on the GPU, a mixture-of-experts
                            model's expert weights stay in pinned host memory and the ones a
                            step uses are copied into a device pool of N slots (one expert
                            weight each); refused on the CPU and for models without experts.
                            0: every expert resident on the device */
    int max_logits_rows; /* rows of logits one hearth_seq_append may return (scoring every
                            position of a prompt, as perplexity does); 0: 8 */
    int host_sampler;    /* 1: on the GPU, tokens are picked on the host from the copied logits
                            rows (greedy and sampled alike) instead of by the device's argmax
                            and sampler kernels: for comparisons; no effect on the CPU */
    int speculate;       /* hearth_speculate: how the batch scheduler proposes tokens to
                            verify several per step (docs/server.md); 0: prompt lookup */
    int no_state_journal;      /* 1: on the CPU, a hybrid model's speculation keeps no journal of
                                 the recurrent state, as the CUDA backend keeps none (a rejected
                                 proposal's kept tokens are fed again at the next step, which
                                 proposes nothing): the GPU's scheduling, for comparisons */
    hearth_model *draft_model; /* speculative decoding with this smaller model (it must have
                            the model's tokenizer; it runs in the engine with the same
                            options, its own KV pool): the batch scheduler proposes its
                            greedy tokens instead of prompt lookup's. NULL: none. Must
                            outlive the engine. */
    const struct hearth_spec_replay *spec_replay; /* benchmarks only (`hearth bench
                            --spec-accept`): the draft model's proposals replaced by a
                            recorded greedy text with a set acceptance; NULL: none.
                            Read at every step (the bench changes it between runs; tokens
                            NULL: the draft's own proposals); must outlive the engine. */
} hearth_engine_options;

/* Controlled acceptance for benchmarks (hearth_engine_options.spec_replay): the draft model
 * runs and pays its cost as usual, then each token it proposes for position pos is
 * replaced by the recorded text's token at pos with probability accept, else by a token
 * that differs from it (the verifier rejects there, as it would a wrong guess). The
 * recorded texts are the target's greedy texts (prompt and continuation, n tokens each)
 * from a run without speculation; a request replays the first of them that holds its
 * tokens so far (none: the draft's own proposals stay). The keep / replace draw is a
 * function of (seed, sequence slot, position), so the same requests replay the same way
 * every run. Verification is unchanged: the output stays the target's greedy text. */
typedef struct hearth_spec_replay {
    const int32_t *tokens; /* [n_texts, n] */
    size_t n;
    int n_texts;
    double accept;  /* 0..1 */
    uint64_t seed;
} hearth_spec_replay;

/* Speculative decoding in the batch scheduler: a proposer guesses the next tokens of a
 * decoding request, one step scores them all, and the request keeps the longest prefix
 * that its own sampling agrees with (the output is exactly what it would be without). */
typedef enum hearth_speculate {
    HEARTH_SPEC_LOOKUP = 0, /* prompt lookup: n-grams of the request's own prompt and output,
                               depth adapted per request, off above a few decoding requests */
    HEARTH_SPEC_NONE = 1,   /* one token per request per step */
    HEARTH_SPEC_DRAFT = 2,  /* not an option: the draft model's entry in the stats (with
                               hearth_engine_options.draft_model set) */
    HEARTH_SPEC_SUFFIX = 3, /* prompt lookup, then a suffix index over the batch's recent
                               outputs (agent loops repeat their calls): proposals may come
                               from other requests' answers */
    HEARTH_SPEC_MTP = 4,    /* the model's own multi-token-prediction head (Qwen3.5's mtp.*
                               weights, as Hugging Face ships them) proposes num_draft_tokens
                               tokens a step; the CPU backend only, for now */
    HEARTH_SPEC_KINDS = 5   /* the size of the per-proposer stats */
} hearth_speculate;
/* "lookup", "none", "draft", "suffix", "mtp"; NULL for an unknown value. */
const char *hearth_speculate_name(int speculate);
/* The value of a name hearth_speculate_name gives; -1 for an unknown name. */
int hearth_speculate_parse(const char *name);

/* Loads the weights into resident memory and allocates the KV pool and all scratch
 * memory: nothing is allocated while generating. The model must outlive the engine. */
hearth_status hearth_engine_create(hearth_model *m, const hearth_engine_options *opts, hearth_engine **out,
                                   hearth_error *err);
/* Frees the engine and everything it allocated (NULL is fine). */
void hearth_engine_free(hearth_engine *e);
/* Bytes held by the engine: weights, KV pool, scratch, logits/history buffers, samplers. */
size_t hearth_engine_bytes(const hearth_engine *e);
/* The context length every sequence of the engine may reach, in tokens. */
int hearth_engine_context_length(const hearth_engine *e);
/* The worker threads the engine computes with (n_threads, or all cores when 0 was asked). */
int hearth_engine_threads(const hearth_engine *e);
/* The model's own context limit when the default context was cut from it to fit memory;
 * 0 when not cut (the context is the model's, or the one asked for). */
int hearth_engine_context_cut_from(const hearth_engine *e);
/* The KV pool's size in blocks of 16 positions. *cut_from (when not NULL): for the default
 * pool, the block count it was cut from to fit memory (every sequence's whole context),
 * else 0. */
int hearth_engine_kv_blocks(const hearth_engine *e, int *cut_from);
/* The KV blocks a request of n_prompt tokens generating up to max_tokens needs at worst
 * (its whole length, capped at the context): above hearth_engine_kv_blocks it can never
 * run, and the scheduler refuses it when its turn comes. */
int hearth_engine_kv_blocks_needed(const hearth_engine *e, size_t n_prompt, int max_tokens);
/* Measures the memory read bandwidth (GB/s) with the engine's threads: the decode
 * roofline for benchmarks. Takes about a second; allocates a temporary 1 GiB buffer.
 * On the GPU (hearth_engine_device == cuda): the device-to-device copy rate, bytes read
 * plus written, of two temporary 1 GiB device buffers. */
double hearth_engine_measure_bandwidth(hearth_engine *e);
/* Bytes one decode step reads with `context` tokens in the cache: every weight matrix
 * (the LM head in full, one embedding row) plus the keys and values attended to. */
double hearth_engine_decode_bytes(const hearth_engine *e, int context);

/* ---- fit: the memory contract ------------------------------------------ */

/* This process's memory and the machine's, in bytes; -1 where the system does not say
 * (Linux: /proc/self/status VmRSS and VmHWM, /proc/meminfo MemAvailable). */
typedef struct hearth_process_memory {
    long long resident_bytes;      /* resident now */
    long long peak_resident_bytes; /* the resident high-water mark: what fit predicts */
    long long available_bytes;     /* what the machine could still give without swapping */
} hearth_process_memory;
void hearth_process_memory_get(hearth_process_memory *out);

typedef struct hearth_fit_options {
    hearth_engine_options engine; /* the options hearth_engine_create would get */
    int measure_bandwidth;        /* 1: measure the read bandwidth (about a second, a 1 GiB buffer);
                                     else (and no bandwidth_gbs) hearth_machine_bandwidth's */
    double bandwidth_gbs;         /* > 0: use this bandwidth (GB/s) for the decode prediction */
    const char *sku;              /* a GPU of data/skus.json (any part of its name, e.g. "h200"):
                                     the --device cuda report for it instead of the local GPU
                                     (whatever engine.device says) */
} hearth_fit_options;

/* Predicts, without creating the engine, the memory hearth_engine_create(m, &o->engine)
 * would take (weights, KV pool, scratch, buffers, runtime overhead: each listed). With
 * engine.device cuda (or auto with a GPU present, or o->sku set) the report is the GPU's:
 * predicted_peak_bytes is device memory (weights as uploaded, device KV pool, scratch,
 * CUDA context and cuBLAS: data/cuda_runtime.json) and "host" the process's resident
 * memory; without a GPU here it needs o->sku. Otherwise
 * predicted_peak_bytes (the process's resident high-water mark once the engine exists),
 * whether it fits this machine's available memory, the largest context that would, and
 * decode tok/s from the bandwidth model. *report_json: a JSON object (free with
 * hearth_free). */
hearth_status hearth_fit(hearth_model *m, const hearth_fit_options *o, char **report_json, hearth_error *err);
/* hearth_fit carried over to the machines of data/skus.json (or $HEARTH_DATA/skus.json):
 * {"prediction": what the numbers mean, "skus": [{name, kind, memory_bytes, bandwidth_gbs,
 * predicted_bytes, fits, max_context_that_fits, decode_tok_s, source; GPU rows also
 * runtime_overhead_bytes and compute_capability: the --device cuda report for that GPU}],
 * "this_machine": the hearth_fit report}. Every row is a prediction. */
hearth_status hearth_fit_skus(hearth_model *m, const hearth_fit_options *o, char **report_json, hearth_error *err);

/* Low-level sequences: append tokens (prefill or one decode token) and read the logits
 * of the last n_logits positions (n_logits <= 8, or the engine's max_logits_rows) into
 * logits[n_logits * vocab].
 * hearth_seq_open takes a free sequence slot (fails when all max_sequences are held). */
hearth_status hearth_seq_open(hearth_engine *e, int *seq, hearth_error *err);
hearth_status hearth_seq_append(hearth_engine *e, int seq, const int32_t *tokens, size_t n, size_t n_logits,
                                float *logits, hearth_error *err);
/* hearth_seq_append for a greedy caller: *next gets the first index of the largest logit
 * after the last appended token (the sampler's greedy rule). On the GPU the choice is made
 * on the device and only the id leaves it (no logits row crosses PCIe). */
hearth_status hearth_seq_append_greedy(hearth_engine *e, int seq, const int32_t *tokens, size_t n, int32_t *next,
                                       hearth_error *err);
/* Releases the sequence's slot and KV blocks. */
void hearth_seq_close(hearth_engine *e, int seq);
int32_t hearth_model_vocab_rows(const hearth_engine *e); /* rows of the logits (may exceed the tokenizer's) */

#define HEARTH_MAX_TOP_LOGPROBS 20

typedef struct hearth_logprobs {
    float logprob;                           /* of the chosen token */
    int n;                                   /* requested alternatives (0..20) */
    int32_t top_ids[HEARTH_MAX_TOP_LOGPROBS];
    float top_logprobs[HEARTH_MAX_TOP_LOGPROBS];
} hearth_logprobs;

/* The sampling lab's stages (docs/lab.md). A transfer curve in log-probability space
 * replaces temperature: the sampler draws from softmax(curve(l)) where l are the step's
 * log-probabilities; points in nats, sorted by x, at least 2 (hearth_curve_set builds it
 * from the designer's percentages and rejects a non-monotone curve). */
#define HEARTH_CURVE_MAX_POINTS 32
typedef struct hearth_curve {
    int n_points; /* 0: off */
    double x[HEARTH_CURVE_MAX_POINTS], y[HEARTH_CURVE_MAX_POINTS];
} hearth_curve;
/* From percentages of probability (x_pct[i], y_pct[i] in (0, 100]; below 1e-9 counts as
 * 1e-9): sorts by x; fails (HEARTH_ERR_INVALID, the message names the point) on fewer
 * than 2 or more than HEARTH_CURVE_MAX_POINTS points, a value that is not finite or
 * above 100, two points with one x, or a falling segment. */
hearth_status hearth_curve_set(hearth_curve *c, const double *x_pct, const double *y_pct, int n, hearth_error *err);
/* The HLG tone curve on centred log-probabilities (seed's hlg-sampling; all in nats):
 * mid slope gain (0: 1/temperature), half-width, shoulder and toe roll-off scales (<= 0:
 * that side stays linear), pivot = the top log-probability minus pivot_offset. */
typedef struct hearth_hlg {
    int enabled;
    float width, shoulder, toe, pivot_offset, gain;
} hearth_hlg;

typedef struct hearth_sampling {
    float temperature;            /* 0: greedy */
    float top_p;                  /* 1 (or 0): off */
    int top_k;                    /* 0: off */
    float min_p;                  /* 0: off */
    float repetition_penalty;     /* 1 (or 0): off */
    int repetition_context_size;  /* the last N tokens the repetition penalty sees; 0: 20 (mlx-lm's default) */
    float presence_penalty, frequency_penalty;
    int presence_context_size;  /* the presence penalty's window; 0: repetition_context_size's */
    int frequency_context_size; /* the frequency penalty's window; 0: repetition_context_size's */
    int has_seed;
    uint64_t seed;
    const int32_t *bias_ids;      /* logit bias: add bias_values[i] to bias_ids[i] */
    const float *bias_values;
    size_t n_bias;
    int top_logprobs;             /* alternatives to report per token (0..20) */
    /* XTC (mlx-lm's apply_xtc): with probability xtc_probability per token, every
     * candidate above xtc_threshold except the least likely of them is dropped; the
     * newline token and end-of-sequence ids are never dropped. 0: off. */
    float xtc_probability, xtc_threshold;
    hearth_hlg hlg;     /* off unless enabled; replaces temperature (gain 1/temperature) */
    hearth_curve curve; /* off unless n_points; replaces temperature (and HLG) */
} hearth_sampling;

/* mlx-lm's defaults, overridden by the model's generation_config.json. */
void hearth_sampling_defaults(const hearth_model *m, hearth_sampling *s);

typedef enum hearth_finish {
    HEARTH_FINISH_NONE = 0,
    HEARTH_FINISH_EOS,         /* the model ended its turn ("stop") */
    HEARTH_FINISH_STOP_STRING, /* a stop string appeared ("stop") */
    HEARTH_FINISH_LENGTH,      /* max_tokens reached ("length") */
    HEARTH_FINISH_CONTEXT,     /* the context is full ("length") */
    HEARTH_FINISH_CANCELLED,   /* the callback asked to stop */
} hearth_finish;
const char *hearth_finish_name(hearth_finish f); /* OpenAI finish_reason */

/* A constraint on the output text (docs/constrained.md): only tokens that keep the text a
 * prefix of a sentence of the source are sampled, and the request ends when the sentence
 * is complete and nothing may follow. */
typedef enum hearth_constraint_kind {
    HEARTH_CONSTRAINT_NONE = 0,
    HEARTH_CONSTRAINT_JSON_SCHEMA, /* text: a JSON Schema document */
    HEARTH_CONSTRAINT_JSON_OBJECT, /* any JSON object; text ignored */
    HEARTH_CONSTRAINT_REGEX,       /* the whole output matches the pattern */
    HEARTH_CONSTRAINT_GBNF,        /* llama.cpp grammar, start rule "root" */
    /* A forced tool call (docs/constrained.md): text is {"alternatives": [[piece, ...],
     * ...]} with pieces {"text": s}, {"token": s} (the special token with text s, or s as
     * text) and {"schema": json schema}; the output is one alternative's pieces in order. */
    HEARTH_CONSTRAINT_TOOL_CALL,
} hearth_constraint_kind;

/* Compiles a constraint source without generating: HEARTH_OK, or an error (INVALID or
 * UNSUPPORTED) whose message names the problem (the keyword, the $ref, line:col). */
hearth_status hearth_constraint_check(hearth_constraint_kind kind, const char *text, size_t len, hearth_error *err);
/* Compiles a constraint for engine e's vocabulary and keeps it: requests with the same
 * (kind, text) then share it, and a caller that prepares a request's constraint on its own
 * thread spares the engine's step loop the compilation (the server does so for every
 * constrained request). The engine keeps the 32 most recently used. Any thread. */
hearth_status hearth_constraint_prepare(hearth_engine *e, hearth_constraint_kind kind, const char *text, size_t len,
                                        hearth_error *err);

typedef struct hearth_generate_params {
    hearth_sampling sampling;
    int max_tokens;            /* > 0 */
    const char *const *stop;   /* stop strings, never emitted */
    size_t n_stop;
    int ignore_eos;
    /* Optional: called during prefill with (tokens done, prompt tokens): 0/T first, then
     * after each prefill chunk (at most T-1), then T/T once the first token is sampled.
     * It receives the same `user` as on_token; nonzero cancels (finish CANCELLED). */
    int (*on_progress)(void *user, size_t done, size_t total);
    /* Drop one leading space from the first non-empty output text (mlx-lm's streaming
     * detokenizers trim it; the server does it, the CLI does not). */
    int trim_leading_space;
    /* Optional token-level stop sequences (mlx_lm.server semantics): generation ends
     * (finish STOP_STRING) when the generated ids end with one of them; the terminating
     * token's text and anything held back are not emitted. */
    const int32_t *const *stop_token_seqs;
    const size_t *stop_token_lens;
    size_t n_stop_token_seqs;
    /* Optional, hearth_model_vocab_rows floats: receives the log-softmax of the first
     * sampled position's logits (the sampling lab's next-token histogram). */
    float *first_logprobs;
    /* With a draft model (hearth_engine_options.draft_model) or HEARTH_SPEC_MTP, in a batch:
     * tokens it proposes per step (mlx_lm.server's num_draft_tokens; at most 8 are used); 0: none. */
    int num_draft_tokens;
    /* LoRA adapters (hearth_adapter_mount): "id", several summed ("a+b"), or "none" (the
     * base alone); NULL: the engine's default adapter (hearth_adapter_set_default), if any. */
    const char *adapter;
    /* Optional output constraint (HEARTH_CONSTRAINT_NONE: none); constraint_text holds
     * constraint_len bytes, valid for the request's life. A source that does not compile
     * fails the request (HEARTH_ERR_INVALID). */
    hearth_constraint_kind constraint;
    const char *constraint_text;
    size_t constraint_len;
} hearth_generate_params;

/* Called for each token with the text that became final (may be "", never a broken
 * UTF-8 sequence, never part of a stop string). Return nonzero to cancel. */
typedef int (*hearth_token_fn)(void *user, int32_t token, const char *text, const hearth_logprobs *lp);

typedef struct hearth_generate_result {
    hearth_finish finish;
    size_t prompt_tokens, completion_tokens;
    double prompt_seconds, generate_seconds, first_token_seconds;
    size_t cached_tokens; /* prompt tokens whose KV came from the prefix cache (batch only) */
} hearth_generate_result;

/* Generates from prompt[n_prompt] on a fresh sequence of the engine (closed at the end),
 * calling on_token (optional) for every sampled token; *result (optional) gets the counts, timings
 * and finish reason. Not while a hearth_batch of the same engine holds requests. */
hearth_status hearth_generate(hearth_engine *e, const int32_t *prompt, size_t n_prompt,
                              const hearth_generate_params *p, hearth_token_fn on_token, void *user,
                              hearth_generate_result *result, hearth_error *err);

/* Like hearth_generate, on an open sequence (hearth_seq_open) whose tokens, if any, are
 * a proper prefix of the prompt (e.g. loaded by hearth_seq_load): only the rest of the
 * prompt is prefilled (result->cached_tokens: the tokens it already held). The sequence
 * stays open afterwards holding the prompt and the generated tokens whose KV was
 * computed (every one but the last), ready for hearth_seq_save or hearth_seq_close. */
hearth_status hearth_generate_seq(hearth_engine *e, int seq, const int32_t *prompt, size_t n_prompt,
                                  const hearth_generate_params *p, hearth_token_fn on_token, void *user,
                                  hearth_generate_result *result, hearth_error *err);

/* ---- persistent KV -----------------------------------------------------------
 * A sequence's KV cache (and, for hybrid models, its recurrent state) saved to a file
 * and loaded back, so a long prompt is prefilled once across processes. The file
 * (docs/cli.md, "Saved KV files") is versioned, checksummed (header and data) and names
 * the model's identity (architecture, tensor catalog, samples of the weights) and the KV
 * format; a truncated, corrupted or mismatched file is refused with an error naming it,
 * and nothing of it is loaded. CPU engine only so far (UNSUPPORTED on the GPU). */

/* Tokens the open sequence holds (0 for a closed or unknown one). */
size_t hearth_seq_length(const hearth_engine *e, int seq);
/* Writes seq's tokens and KV to path (atomically: a temporary file renamed over it). */
hearth_status hearth_seq_save(hearth_engine *e, int seq, const char *path, hearth_error *err);
/* Maps path, checks it whole, and loads into the open, empty sequence seq: with prompt
 * NULL every saved token, else the longest common prefix of the saved tokens and
 * prompt[0..n_prompt), at most n_prompt - 1 tokens (the last prompt token's logits must
 * be computed; hearth_generate_seq does that). *n_loaded (optional): the tokens loaded
 * (0 when nothing matched; the file was still checked). */
hearth_status hearth_seq_load(hearth_engine *e, int seq, const char *path, const int32_t *prompt, size_t n_prompt,
                              size_t *n_loaded, hearth_error *err);

/* ---- LoRA adapters -------------------------------------------------------
 * An engine holds any number of mounted adapters; each request picks its own
 * (hearth_generate_params.adapter), and one step mixes rows of different adapters and of
 * none (a row without one computes exactly as the base). Adapter folders: MLX
 * (adapters.safetensors + adapter_config.json as mlx_lm.lora writes) or PEFT
 * (adapter_model.safetensors + adapter_config.json), LoRA or DoRA, on the attention and MLP
 * projections. CPU engines only for now. All of these may be called from any thread. */

/* Reads the adapter folder at path and mounts it under id (letters, digits, '-', '_', '.').
 * All or nothing: a mismatch with the model (rank, target modules, layers, base shapes)
 * fails naming it (HEARTH_ERR_INVALID / UNSUPPORTED / FORMAT / IO) and mounts nothing. */
hearth_status hearth_adapter_mount(hearth_engine *e, const char *id, const char *path, hearth_error *err);
/* Unmounts id (HEARTH_ERR_NOT_FOUND if absent); requests already using it finish with it. */
hearth_status hearth_adapter_unmount(hearth_engine *e, const char *id, hearth_error *err);
/* The adapter of requests whose adapter is NULL (id NULL: none, the base). */
hearth_status hearth_adapter_set_default(hearth_engine *e, const char *id, hearth_error *err);
/* Whether an adapter spec ("id", "a+b", "none", NULL) names mounted adapters (NOT_FOUND if not). */
hearth_status hearth_adapter_check(hearth_engine *e, const char *spec, hearth_error *err);
/* The id of the mounted adapter whose id or path is name (what a gateway sends as `model`,
 * or mlx_lm.server's `adapters` path), into id (cap bytes); HEARTH_ERR_NOT_FOUND if none. */
hearth_status hearth_adapter_find(hearth_engine *e, const char *name, char *id, size_t cap, hearth_error *err);
/* Whether the folder at path holds an adapter this engine's model could mount (loads it and
 * lets it go). */
hearth_status hearth_adapter_probe(hearth_engine *e, const char *path, hearth_error *err);
/* The adapters an open low-level sequence (hearth_seq_open) computes with from now on: a
 * spec as hearth_generate_params.adapter (NULL: the default adapter). Before its first
 * append, so its whole KV is computed with them. */
hearth_status hearth_seq_set_adapter(hearth_engine *e, int seq, const char *spec, hearth_error *err);
/* The mounted adapters as a JSON array of {id, path, format ("mlx"|"peft"), type
 * ("lora"|"dora"), rank, scale, size_bytes, layers, modules, default} (free with hearth_free). */
char *hearth_adapters_json(hearth_engine *e);

/* Folds the LoRA adapter in folder adapter_path into model (a safetensors folder, float or
 * MLX-quantized) and writes the result as a new folder save_path, as mlx_lm.fuse does: each
 * adapted projection W + scale * B A in W's dtype; a quantized weight is dequantized, summed
 * and quantized again with its own bits and group size. Every other file and tensor is
 * copied. DoRA adapters and GGUF bases are refused (HEARTH_ERR_UNSUPPORTED). */
hearth_status hearth_fuse(const char *model, const char *adapter_path, const char *save_path, hearth_error *err);

/* ---- training ------------------------------------------------------------ */

/* hearth train: LoRA fine-tuning on the CPU in float32: supervised (sft, following
 * mlx_lm.lora: its flags, defaults, data formats, batching and data order, Adam, adapter
 * files) or on preference pairs (dpo, orpo: the losses of TRL's DPOTrainer and
 * ORPOTrainer, the same data order and Adam). */
#define HEARTH_TRAIN_MAX_KEYS 32
typedef struct hearth_train_options {
    const char *data;                /* folder with train.jsonl (valid.jsonl optional) */
    const char *method;              /* "sft", "dpo" or "orpo"; NULL: orpo for preference data, else sft */
    const char *adapter_path;        /* output folder (NULL: "adapters") */
    const char *resume_adapter_file; /* initial LoRA weights (safetensors) or NULL */
    /* 0 (learning_rate, lora_scale: < 0): the method's default (hearth_train_defaults) */
    int iters, batch_size, lora_rank, num_layers, max_seq_length;
    int steps_per_report, steps_per_eval, save_every, val_batches;
    int mask_prompt;                 /* 1: the prompt's tokens are not targets (sft) */
    int dora;                        /* 1: DoRA (mlx-lm's fine_tune_type dora): a trained magnitude per output */
    int threads;                     /* 0: every core */
    double learning_rate, lora_scale;
    double beta;                     /* dpo: the sigmoid loss's beta (0.1) */
    double orpo_lambda;              /* orpo: the odds-ratio term's weight (0.1) */
    unsigned long long seed;
    /* mlx_lm.lora's optimizers as MLX has them (no bias correction): "adam" (NULL), "adamw"
     * (weight decay applied to the parameter first), "sgd" (weight decay added to the
     * gradient, no momentum), "muon" (momentum 0.95, Nesterov, Newton-Schulz orthogonalized
     * updates) or "adafactor" (relative steps: learning_rate unused, as in mlx-lm);
     * weight_decay < 0: the optimizer's default (adamw and muon 0.01, else 0) */
    const char *optimizer;
    double weight_decay;
    int grad_accumulation_steps; /* gradients summed over this many batches, averaged, then one update (0: 1) */
    int grad_checkpoint;         /* 1: keep only each LoRA layer's input, recompute the layer in the backward */
    /* mlx-lm's lr_schedule (MLX's schedulers, indexed by the update count from 0): NULL (a
     * constant learning_rate), "cosine_decay" (init, decay_steps[, end]), "linear_schedule"
     * (init, end, steps), "exponential_decay" (init, decay_rate) or "step_decay" (init,
     * decay_rate, step_size); with warmup > 0 steps first rising linearly from warmup_init
     * to the schedule's init. The schedule's init replaces learning_rate. */
    const char *lr_schedule;
    double lr_schedule_args[3];
    int n_lr_schedule_args;
    int warmup;
    double warmup_init;
    /* 1: continue the run in adapter_path from its resume.bin (written with every checkpoint
     * and at the end: the LoRA tensors, their gradients, the optimizer state, the data order
     * and the step), to iters; the run's settings must be the same. metrics.jsonl is appended to. */
    int resume;
    /* called with each metrics.jsonl line as it is written (NULL: none) */
    void (*on_metrics)(void *ctx, const char *json_line);
    void *ctx;
    /* mlx_lm.lora's lora_parameters.keys: the module paths inside a layer to adapt
     * ("self_attn.q_proj", "mlp.switch_mlp.up_proj", ...; n_lora_keys 0: its default, every
     * linear layer of the block); keys naming no module of the model are ignored, as mlx-lm
     * does, but one of them must match */
    const char *lora_keys[HEARTH_TRAIN_MAX_KEYS];
    int n_lora_keys;
} hearth_train_options;
/* Method defaults, resolved once the method is known: sft takes mlx_lm.lora 0.32.2's (iters
 * 1000, batch 4, lr 1e-5, rank 8, scale 20, sequences 2048); dpo and orpo the seed
 * product's (iters 100, batch 1, lr dpo 5e-5 / orpo 1e-5, rank dpo 8 / orpo 16, scale dpo
 * 1 / orpo 2, sequences 4096). Both: 16 layers, seed 0, beta and lambda 0.1. */
void hearth_train_defaults(hearth_train_options *o);
/* Trains LoRA adapters on the attention and MLP projections of the last num_layers layers
 * (-1: all) of model (llama, qwen3 or minicpm family; float or quantized base, dequantized to
 * float32) and writes adapter_path/adapters.safetensors, adapter_config.json (loadable by
 * hearth serve --adapter-path and mlx-lm), the same adapter in PEFT's format in
 * adapter_path/peft/, checkpoints every save_every steps and metrics.jsonl (its last line
 * {"done": true, ...}, with "error" when saving failed). */
hearth_status hearth_train(const char *model, const hearth_train_options *o, hearth_error *err);
/* Predicts, without loading the weights or allocating the trainer, the peak resident
 * memory hearth_train(model, o) would reach: the process as it is (with o->data read, as
 * training reads it), the weights as loaded, their float32 copies (a quantized base), the
 * LoRA tensors and their gradients, Adam's state, the activations kept for the backward,
 * the step's buffers and the GEMM packing workspace, for the sequence length training
 * sizes everything for (with o->data: its longest example or response, cut to
 * max_seq_length; without: max_seq_length). *report_json: a JSON object (hearth_free):
 * predicted_peak_bytes, each part, the settings it assumed, available_bytes and fits. */
hearth_status hearth_train_fit(const char *model, const hearth_train_options *o, char **report_json,
                               hearth_error *err);
/* What one line of metrics.jsonl is (len bytes, without its newline): a training report (a
 * JSON object with a numeric "step" and "loss"), a validation report ("step" and
 * "val_loss"), the final record ("step" and "done": true), or none of them. The one rule
 * hearth train-watch and the server's training view read the file by. */
typedef enum hearth_train_record {
    HEARTH_TRAIN_RECORD_NONE = 0,
    HEARTH_TRAIN_RECORD_TRAIN,
    HEARTH_TRAIN_RECORD_VAL,
    HEARTH_TRAIN_RECORD_FINAL,
} hearth_train_record;
hearth_train_record hearth_train_record_kind(const char *line, size_t len);

/* ---- continuous batching ---------------------------------------------------
 * A batch runs many requests on one engine, one step at a time: each step packs the
 * next token of every decoding request and chunks of waiting prompts (up to the
 * engine's max_step_tokens) into one forward pass, then samples every row with its own
 * parameters. Requests join at the next step and leave as soon as they finish. A
 * request is admitted (FIFO) only when a sequence slot is free and the KV pool can
 * hold its prompt (less its cached prefix); a request that outgrows the pool while
 * decoding preempts the youngest one (recomputed later, its output continuing where it
 * stopped). All calls on one thread (the one that owns the engine);
 * the engine must not run hearth_generate while the batch holds requests. */
typedef struct hearth_batch hearth_batch;

typedef struct hearth_batch_request {
    const int32_t *prompt;                 /* valid until on_done */
    size_t n_prompt;
    const hearth_generate_params *params;  /* valid until on_done; on_progress is honoured */
    hearth_token_fn on_token;
    int (*is_cancelled)(void *user);       /* optional: polled before every step */
    /* Called once when the request ends (finished, cancelled or failed); *result is final. */
    void (*on_done)(void *user, hearth_status status, const hearth_error *err);
    hearth_generate_result *result;        /* caller-owned; finish is set before on_token */
    void *user;
} hearth_batch_request;

/* A batch on engine e, which must outlive it. */
hearth_status hearth_batch_create(hearth_engine *e, hearth_batch **out, hearth_error *err);
/* Ends every request still held as cancelled (calling on_done), then frees. */
void hearth_batch_free(hearth_batch *b);
/* Queues a request; an invalid one (empty prompt, max_tokens < 1, prompt too long for
 * the context) fails here and on_done is never called. */
hearth_status hearth_batch_submit(hearth_batch *b, const hearth_batch_request *r, hearth_error *err);
/* Runs one step (admission, one forward pass, sampling); returns the requests still
 * held, waiting or running. A failing forward pass fails the requests in it. */
size_t hearth_batch_step(hearth_batch *b);
/* Requests submitted but not yet admitted (no prefill done). */
size_t hearth_batch_waiting(const hearth_batch *b);
/* Requests admitted and not finished (prefilling or decoding). */
size_t hearth_batch_running(const hearth_batch *b);

/* A snapshot of the batch for monitoring (/stats): taken by the thread that steps it. */
#define HEARTH_STATS_MAX_QUEUED 32
typedef struct hearth_batch_stats {
    size_t running, waiting;
    size_t n_queued;                                  /* entries below: the first waiting, FIFO */
    double queued_since[HEARTH_STATS_MAX_QUEUED];     /* CLOCK_MONOTONIC seconds at submit */
    size_t queued_prompt_tokens[HEARTH_STATS_MAX_QUEUED];
    int kv_blocks, kv_blocks_used, kv_blocks_free, kv_blocks_cached; /* used: held by requests */
    unsigned long long prompt_tokens, cached_tokens;  /* over every admitted request */
    unsigned long long requests_done, steps, preemptions;
    double last_step_seconds;
    int last_step_tokens;
    double decode_tok_s, prefill_tok_s;               /* over the last steps (a moving window) */
    /* speculative decoding, per proposer (hearth_speculate: lookup, draft, suffix): tokens
       proposed and, of those, accepted (emitted without a step of their own) */
    unsigned long long spec_proposed[HEARTH_SPEC_KINDS], spec_accepted[HEARTH_SPEC_KINDS];
    /* verified proposals (steps of one request that carried any), and those of them that
     * a rejection ended (not fully accepted, the request not finished) */
    unsigned long long spec_drafts[HEARTH_SPEC_KINDS], spec_rejected[HEARTH_SPEC_KINDS];
} hearth_batch_stats;
void hearth_batch_stats_get(const hearth_batch *b, hearth_batch_stats *out);

/* The batch's prefix cache kept in a folder across restarts (`serve --prompt-cache-dir`):
 * now, every saved KV file in dir (created if missing) is loaded into the KV pool as
 * cached blocks, newest first, while the pool has free blocks (a refused file, e.g. one
 * made with another model, is counted in the report and left alone); from then on the
 * token history of every request that ends is noted (in memory, no disk work while
 * stepping), and when the batch is freed (`serve` stopping on SIGINT/SIGTERM) what the
 * pool still holds of each noted history is saved there (one file per history; the file
 * of a history that a newer one continues is removed) and the oldest files are deleted
 * past max_bytes. A process that is killed saves nothing new. Use one folder per model.
 * CPU engine only so far. */
typedef struct hearth_prompt_cache_report {
    size_t files_loaded, tokens_loaded;
    size_t files_refused;   /* not loaded: damaged, or another model's or KV format's */
    size_t files_skipped;   /* not loaded: the pool had no free blocks left for them */
    char first_refusal[512]; /* why the first refused file was refused */
} hearth_prompt_cache_report;
hearth_status hearth_batch_prompt_cache(hearth_batch *b, const char *dir, long long max_bytes,
                                        hearth_prompt_cache_report *report, hearth_error *err);

/* ---- the model library: hub downloads, listing, removal, evals --------- */

/* Progress of one file of a pull: called as bytes arrive (at most ~10 times a second). */
typedef void (*hearth_pull_progress_fn)(void *user, const char *file, long long done, long long total);

typedef struct hearth_pull_options {
    const char *const *include; /* glob patterns of repo files to fetch; NULL/0: all */
    size_t n_include;
    const char *const *exclude;
    size_t n_exclude;
    const char *endpoint; /* NULL: $HF_ENDPOINT or https://huggingface.co */
    const char *token;    /* NULL: $HF_TOKEN (sent as Authorization: Bearer) */
    hearth_pull_progress_fn on_progress; /* NULL: silent */
    void *user;
} hearth_pull_options;

/* Downloads org/name[@revision] from the Hugging Face hub into the HF cache layout
 * ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub: blobs/<etag>,
 * snapshots/<commit>/<file> -> ../../blobs/<etag>, refs/<revision>), resuming
 * blobs/<etag>.incomplete with Range requests and verifying sizes and hashes (sha256
 * for LFS files, the git blob sha1 otherwise). *snapshot_dir (optional, hearth_free)
 * receives the snapshot folder. */
hearth_status hearth_pull(const char *repo_arg, const hearth_pull_options *o, char **snapshot_dir, hearth_error *err);

typedef struct hearth_upload_options {
    const char *endpoint; /* NULL: $HF_ENDPOINT or https://huggingface.co */
    const char *token;    /* NULL: $HF_TOKEN (a write token; required) */
    const char *revision; /* branch to commit to; NULL: the repo argument's @revision, else "main" */
    const char *message;  /* commit summary; NULL: "Upload N files with hearth" */
    int private_repo;     /* 1: a repo that does not exist yet is created private */
    hearth_pull_progress_fn on_progress; /* per LFS file: bytes sent of its size; NULL: silent */
    void *user;
} hearth_upload_options;

/* Uploads every file under dir (links followed; .git/ and .cache/huggingface/ left out) to
 * the hub repo org/name[@revision] in one commit: creates the repo when missing, sends
 * large files through LFS (sha256 oids; basic or multipart, as the hub answers), others
 * inline. LFS objects the hub already holds are not sent again, so running it again after
 * an interruption resumes. *commit_url (optional, hearth_free) receives the commit's URL. */
hearth_status hearth_upload(const char *dir, const char *repo_arg, const hearth_upload_options *o, char **commit_url,
                            hearth_error *err);

/* Starts hearth_pull(repo_arg, only files matching include when not NULL) on a
 * background thread of this process (no progress
 * output); hearth_downloads_json lists those in progress and finished:
 * [{"model", "state": "downloading"|"done"|"failed", "file", "done_bytes",
 * "total_bytes", "error"?}]. */
hearth_status hearth_download_start(const char *repo_arg, const char *include, hearth_error *err);
char *hearth_downloads_json(void);

typedef struct hearth_library_options {
    long long max_size_bytes; /* > 0: only models at most this size on disk */
    const char *family;       /* non-NULL: only this architecture family (e.g. "llama", "qwen3") */
} hearth_library_options;

/* "10GB", "512MiB", "1.5G", "1000" -> bytes; -1 when malformed. Decimal units (kB/KB, MB,
 * GB, TB) are powers of 1000, binary ones (KiB, ...; K/M/G/T alone) powers of 1024. */
long long hearth_parse_size(const char *s);

/* Every model hearth can find, with size on disk, parameters, quantization, context
 * length, capabilities and whether it fits this machine, as a JSON array (hearth_free). */
char *hearth_library_json(const hearth_library_options *o);

/* Removes a model from the HF cache: the snapshot(s) of org/name[@revision], the refs
 * naming them, and every blob no remaining snapshot links to. dry_run: only report.
 * *report_json: {"model", "repo_dir", "snapshots": [...], "blobs": n, "freed_bytes"}. */
hearth_status hearth_rm(const char *model, int dry_run, char **report_json, hearth_error *err);

/* The appliance's choice (data/catalogue.json against this machine): the best catalogue
 * model that fits and decodes at a readable speed and is on disk now, else the `make run`
 * default; plus the best suitable one when it is not on disk (for a background pull).
 * Reads the bandwidth with hearth_machine_bandwidth (a stable figure per machine); never
 * touches the network. */
typedef struct hearth_choice {
    char model[4096];       /* what to serve: a model path */
    char name[256];         /* its catalogue name */
    char machine[512];      /* what was detected, one line */
    char better[256];       /* hub id of a better suitable model not on disk, or "" */
    char better_include[128]; /* its --include pattern, or "" */
    char better_name[256];
    double better_bytes;    /* its download size (the catalogue's approx_bytes) */
} hearth_choice;
hearth_status hearth_choose_model(hearth_choice *c, hearth_error *err);

/* The evals database ($HEARTH_CACHE/evals.sqlite, schema in docs/cli.md): one row per
 * fit check or benchmark. measured_peak_bytes / tok_s < 0 mean "not measured". */
typedef struct hearth_eval_row {
    const char *kind;  /* "fit", "fit-check", "bench" */
    const char *model;
    int context;
    long long predicted_peak_bytes;
    long long measured_peak_bytes;
    double tok_s;
    const char *details_json; /* NULL or a JSON object kept as text */
} hearth_eval_row;
/* Appends one row to the evals database. */
hearth_status hearth_evals_record(const hearth_eval_row *row, hearth_error *err);
/* All rows, newest first, as a JSON array (hearth_free). */
hearth_status hearth_evals_json(char **out_json, hearth_error *err);
/* This machine's memory read bandwidth (GB/s) for predictions: the newest one the evals
 * database holds (a CPU `hearth bench` run, else an earlier probe), else a quick probe
 * (256 MiB, about 0.1 s) that is recorded there (kind "probe"), so every later call on
 * this machine gives the same figure. source: where it came from, e.g. "hearth bench
 * 2026-12-04T22:10:00Z", "probe 2026-...", "probe now (recorded in the evals db)". */
hearth_status hearth_machine_bandwidth(double *gbs, char *source, size_t cap, hearth_error *err);

/* ---- convert ----------------------------------------------------------------
 * A float safetensors model folder (F32/F16/BF16) to a new MLX folder: with quantize, every
 * Linear/Embedding weight whose input width is a multiple of group_size becomes MLX affine
 * (weight/scales/biases bit-identical to mlx_lm.convert -q), the rest is copied; config.json
 * gets its "quantization" section; tokenizer, chat template and other side files are
 * copied. Streams one tensor at a time (memory: the largest tensor, about 3x). */
typedef struct hearth_convert_options {
    const char *out_dir; /* must not exist yet */
    int quantize;        /* 1: MLX affine; 0: copy the float weights */
    int bits;            /* 2, 3, 4, 5, 6 or 8 */
    int group_size;      /* 32, 64 or 128 */
    /* NULL, or one of mlx_lm.convert's --quant-predicate recipes (mixed_2_6, mixed_3_4,
     * mixed_3_6, mixed_4_6): per-module widths, each recorded in config.json */
    const char *quant_recipe;
    /* NULL, or (with quantize, no recipe) each module's width by its path, e.g.
     * "model.layers.3.mlp.down_proj" (0: keep it float), and optionally its group size
     * (*group_size comes set to group_size; 32, 64 or 128); recorded in config.json */
    int (*choose_bits)(void *choose_user, const char *module, int *group_size);
    void *choose_user;
    /* 1: each group's scale and bias chosen to minimise the group's squared error
     * (mlxq_quantize_fit) instead of mx.quantize's min/max rule: same format, not
     * bit-identical to mlx_lm.convert. --target-bpw sets it; plain -q does not. */
    int fit_scales;
    /* NULL: the MLX folder above. Else out_dir is one GGUF file, 2-D weights in this type
     * (llama.cpp's names: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1; bytes as the gguf
     * package's quantizers; or the file types q6_k, q4_k_m: each weight's type and bytes as
     * llama.cpp's llama_model_quantize gives them), the rest F32; qwen3 and llama so far. */
    const char *gguf_type;
    int n_threads; /* GGUF output: threads quantizing each tensor; 0: all cores */
    /* called after each input tensor is written (NULL: no progress) */
    void (*progress)(void *user, size_t done, size_t total, const char *tensor);
    void *user;
} hearth_convert_options;
hearth_status hearth_convert(const char *model, const hearth_convert_options *o, hearth_error *err);
/* Weight trials, for measuring what a quantization does without writing the model: the
 * weights hearth_convert(o) would quantize (o's bits, group_size, fit_scales, quant_recipe
 * or choose_bits; quantize and gguf_type are ignored) are quantized to exactly the bytes it
 * would write and put in place of the engine's loaded float weights, so the engine's next
 * passes compute what the converted model computes. The engine's model must be a float
 * safetensors folder, run on the CPU (--device cpu); restore puts the float weights back
 * (hearth_engine_free does too). On failure nothing stays swapped. */
hearth_status hearth_engine_quantize_weights(hearth_engine *e, const hearth_convert_options *o, hearth_error *err);
void hearth_engine_restore_weights(hearth_engine *e);

/* ---- embeddings ------------------------------------------------------------
 * An embedder turns inputs into vectors: BERT-family encoders (the pooling and
 * normalization their sentence-transformers files ask for; mean + L2 when they have
 * none) and decoder embedding models (Qwen3-Embedding style: a decoder whose
 * sentence-transformers Pooling module asks for last-token pooling). It owns its
 * weights, scratch and threads: independent of any generation engine. Not thread-safe:
 * one call at a time per embedder. */
typedef struct hearth_embedder hearth_embedder;

typedef struct hearth_embedder_options {
    int n_threads;        /* 0: all cores */
    int max_batch_tokens; /* tokens per forward pass (inputs are packed up to it); 0: 2048 */
} hearth_embedder_options;

/* 1 when the model is an embedding model (an encoder, or a decoder with a
 * sentence-transformers pooling config): it cannot generate text. */
int hearth_model_is_embedding(const hearth_model *m);
/* Fails (HEARTH_ERR_UNSUPPORTED) for a model that is not an embedding model. */
hearth_status hearth_embedder_create(hearth_model *m, const hearth_embedder_options *o, hearth_embedder **out,
                                     hearth_error *err);
/* Frees the embedder (NULL is fine). */
void hearth_embedder_free(hearth_embedder *e);
/* The length of each vector hearth_embed writes. */
int hearth_embedder_dim(const hearth_embedder *e);
/* The longest input in tokens, specials included (sentence_bert_config.json's
 * max_seq_length, else the model's positions; at most max_batch_tokens). */
int hearth_embedder_max_tokens(const hearth_embedder *e);
const char *hearth_embedder_pooling(const hearth_embedder *e); /* "mean", "cls" or "last" */
int hearth_embedder_normalizes(const hearth_embedder *e);      /* 1: vectors are L2-normalized */
/* Tokenizes one text as the model expects (its special tokens added). A text longer
 * than hearth_embedder_max_tokens fails (HEARTH_ERR_INVALID) unless truncate is set,
 * which keeps the leading tokens and the trailing special tokens as sentence-transformers
 * does. *ids: caller frees with hearth_free. */
hearth_status hearth_embed_tokenize(const hearth_embedder *e, const char *text, size_t len, int truncate,
                                    int32_t **ids, size_t *n_ids, hearth_error *err);
/* Embeds n_inputs token sequences (inputs[i] of lens[i] ids, 1..max_tokens each) into
 * out[n_inputs * dim]. Inputs are packed into ragged batches; each attends only to
 * itself, so a vector does not depend on what else is in the call. */
hearth_status hearth_embed(hearth_embedder *e, const int32_t *const *inputs, const size_t *lens, size_t n_inputs,
                           float *out, hearth_error *err);


/* ---- personal memory: a git-tracked Markdown wiki ------------------------
 * The vault is a folder that is a git repository (written through libgit2) of Markdown:
 * articles/ (the user's memory: front matter, [[wikilinks]], footnote citations),
 * Conversations/ (imported and logged conversations, one heading per message), Notes/
 * (imported Markdown and text), Reference/ (hearth's own docs, read-only), Meta/ (index,
 * log) and Talk/. A derived SQLite index (<vault>/.hearth/index.sqlite: FTS5 BM25 plus
 * embedding vectors) is brought up to date on open and rebuilt at will. docs/memory.md. */
typedef struct hearth_memory hearth_memory;

typedef struct hearth_memory_options {
    const char *path;        /* NULL: $HEARTH_WIKI, else $XDG_DATA_HOME/hearth/wiki (~/.local/share/...) */
    const char *embed_model; /* an embedding model (hearth_model_open name) for hybrid search; NULL: BM25 only */
    int n_threads;           /* for the embedder; 0: all cores */
} hearth_memory_options;

/* The vault folder o (or the defaults) names; hearth_free. */
char *hearth_memory_path(const hearth_memory_options *o);
/* Creates the vault (git init, folders, Reference/ from the embedded docs, a first
 * commit) or refreshes Reference/ in an existing one; idempotent (no commit when nothing
 * changed). Refuses a vault with problems (see memory_status). *report_json (optional,
 * hearth_free): {"path", "created", "committed", "reference"}. */
hearth_status hearth_memory_init(const hearth_memory_options *o, char **report_json, hearth_error *err);
/* Opens an existing vault and brings its index up to date (HEARTH_ERR_NOT_FOUND when
 * there is none: run init). */
hearth_status hearth_memory_open(const hearth_memory_options *o, hearth_memory **out, hearth_error *err);
void hearth_memory_close(hearth_memory *m);
/* The read-only tools as a JSON array of {"name", "description", "inputSchema"} (MCP's
 * tools/list shape; static, do not free): memory_status, memory_list, memory_search,
 * memory_read, memory_toc, memory_section, memory_links. */
const char *hearth_memory_tools_json(void);
/* Runs one tool with its arguments (a JSON object text, NULL for none); *result_json
 * (hearth_free) is the tool's JSON result. Unknown tools fail with HEARTH_ERR_NOT_FOUND;
 * the tools never write the vault. */
hearth_status hearth_memory_call(hearth_memory *m, const char *tool, const char *args_json, char **result_json,
                                 hearth_error *err);
/* Imports a file or folder: a ChatGPT export (conversations.json), a Claude export
 * (conversations.json), Markdown/text files (a folder is walked). Conversations go to
 * Conversations/<content hash>.md, skipped when already there; notes to Notes/. One
 * commit when anything was added; the index is updated at once. *report_json:
 * {"conversations", "notes", "skipped", "committed"}. */
hearth_status hearth_memory_import(hearth_memory *m, const char *path, char **report_json, hearth_error *err);
/* Logs one conversation (a JSON array of {"role", "content": string} messages, the answer
 * last) as Conversations/<hash>.md and commits it (`serve --memory-log`); the file of the
 * same chat one turn earlier (these messages but the last two) is replaced, so a chat is
 * one file. System messages are not stored. Not thread-safe: one call at a time. */
hearth_status hearth_memory_log_conversation(hearth_memory *m, const char *messages_json, const char *source,
                                             hearth_error *err);
/* Synthesis: the local model turns conversations into articles, in stages: segment
 * (topic chunks of each new conversation), extract (durable facts with citations to
 * their messages; secrets dropped), route (each fact to an existing or new article),
 * synthesize (the article rewritten with its new facts, kept only when it passes the gate:
 * at least 70% of the old prose and every old citation kept, no secrets; otherwise a
 * note on its Talk/ page), link (no dangling [[links]], Meta/index.md's article list),
 * then one commit. Progress lives in the index database, so a killed run resumes where
 * it stopped; a run with nothing new makes no commit. The model is a callback: given a
 * stage name, a prompt (instructions, then "INPUT:" and a JSON object) and the JSON Schema
 * its answer must satisfy (a runner that can should decode under it: constraint
 * HEARTH_CONSTRAINT_JSON_SCHEMA), it writes its answer (JSON) into *answer (malloc'd; the
 * library frees it) and returns 0, else nonzero to stop the run (nothing is committed). */
typedef int (*hearth_memory_llm_fn)(void *user, const char *stage, const char *prompt, const char *schema,
                                    char **answer);
typedef struct hearth_memory_synth_options {
    const char *stage; /* NULL: every stage and the commit; else "segment", "extract", "route",
                        * "synthesize" (the stages' own work only) or "link" (link and commit) */
    const char *since; /* NULL, or "YYYY-MM-DD" or "YYYY-MM-DDTHH:MM" (UTC): only conversations
                        * created then or later; anything else is HEARTH_ERR_INVALID */
    int limit;         /* > 0: at most this many items per stage */
    int dry_run;       /* report the work each stage has, call nothing, write nothing */
    hearth_memory_llm_fn llm;
    void *user;
} hearth_memory_synth_options;
/* *report_json: {"segment": n, "extract": n, "route": n, "synthesize": n, "articles": [...],
 * "rejected": n, "committed": bool} (with dry_run: the work waiting at each stage). */
hearth_status hearth_memory_synthesize(hearth_memory *m, const hearth_memory_synth_options *o, char **report_json,
                                       hearth_error *err);
/* Drops the index and rebuilds it from the vault's files (vectors of unchanged text are
 * kept). *report_json: {"documents", "chunks", "seconds"}. */
hearth_status hearth_memory_reindex(hearth_memory *m, char **report_json, hearth_error *err);
/* What synthesis changed: the last `limit` (1..HEARTH_MEMORY_CHANGES_MAX) synthesis commits
 * on HEAD's first-parent line, newest first, each diffed against its parent (libgit2, no
 * context lines). *changes_json: [{"commit", "time" (UTC ISO 8601), "message" (the commit's
 * first line), "files": [{"path", "kind", "status" (added|modified|deleted|renamed),
 * "added", "removed" (line counts), "lines": [{"op": "+"|"-", "text"}] (at most 400 a file),
 * "truncated"}]}]; [] before the first synthesis. Reads the repository only. */
#define HEARTH_MEMORY_CHANGES_MAX 20
hearth_status hearth_memory_changes(hearth_memory *m, int limit, char **changes_json, hearth_error *err);

#ifdef __cplusplus
}
#endif
#endif
