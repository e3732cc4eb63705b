/* Which SIMD level the CPU kernels use, chosen at run time from what the
 * processor offers (the build never assumes the machine it ran on). */
#ifndef G4_BACKEND_CPU_ISA_H
#define G4_BACKEND_CPU_ISA_H

typedef enum {
    CPU_ISA_SCALAR = 0, /* portable C */
    CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ (+ the AVX2 set) */
    CPU_ISA_AVX512_VNNI = 3, /* the AVX-512 set + VNNI (int8 dot products) + BF16 (bf16 dot products) */
} cpu_isa;

/* The highest level this processor supports. */
cpu_isa cpu_isa_supported(void);

/* The level in use: the supported one, lowered by G4_CPU_ISA=scalar|avx2|avx512|avx512vnni
 * in the environment (read once), or whatever cpu_isa_force set last. */
cpu_isa cpu_isa_active(void);

/* Use min(level, supported) from now on (tests run every path this way);
 * returns the level in force. Not for use while kernels run on other threads. */
cpu_isa cpu_isa_force(cpu_isa level);

const char *cpu_isa_level_name(cpu_isa level);

#endif
