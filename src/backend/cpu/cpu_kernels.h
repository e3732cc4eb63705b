/* The per-ISA kernels behind cpu_matmul (internal to the CPU backend).
 *
 * Each SIMD level (cpu_kernels_scalar.c, _avx2.c, _avx512.c) fills one table;
 * cpu_matmul.c picks the table at run time and does the threading, the token
 * blocking and the scratch buffers. Quantised matrices reach these kernels
 * only when cpu_kernels_fast_layout() holds. */
#ifndef G4_BACKEND_CPU_KERNELS_H
#define G4_BACKEND_CPU_KERNELS_H

#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_isa.h"
#include "tensor/matrix.h"

/* Most tokens any decode kernel handles at once (register accumulators);
 * each table says its own limit, max_tok. */
#define CPU_DECODE_TOKENS 8

/* Decode arguments: rows [r0, r1) of w against n_tok <= max_tok
 * tokens x[t][cols]; out[t * ldo + r]. xsum[t * n_groups + g] holds the sum of
 * token t's x over group g (AFFINE only, else NULL): the bias term is
 * bias[g] * xsum[g], so the inner loop only multiplies codes.
 *
 * Where the table's x_interleave(w) is nonzero, x arrives interleaved (see
 * cpu_interleave_x): a kernel then loads a whole vector of 32-bit words of
 * codes and, with shifts and masks alone, gets in lane i the code
 * per_word * i + s at step s; x in the same order turns that into plain FMAs,
 * with no shuffles. */
typedef struct {
    const g4_matrix *w;
    const float *x;
    const float *xsum;
    int n_tok;
    float *out;
    int64_t ldo;
} cpu_gemv_args;

typedef struct {
    cpu_isa isa;
    /* Decode: one fused dequantise + dot pass over each weight byte. */
    void (*gemv)(const cpu_gemv_args *a, int64_t r0, int64_t r1);
    /* dst[0..nc) = W[r][c0 .. c0+nc); for quantised formats c0 and nc are
     * multiples of 32. */
    void (*dequant_row)(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, float *dst);
    /* Prefill micro-kernel: c[i*ldc + j] += sum_{k<kc} a[i*lda + k] * b[k*nr + j]
     * for i < mr, j < nr (b is a packed block of nr tokens, 64-byte aligned);
     * gemm_micro_half does the same for a block of nr/2 tokens (b[k*nr/2 + j]),
     * so that a last block of few tokens costs half. */
    void (*gemm_micro)(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc);
    void (*gemm_micro_half)(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc);
    int mr, nr;
    /* Precise prefill, all in float64: c[i*ldc + j] += sum_{k<kc} a[i*lda + k] * b[k*ldb + j]
     * for i < f64_mr, j < f64_nr (b: float32 packed tokens, row stride
     * ldb, a multiple of f64_nr; 32-byte aligned). f64_mr divides the
     * prefill's W tile height. */
    void (*gemm_micro_f64)(const double *a, int64_t lda, int64_t kc, const float *b, int64_t ldb, double *c,
                           int64_t ldc);
    int f64_mr, f64_nr;
    int max_tok;
    int prefill_min_tokens; /* from here on the tiled prefill path is faster (measured) */
    /* Codes per 32-bit word for which gemv wants interleaved x, or 0. */
    int (*x_interleave)(const g4_matrix *w);
    int lanes; /* floats per vector */
    /* Prefill's store: out[t * ldo + i] = acc[i * ldc + t] for i < n_rows,
     * t < n_tok (the accumulators, row-major over tokens, into the output's
     * token-major rows). Data movement only: every level gives the same bits. */
    void (*store_transposed)(float *out, int64_t ldo, const float *acc, int64_t ldc, int64_t n_rows, int64_t n_tok);
    /* Machine probes: sum of n floats (a streaming read), and n_iter rounds
     * of independent FMAs returning the flop count done. */
    float (*read_sum)(const float *p, int64_t n);
    double (*fma_burn)(int64_t n_iter, float *sink);
} cpu_kernel_table;

