/* The fast products' per-ISA kernels (internal to the CPU backend).
 *
 * The fast path rounds activations to the weights' precision so that the
 * processor's dot-product instructions do the work:
 *
 *  bf16 weights: activations rounded to bf16, products summed in float32
 *  (vdpbf16ps). Each product of two bf16 values is exact in float32.
 *
 *  MLX affine 4/8-bit weights (w = s*q + b per group): activations quantised
 *  to int8 per group, x ~= d*p with d = max|x| / 127, p in [-127, 127]. Then
 *  over one group sum_k x_k w_k ~= s*d * sum_k p_k q_k + b * (d * sum_k p_k):
 *  the first sum is exact in int32 (vpdpbusd: unsigned codes times signed
 *  activations), the second is the group's quantised sum, kept per group.
 *  Using the quantised sum (rather than the float one) makes the result the
 *  exact dot product of the quantised x with the stored w, whose error is
 *  that of x's rounding against w's values, not against w's codes.
 *
 * cpu_matmul_fast.c does the quantising, packing, tiling and threading; a
 * table holds what depends on the instruction set. A NULL entry means the
 * level has no fast kernel for that format or shape, and the float32 path
 * runs (AVX2: int8 decode only). */
#ifndef G4_BACKEND_CPU_FAST_H
#define G4_BACKEND_CPU_FAST_H

#include <stdint.h>

#include "backend/cpu/cpu_isa.h"
#include "tensor/matrix.h"

/* Activations quantised per block of `block` columns (the weight's group). */
typedef struct {
    const int8_t *q;  /* q[t * cols + c] */
    const float *d;   /* d[t * n_blocks + b]: x ~= d * q over block b */
    const float *sum; /* sum[t * n_blocks + b] = d * (sum of q over block b) */
    int64_t cols, n_blocks;
    int block;
} cpu_q8_x;

/* Decode: rows [r0, r1) of w (AFFINE, 4 or 8 bits) against n_tok <= 8
 * quantised tokens; out[t * ldo + r]. */
typedef struct {
    const g4_matrix *w;
    cpu_q8_x x;
    int n_tok;
    float *out;
    int64_t ldo;
} cpu_q8_gemv_args;

/* Prefill, int8: c[i * ldc + j] += sum over the groups g of the kc columns of
 * scale[i*ldp + g] * xd[g*nb + j] * sum_k w[i*ldw + k] x_k,j + bias[i*ldp + g] * xs[g*nb + j]
 * for i < mr, j < nb (nb = nr, or nr/2 for the half kernel). x is packed in
 * fours along k: x_k,j = x[(k/4) * 4*nb + 4*j + k%4]. kc and group are
 * multiples of 32 (group divides kc). */
typedef struct {
    const uint8_t *w;
    int64_t ldw;
    const float *scale, *bias;
    int64_t ldp;
    const int8_t *x;
    const float *xd, *xs;
    int64_t kc;
    int group;
    int bits; /* of the weights (4 or 8): the codes are as the level's q8_codes wrote them */
    float *c;
    int64_t ldc;
} cpu_q8_tile;

