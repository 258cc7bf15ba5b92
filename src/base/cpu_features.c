/* cpu_features.c: cpuid/xgetbv feature detection and the HEARTH_CPU override. A feature
 * counts only if the OS also saves its registers (XCR0), otherwise using it faults. */
#include "base/cpu_features.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static cpu_features detected;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
static unsigned long long read_xcr0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void detect(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int osxsave = (c >> 27) & 1, has_fma = (c >> 12) & 1, has_f16c = (c >> 29) & 1, has_avx = (c >> 28) & 1;
    if (!osxsave || !has_avx) return;
    unsigned long long xcr0 = read_xcr0();
    int os_ymm = (xcr0 & 0x6) == 0x6;    /* SSE + AVX state */
    int os_zmm = (xcr0 & 0xe6) == 0xe6;  /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (!os_ymm) return;
    detected.fma = has_fma;
    detected.f16c = has_f16c;
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    detected.avx2 = (b >> 5) & 1;
    if (os_zmm) {
        detected.avx512f = (b >> 16) & 1;
        detected.avx512bw = (b >> 30) & 1;
        detected.avx512vl = (b >> 31) & 1;
        detected.avx512vnni = (c >> 11) & 1;
        __cpuid_count(7, 1, a, b, c, d);
        detected.avx512bf16 = (a >> 5) & 1;
    }
}
#else
static void detect(void) {}
#endif

const cpu_features *cpu_features_get(void) {
    pthread_once(&detect_once, detect);
    return &detected;
}

cpu_level cpu_level_hardware(void) {
    const cpu_features *f = cpu_features_get();
    if (!(f->avx2 && f->fma && f->f16c)) return CPU_LEVEL_SCALAR;
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni) return CPU_LEVEL_AVX512;
    return CPU_LEVEL_AVX2;
}

cpu_level cpu_level_active(void) {
    cpu_level hw = cpu_level_hardware(), want = hw;
    const char *env = getenv("HEARTH_CPU");
    if (env && !strcmp(env, "scalar")) want = CPU_LEVEL_SCALAR;
    else if (env && !strcmp(env, "avx2")) want = CPU_LEVEL_AVX2;
    else if (env && !strcmp(env, "avx512")) want = CPU_LEVEL_AVX512;
    return want < hw ? want : hw;
}

const char *cpu_level_name(cpu_level l) {
    switch (l) {
    case CPU_LEVEL_SCALAR: return "scalar";
    case CPU_LEVEL_AVX2: return "avx2";
    case CPU_LEVEL_AVX512: return "avx512";
    }
    return "?";
}
