/* memory_reference.c: hearth's own user docs (README.md and the Markdown of docs/) embedded in the
 * binary, copied into the vault's read-only Reference/ by `hearth memory init` so the
 * memory tools are useful on day one. The Makefile makes this object depend on them. */
#include "io/data_files.h"
#include "memory/memory.h"

DATA_INCBIN(memory_ref_readme, "README.md");
DATA_INCBIN(memory_ref_cli, "docs/cli.md");
DATA_INCBIN(memory_ref_server, "docs/server.md");
DATA_INCBIN(memory_ref_memory, "docs/memory.md");
DATA_INCBIN(memory_ref_design, "docs/design.md");
DATA_INCBIN(memory_ref_gpu, "docs/gpu.md");
DATA_INCBIN(memory_ref_testing, "docs/testing.md");

#define REF(file, sym)                                                                                                 \
    { file, sym##_start, 0 }
static memory_reference_doc docs[] = {
    REF("hearth README.md", memory_ref_readme),   REF("hearth cli.md", memory_ref_cli),
    REF("hearth server.md", memory_ref_server),   REF("hearth memory.md", memory_ref_memory),
    REF("hearth design.md", memory_ref_design),   REF("hearth gpu.md", memory_ref_gpu),
    REF("hearth testing.md", memory_ref_testing),
};

const memory_reference_doc *memory_reference_docs(size_t *n) {
    static const char *ends[] = {memory_ref_readme_end, memory_ref_cli_end,    memory_ref_server_end,
                                 memory_ref_memory_end, memory_ref_design_end, memory_ref_gpu_end,
                                 memory_ref_testing_end};
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) docs[i].len = (size_t)(ends[i] - docs[i].data);
    *n = sizeof docs / sizeof docs[0];
    return docs;
}