typedef struct {
    cpu_isa isa;
    /* bf16 prefill: c[i*ldc + j] += sum_{k<kc} a[i*lda + k] * b_k,j for
     * i < bf16_mr, j < nb (bf16_nr or half of it); a: bf16 weights, kc even;
     * b packed in pairs along k: b_k,j = b[(k/2) * 2*nb + 2*j + k%2]. */
    void (*bf16_micro)(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc);
    void (*bf16_micro_half)(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc);
    int bf16_mr, bf16_nr;
    /* One token's activations quantised per block (cpu_quantize_q8's
     * arithmetic, bit for bit): q[c], d[b], sum[b]. */
    void (*quantize_q8)(const float *x, int64_t cols, int block, int8_t *q, float *d, float *sum);
    /* dst[i] = g4_f32_to_bf16(x[i]), i < n, bit for bit (NULL: that function) */
    void (*to_bf16)(const float *x, int64_t n, uint16_t *dst);
    /* int8 decode (AFFINE 4/8-bit) */
    void (*q8_gemv)(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1);
    /* Nonzero: for 4-bit weights in groups of a multiple of 64, q8_gemv wants
     * each run of 64 quantised columns as its 32 even columns, then its 32
     * odd ones (cpu_split_nibble_order): the low and the high nibbles of 32
     * code bytes then meet their activations without shuffles. */
    int q8_split_nibbles;
    /* dst[0..nc) = the codes of W[r][c0 .. c0+nc) as bytes (c0, nc multiples of 32) */
    void (*q8_codes)(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, uint8_t *dst);
    /* int8 prefill micro-kernels (see cpu_q8_tile) */
    void (*q8_micro)(const cpu_q8_tile *t);
    void (*q8_micro_half)(const cpu_q8_tile *t);
    int q8_mr, q8_nr;
    int prefill_min_tokens; /* from here on the tiled prefill is faster */
    /* Attention in float32 (the exact path sums in float64), for nq <= 8
     * query heads that share one KV head (the SIMD versions want D a
     * multiple of 16; cpu_attention checks):
     * scores[i * n + j] = scale * (q[i * q_stride .. + D) . rows[j][0 .. D)) */
    void (*attn_scores)(const float *q, int nq, int64_t q_stride, const float *const *rows, int n, int D, float scale,
                        float *scores);
    /* p[i * n + j] = exp(p - max_j p) / sum_j exp(p - max_j p), in place, i < nq */
    void (*softmax_rows)(float *p, int nq, int n);
    /* out[i * out_stride + d] = sum_j p[i * n + j] * rows[j][d], d < D */
    void (*attn_mix)(const float *p, int nq, const float *const *rows, int n, int D, float *out, int64_t out_stride);
    /* The same two over rows stored as bf16 and as fp8 e4m3 (unscaled codes:
     * the caller multiplies each row's scale into its scores and into its
     * probabilities before the mix), read where they lie. NULL: the
     * portable versions. */
    void (*attn_scores_bf16)(const float *q, int nq, int64_t q_stride, const uint16_t *const *rows, int n, int D,
                             float scale, float *scores);
    void (*attn_mix_bf16)(const float *p, int nq, const uint16_t *const *rows, int n, int D, float *out,
                          int64_t out_stride);
    void (*attn_scores_e4m3)(const float *q, int nq, int64_t q_stride, const uint8_t *const *rows, int n, int D,
                             float scale, float *scores);
    void (*attn_mix_e4m3)(const float *p, int nq, const uint8_t *const *rows, int n, int D, float *out,
                          int64_t out_stride);
    /* out[i] = gelu_tanh(gate[i]) * up[i] in float32, i < n (NULL: the exact
     * path's float64 version) */
    void (*gelu_mul)(float *out, const float *gate, const float *up, int64_t n);
    /* x[i] = cap * tanh(x[i] / cap) in float32, i < n (NULL: the exact
     * path's tanhf; the LM head's 262,144 logits a token cost 3% of an E2B
     * mlx4 decode through it) */
    void (*softcap)(float *x, int64_t n, float cap);
} cpu_fast_table;

extern const cpu_fast_table cpu_fast_scalar;
extern const cpu_fast_table cpu_fast_avx2;
extern const cpu_fast_table cpu_fast_avx512vnni;

/* q[0 .. cols) (cols a multiple of 64) in the order q8_split_nibbles asks for. */
void cpu_split_nibble_order(int8_t *q, int64_t cols);

/* The portable quantiser (the reference for the SIMD ones). */
void cpu_quantize_token_q8(const float *x, int64_t cols, int block, int8_t *q, float *d, float *sum);

/* The portable attention kernels (the scalar level's, AVX2's, and the
 * reference for the AVX-512 ones). */
void cpu_attn_scores_ref(const float *q, int nq, int64_t q_stride, const float *const *rows, int n, int D,
                         float scale, float *scores);
void cpu_softmax_rows_ref(float *p, int nq, int n);
void cpu_attn_mix_ref(const float *p, int nq, const float *const *rows, int n, int D, float *out,
                      int64_t out_stride);

void cpu_attn_scores_bf16_ref(const float *q, int nq, int64_t q_stride, const uint16_t *const *rows, int n, int D,
                              float scale, float *scores);
void cpu_attn_mix_bf16_ref(const float *p, int nq, const uint16_t *const *rows, int n, int D, float *out,
                           int64_t out_stride);
void cpu_attn_scores_e4m3_ref(const float *q, int nq, int64_t q_stride, const uint8_t *const *rows, int n, int D,
                              float scale, float *scores);
void cpu_attn_mix_e4m3_ref(const float *p, int nq, const uint8_t *const *rows, int n, int D, float *out,
                           int64_t out_stride);
/* AVX2's (the AVX-512 level uses them too: the cache's bandwidth, not the
 * vector width, bounds them). */
void cpu_attn_scores_bf16_avx2(const float *q, int nq, int64_t q_stride, const uint16_t *const *rows, int n, int D,
                               float scale, float *scores);
void cpu_attn_mix_bf16_avx2(const float *p, int nq, const uint16_t *const *rows, int n, int D, float *out,
                            int64_t out_stride);
void cpu_attn_scores_e4m3_avx2(const float *q, int nq, int64_t q_stride, const uint8_t *const *rows, int n, int D,
                               float scale, float *scores);
void cpu_attn_mix_e4m3_avx2(const float *p, int nq, const uint8_t *const *rows, int n, int D, float *out,
                            int64_t out_stride);

/* AVX2's softcap (the AVX-512 level's too). */
void cpu_softcap_avx2(float *x, int64_t n, float cap);

/* The fast kernels of a level (NULL entries where it has none). */
const cpu_fast_table *cpu_fast_for(cpu_isa level);

#endif
