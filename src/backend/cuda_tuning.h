/* The CUDA backend's measured choices as one typed struct, filled once per
 * device from its capabilities (g4_cuda_tuning_defaults), and the one
 * override: "key=value,key=value" (G4_CUDA_TUNE, or the tune argument of
 * g4_backend_cuda_create_tuned), parsed by g4_cuda_tuning_parse. Plain C
 * (no CUDA headers): the planner (cuda_plan.h), its tests and the fuzzer use
 * it without a GPU. README.md ("CUDA tuning") lists the keys; the
 * measurements behind the defaults are in bench/RESULTS.md. */
#ifndef G4_BACKEND_CUDA_TUNING_H
#define G4_BACKEND_CUDA_TUNING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the choices depend on: the device's capabilities. */
typedef struct {
    int sm_count;      /* multiprocessors */
    int major, minor;  /* compute capability */
    size_t smem_optin; /* shared memory per block with the opt-in, bytes */
    int wgmma;         /* this build's sm_90a code runs on the device (the warpgroup GEMM) */
} g4_cuda_caps;

/* Test hooks: run a fallback kernel at shapes the default gives to a faster one. */
typedef enum {
    G4_CUDA_GEMV_AUTO = 0,
    G4_CUDA_GEMV_FLOAT32, /* every decode GEMV on the float32 kernels (no tensor cores) */
    G4_CUDA_GEMV_FP16,    /* no integer tensor cores: 4 bits on the fp16 kernels, one token of 8 bits float32 */
} g4_cuda_gemv_force;

typedef enum {
    G4_CUDA_ATTN_AUTO = 0,
    G4_CUDA_ATTN_CORES, /* prefill attention on CUDA cores (the decode kernel) */
    G4_CUDA_ATTN_TC,    /* prefill attention by the older tensor-core kernel instead of the flash one */
} g4_cuda_attn_force;

typedef enum {
    G4_CUDA_MOE_AUTO = 0,
    G4_CUDA_MOE_MMA, /* the experts' prefill by the general grouped kernel (no pipelined kernel, no cuBLAS) */
} g4_cuda_moe_force;

typedef struct {
    /* debug switches */
    int graphs; /* record decode steps as CUDA graphs */
    int pdl;    /* programmatic dependent launch (compute capability 9.0 and later) */
    /* thresholds */
    int64_t i8_min8;    /* fewest weights (rows x columns x MoE slots) of 8 bits for the integer GEMV */
    int gemv_copies;    /* copies of the integer GEMV's prepared activations, 1..64 */
    int gemv_split;     /* float32 GEMV's column split: -1 by shape, 0 never, 1 always */
    int attn_min_split; /* shortest key piece of split decode attention (0: one key tile) */
    int attn_tc_split;  /* keys per piece of split prefill attention: -1 by shape, 0 never */
    int moe_cublas;     /* bf16 experts' prefill by cuBLAS from this many tokens on (0: never) */
    int q_chunk;        /* quantised prefill: Mi weights dequantised to bf16 per cuBLAS product */
    int wgmma;          /* quantised prefill of 4-bit weights by the warpgroup GEMM that decodes them in its main
                           loop (fast precision, where caps.wgmma): 0 never, 1 the MoE experts, 2 dense products
                           too (a test hook: measured slower than dequantising + cuBLAS there) */
    /* test hooks */
    g4_cuda_gemv_force gemv;
    g4_cuda_attn_force attn;
    g4_cuda_moe_force moe;
} g4_cuda_tuning;

/* The measured defaults for a device with these capabilities. */
g4_cuda_tuning g4_cuda_tuning_defaults(const g4_cuda_caps *caps);

/* Applies spec ("key=value" items separated by commas; NULL or "" changes
 * nothing) to *t. Returns 1, or 0 with *t unchanged and err (err_size
 * bytes) naming the unknown key or the bad value. */
int g4_cuda_tuning_parse(g4_cuda_tuning *t, const char *spec, char *err, size_t err_size);

/* Whether env (a NULL-terminated "NAME=value" array, as environ) sets a
 * G4_CUDA_* variable other than G4_CUDA_TUNE: the backend's former knobs
 * are read no more, so one set would silently change nothing. Returns 1
 * when none is set, else 0 with err naming it and what replaced it. */
int g4_cuda_tuning_check_env(char *const *env, char *err, size_t err_size);

/* The settings as "key=value,..." (every key, parseable by the above) into
 * buf; returns the length it needed (as snprintf). */
int g4_cuda_tuning_format(const g4_cuda_tuning *t, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