extern const cpu_kernel_table cpu_kernels_scalar;
extern const cpu_kernel_table cpu_kernels_avx2;
extern const cpu_kernel_table cpu_kernels_avx512;

/* The portable store_transposed (the scalar level's), and AVX2's (the
 * AVX-512 level's too). */
void cpu_store_transposed_ref(float *out, int64_t ldo, const float *acc, int64_t ldc, int64_t n_rows, int64_t n_tok);
void cpu_store_transposed_avx2(float *out, int64_t ldo, const float *acc, int64_t ldc, int64_t n_rows, int64_t n_tok);

/* The table for a level (falls back to scalar on non-x86 builds). */
const cpu_kernel_table *cpu_kernels_for(cpu_isa level);

/* Whether w's layout suits the fast kernels: AFFINE/MXFP4 need group_size a
 * multiple of 32 and cols a multiple of group_size. */
int cpu_kernels_fast_layout(const g4_matrix *w);

/* Columns [0, result) of w are decoded from interleaved x: whole blocks of
 * per_word * lanes codes, provided the groups tile them (or they the groups). */
static inline int64_t cpu_wide_cols(const g4_matrix *w, int per_word, int lanes) {
    const int64_t block = (int64_t)per_word * lanes, gs = w->group_size;
    if (gs % block != 0 && block % gs != 0) return 0;
    return w->cols / block * block;
}

/* dst = x with each block of per_word*lanes values among the first
 * cpu_wide_cols columns reordered so that dst[b + s*lanes + i] = x[b +
 * per_word*i + s]; the remaining columns are copied as they are. */
void cpu_interleave_x(float *dst, const float *x, int64_t cols, int64_t wide_cols, int per_word, int lanes);

/* n floats of this thread's scratch (64-byte aligned; grows, never shrinks,
 * freed when the thread ends), or NULL. Valid until the thread's next call. */
float *cpu_scratch_floats(size_t n);

/* Asks for columns [c0, c0 + nc) of rows [r0, r0 + n_rows) of w to be
 * brought into L2 (prefetcht1), for prefill to call one W tile ahead: a tile's
 * rows are short segments (512 bytes of bf16, 128 of 4-bit codes) at a large
 * stride, which the hardware prefetchers do not follow, so without it the
 * first conversion of each tile waits on memory. */
static inline void cpu_prefetch_tile(const g4_matrix *w, int64_t r0, int64_t n_rows, int64_t c0, int64_t nc) {
    int bits = w->format == G4_WEIGHT_F32 ? 32 : w->format == G4_WEIGHT_BF16 || w->format == G4_WEIGHT_F16 ? 16 : w->bits;
    const size_t first = (size_t)(c0 * bits / 8), last = (size_t)((c0 + nc) * bits / 8);
    for (int64_t i = 0; i < n_rows; i++) {
        const char *row = (const char *)w->data + (size_t)(r0 + i) * w->row_bytes;
        for (size_t b = first; b < last; b += 64) __builtin_prefetch(row + b, 0, 2);
    }
}

/* Scalar parameter loads shared by every level. */
static inline float cpu_load_param(const void *p, g4_dtype dt, int64_t i) {
    /* memcpy: tensors in a safetensors file need not be aligned */
    const unsigned char *b = p;
    if (dt == G4_DTYPE_F32) {
        float f;
        memcpy(&f, b + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, b + 2 * i, 2);
    return dt == G4_DTYPE_BF16 ? g4_bf16_to_f32(h) : g4_f16_to_f32(h);
}

/* 2^(e-127) for an E8M0 byte; 255 is NaN. Exact, subnormals included. */
static inline float cpu_e8m0_to_f32(unsigned e) {
    uint32_t bits = e == 255 ? 0x7fc00000u : e == 0 ? 0x00400000u : (uint32_t)e << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
