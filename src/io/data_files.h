/* data_files.h: the repo's data/ tables (skus.json, catalogue.json, cuda_runtime.json),
 * embedded in the binary (data_files.c); $HEARTH_DATA (a folder) replaces them. */
#ifndef HEARTH_IO_DATA_FILES_H
#define HEARTH_IO_DATA_FILES_H
#include "hearth.h"

/* Embeds a file of the repo as name_start..name_end (NUL after the end); the path is
 * relative to the repository root, where make runs the compiler. The Makefile lists the
 * files as dependencies of the object that uses it (-MMD cannot see .incbin). */
#define DATA_INCBIN(name, file)                                                                                         \
    __asm__(".section .rodata\n.globl " #name "_start\n.hidden " #name "_start\n.globl " #name "_end\n.hidden " #name  \
            "_end\n.balign 16\n" #name "_start:\n.incbin \"" file "\"\n" #name "_end:\n.byte 0\n.text\n");             \
    extern const char name##_start[], name##_end[]

/* The named table's text, NUL-terminated, for the caller to free; NULL with err set when
 * there is no such table (or $HEARTH_DATA has no such file). */
char *data_file_load(const char *name, hearth_error *err);
#endif
