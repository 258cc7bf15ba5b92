/* fuzz_train_resume.c: hearth train --resume's reader of resume.bin (resume_load in
 * src/train/train.c, compiled in here with a small trainer: two layers, the upper one with
 * rank-1 LoRA pairs on 2x2 projections, Adam) on arbitrary file contents. A file it accepts
 * must leave a state training can index with: the step below --iters, the position within
 * the batches, the generator's index and every entry of the data order in range. Anything
 * else must be refused with a message naming the file. Nothing may crash, hang or leak.
 * FUZZ_WRITE_SEED=DIR writes a valid resume.bin into DIR (the seed) and exits. */
#include "../../src/train/train.c"
#include <stdint.h>

enum { NB = 5 };
static trainer T;
static hearth_train_options O;
static char dir[64];
static float *buf;

static void setup(void) {
    T.L = 2, T.first_lora = 1, T.r = 1, T.opt = OPT_ADAM;
    T.layers = calloc(2, sizeof *T.layers);
    T.n_params = N_P * 4; /* a [2,1] and b [1,2] per projection */
    buf = calloc(T.n_params * 4, sizeof(float));
    for (int p = 0; p < N_P; p++) {
        tlayer *y = &T.layers[1];
        y->k[p] = y->n[p] = 2;
        y->lora[p] = (tr_lora){.a = buf + p * 8, .b = buf + p * 8 + 2, .ga = buf + p * 8 + 4, .gb = buf + p * 8 + 6};
    }
    T.adam_m = buf + N_P * 8, T.adam_v = T.adam_m + T.n_params;
    hearth_train_defaults(&O);
    O.data = "d", O.method = "sft", O.optimizer = "adam", O.iters = 10, O.batch_size = 2, O.lora_rank = 1;
    O.max_seq_length = 64, O.lora_scale = 20, O.weight_decay = 0;
}

static void cleanup(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/resume.bin", dir);
    remove(path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setup();
    const char *seed = getenv("FUZZ_WRITE_SEED");
    if (seed) {
        tr_mt rng;
        tr_mt_seed(&rng, 3);
        int perm[NB] = {4, 2, 0, 1, 3};
        resume_point rp = {.it = 4, .pos = 2, .updates = 4, .n_tokens = 100, .trained = 400, .losses = 9.5, .steps = 4};
        hearth_error err = {0};
        if (resume_save(&T, "m", &O, seed, &rp, &rng, perm, NB, &err)) fprintf(stderr, "%s\n", err.message);
        exit(0);
    }
    snprintf(dir, sizeof dir, "/tmp/fuzz_train_resume.%d", (int)getpid());
    mkdir(dir, 0700);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/resume.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    resume_point rp;
    tr_mt rng;
    int perm[NB];
    hearth_error err = {0};
    hearth_status st = resume_load(&T, "m", &O, dir, &rp, &rng, perm, NB, &err);
    if (st) {
        if (!strstr(err.message, "resume.bin")) abort();
        return 0;
    }
    if (rp.it < 0 || rp.it >= O.iters || rp.pos < 0 || rp.pos > NB || rng.i < 0 || rng.i > 624) abort();
    for (int i = 0; i < NB; i++)
        if (perm[i] < 0 || perm[i] >= NB) abort();
    for (int i = 0; i < 700; i++) tr_mt_u32(&rng); /* the generator runs from the restored index */
    return 0;
}
