#include "backend/cpu/cpu_isa.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static cpu_isa supported_level, active_level;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
/* F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c") */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

static cpu_isa detect_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    int vnni = avx512 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
    if (vnni) return CPU_ISA_AVX512_VNNI;
    if (avx512) return CPU_ISA_AVX512;
    if (avx2) return CPU_ISA_AVX2;
#endif
    return CPU_ISA_SCALAR;
}

static void detect(void) {
    supported_level = detect_supported();
    active_level = supported_level;
    const char *env = getenv("G4_CPU_ISA");
    if (env && *env) {
        cpu_isa want = supported_level;
        if (strcmp(env, "scalar") == 0) want = CPU_ISA_SCALAR;
        else if (strcmp(env, "avx2") == 0) want = CPU_ISA_AVX2;
        else if (strcmp(env, "avx512") == 0) want = CPU_ISA_AVX512;
        else if (strcmp(env, "avx512vnni") == 0) want = CPU_ISA_AVX512_VNNI;
        if (want < active_level) active_level = want;
    }
}

cpu_isa cpu_isa_supported(void) {
    pthread_once(&detect_once, detect);
    return supported_level;
}

cpu_isa cpu_isa_active(void) {
    pthread_once(&detect_once, detect);
    return active_level;
}

cpu_isa cpu_isa_force(cpu_isa level) {
    pthread_once(&detect_once, detect);
    active_level = level < supported_level ? level : supported_level;
    return active_level;
}

const char *cpu_isa_level_name(cpu_isa level) {
    switch (level) {
    case CPU_ISA_SCALAR: return "scalar";
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_AVX512: return "avx512";
    case CPU_ISA_AVX512_VNNI: return "avx512vnni";
    }
    return "?";
}
