/* CPU matrix kernels over g4_matrix in any stored format. */
#ifndef G4_BACKEND_CPU_MATMUL_H
#define G4_BACKEND_CPU_MATMUL_H

#include <stdint.h>

#include "backend/backend.h"
#include "tensor/matrix.h"

/* out[t][r] = sum_c W[r][c] x[t][c] for t < n_tokens (float32 accumulation,
 * activations never rounded), threaded with OpenMP. Decode (n_tokens small)
 * streams each weight byte once with fused dequantise + dot; prefill works on
 * tiles dequantised into cache-resident scratch. AFFINE/MXFP4 matrices whose
 * group size is not a multiple of 32 take a slow generic path. May be called
 * from several threads at once. */
void cpu_matmul(float *out, const float *x, int64_t n_tokens, const g4_matrix *w);

/* cpu_matmul computed the same way for every token, whatever the batch
 * around it (the prefill kernel, also for one token, never the decode one):
 * a row's result is bit-identical alone, in a decode batch or in any prefill
 * chunk. The exact path (G4_PRECISION_EXACT) uses it, so that the engine's
 * batching and its prefix cache change no bit; decode costs more compute
 * than cpu_matmul's streaming kernel. */
void cpu_matmul_invariant(float *out, const float *x, int64_t n_tokens, const g4_matrix *w);

/* The same product with float64 accumulation across runs of 32 columns
 * (float32 within a run): rounding error ~5x below cpu_matmul's for rows of
 * 768-4304 at ~1.3x its cost. For the vision tower, whose float32 error the
 * random test decoders amplify 50-100x. */
void cpu_matmul_precise(float *out, const float *x, int64_t n_tokens, const g4_matrix *w);

/* The same product on the fast path (G4_PRECISION_FAST, cpu_fast.h):
 * bf16 weights against activations rounded to bf16 (prefill), MLX affine
 * 4/8-bit weights against activations quantised to int8 per group, where
 * the active level has kernels for them; everything else as cpu_matmul. */
void cpu_matmul_fast(float *out, const float *x, int64_t n_tokens, const g4_matrix *w);

/* The precision set_precision last chose for a CPU backend (it starts EXACT). */
g4_precision cpu_backend_precision(const g4_backend *be);

/* cpu_matmul or cpu_matmul_fast. */
void cpu_matmul_with(g4_precision precision, float *out, const float *x, int64_t n_tokens, const g4_matrix *w);

/* Whether cpu_matmul_fast rounds the activations of this product (a fast
 * kernel takes it at the active level). */
int cpu_fast_takes(const g4_matrix *w, int64_t n_tokens);

/* The fast path's activation quantisation: per token t and block b of
 * `block` columns, d = max|x| / 127, q = round(x / d) in [-127, 127],
 * sum = d * sum(q); d[t * n_blocks + b], sum likewise, q[t * cols + c]. */
void cpu_quantize_q8(const float *x, int64_t n_tokens, int64_t cols, int block, int8_t *q, float *d, float *sum);

/* out[c] = W[r][c] * scale: one row, dequantised (embedding lookup). */
void cpu_matrix_row(const g4_matrix *w, int64_t r, float scale, float *out);

/* The SIMD level chosen at run time ("avx512", "avx2" or "scalar"); G4_CPU_ISA
 * in the environment can force a lower one, and cpu_isa_force (cpu_isa.h)
 * too. */
const char *cpu_isa_name(void);

#endif
