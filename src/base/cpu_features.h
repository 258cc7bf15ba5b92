/* cpu_features.h: which x86 vector extensions this CPU and OS support (cpuid + xgetbv),
 * reduced to the three kernel levels hearth dispatches on. HEARTH_CPU=scalar|avx2|avx512
 * forces a lower level (tests use it to run every path); it never raises the level above
 * what the hardware has. Knows nothing about kernels. */
#ifndef HEARTH_BASE_CPU_FEATURES_H
#define HEARTH_BASE_CPU_FEATURES_H

typedef struct cpu_features {
    int avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16;
} cpu_features;

typedef enum cpu_level {
    CPU_LEVEL_SCALAR = 0,
    CPU_LEVEL_AVX2 = 1,   /* avx2 + fma + f16c */
    CPU_LEVEL_AVX512 = 2, /* AVX2 level + avx512f/bw/vl/vnni */
} cpu_level;

/* Features of this machine, detected once (thread-safe). */
const cpu_features *cpu_features_get(void);
/* Best level the hardware supports. */
cpu_level cpu_level_hardware(void);
/* Level to use: the hardware level, lowered by HEARTH_CPU if set. Read on every call so
 * tests can change the environment between runs. */
cpu_level cpu_level_active(void);
const char *cpu_level_name(cpu_level l);
#endif
