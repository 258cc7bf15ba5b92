/* main.c: the hearth command line: dispatches to one function per verb (src/cli/).
 * Uses only include/hearth.h. */
#include "cli/cli.h"
#include "base/mem.h"
#include <signal.h>
#include <stdio.h>
#include <string.h>

static const cli_verb verbs[] = {
    {"info", cli_info, "show a model's architecture, sizes, quantization, tokenizer and template"},
    {"tokenize", cli_tokenize, "print the token ids of a text as a JSON array"},
    {"detokenize", cli_detokenize, "print the text of a JSON array of token ids"},
    {"template", cli_template, "render a conversation through the model's chat template"},
    {"generate", cli_generate, "generate text from a prompt, streamed to stdout"},
    {"chat", cli_chat, "talk with a model in the terminal"},
    {"serve", cli_serve, "serve an OpenAI-compatible HTTP API (a drop-in for mlx_lm.server)"},
    {"bench", cli_bench, "measure prefill and decode speed against the memory-bandwidth roofline"},
    {"embed", cli_embed, "embed texts with an embedding model (BERT family, Qwen3-Embedding)"},
    {"trace", cli_trace, "print a prompt's logits and a greedy continuation as JSON (parity checks)"},
    {"tensors", cli_tensors, "list a model's tensors, or dump one as float32"},
    {"fit", cli_fit, "predict the memory and decode speed of a model at a context, and whether it fits"},
    {"ls", cli_ls, "list the models hearth can find"},
    {"pull", cli_pull, "download a model from the Hugging Face hub into the HF cache"},
    {"upload", cli_upload, "push a folder (a converted model) to a Hugging Face hub repo"},
    {"rm", cli_rm, "remove a model from the HF cache and reclaim its disk space"},
    {"perplexity", cli_perplexity, "perplexity of a model on a dataset (mlx_lm.perplexity), KL against a reference"},
    {"fuse", cli_fuse, "fold a LoRA adapter into its base model (mlx_lm.fuse)"},
    {"train", cli_train, "LoRA fine-tuning (SFT, DPO, ORPO) on the CPU (mlx_lm.lora)"},
    {"train-watch", cli_train_watch, "follow a training run's metrics.jsonl: loss, speed, memory, ETA"},
    {"convert", cli_convert, "convert a float safetensors model to an MLX folder, optionally quantized"},
    {"memory", cli_memory, "the personal memory: a git-tracked Markdown wiki, its search and MCP tools"},
    {"harness", cli_harness, "point a coding agent (pi, claude, codex) at a hearth server, or take it back"},
    {"evals", cli_evals, "list recorded fit checks and benchmarks (the evals database)"},
};

static void usage(FILE *f) {
    fprintf(f, "hearth %s: a local LLM runtime\n\nusage: hearth <command> [args]\n\ncommands:\n", HEARTH_VERSION);
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) fprintf(f, "  %-11s %s\n", verbs[i].name, verbs[i].help);
    fprintf(f, "\nRun 'hearth <command> --help' for a command's flags. Models are named by folder, .gguf file,\n"
               "Hugging Face repo id (from the HF cache) or any unambiguous part of a known model's name.\n"
               "\nWith no command, hearth serves the best model of its catalogue that is on disk and fits\n"
               "this machine (else the default) and opens the chat page in a browser\n"
               "('hearth serve' flags apply; --no-open just prints the page's address). When a better\n"
               "catalogue model is not on disk it says which and how big, and downloads it in the background\n"
               "from an interactive terminal; --no-download never does.\n"
               "\n--no-hugepages, anywhere on the line and with any command, keeps the weights and the KV\n"
               "pool off transparent huge pages.\n");
}

/* `hearth` alone (or with only serve flags, e.g. `hearth --no-open --port 9000`) is
 * the appliance: serve the best catalogue model on disk that fits (else the default)
 * and open the chat page. */
static int appliance(int argc, char **argv) {
    char *args[64] = {"serve", "--open"};
    if (argc > 60) { /* args keeps a NULL after the last one */
        fprintf(stderr, "hearth: too many arguments\n");
        return 2;
    }
    int n = 2, no_download = 0;
    for (int i = 1; i < argc; i++) /* --no-download is the appliance's own: serve does not take it */
        if (!strcmp(argv[i], "--no-download")) no_download = 1;
        else args[n++] = argv[i];
    int rc = cli_serve_check_args(n, args);
    if (rc) return rc;
    const char *model = cli_choose_model(argc, argv, no_download); /* choose.c: the best catalogue model here */
    if (model) {
        args[n++] = "--model";
        args[n++] = (char *)model;
    }
    return cli_serve(n, args);
}

int main(int argc, char **argv) {
    /* A file-size limit (ulimit -f) then makes write() fail with EFBIG, which every writer
     * reports with the file's name (a download keeps its resumable .incomplete part),
     * instead of killing the process mid-write. */
    signal(SIGXFSZ, SIG_IGN);
    /* --no-hugepages: every command's, taken out before the command parses its own flags */
    int kept = 1;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--no-hugepages")) mem_set_hugepages(0);
        else argv[kept++] = argv[i];
    argc = kept;
    argv[argc] = NULL;
    if (argc >= 2 && (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2 || (argv[1][0] == '-' && strcmp(argv[1], "--version"))) return appliance(argc, argv);
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
#ifdef HEARTH_HAVE_CUDA
        printf("hearth %s\nbackends: cpu cuda\n", HEARTH_VERSION);
#else
        printf("hearth %s\nbackends: cpu\n", HEARTH_VERSION);
#endif
        return 0;
    }
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (!strcmp(argv[1], verbs[i].name)) return verbs[i].run(argc - 1, argv + 1);
    fprintf(stderr, "hearth: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
