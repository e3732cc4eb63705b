/* AVX2 + FMA + F16C kernels (8 floats per vector, 16 registers). Built with
 * those flags (file suffix); only reached when the processor has them.
 *
 * Same plan as the AVX-512 level: a 32-code block decodes into four vectors
 * of 8 floats (each 32-bit word of 4-bit codes is broadcast and shifted by
 * 0,4,..,28), the affine scale multiplies a group's dot product and the bias
 * meets a precomputed group sum of x. Decode handles up to 4 tokens at once
 * so that the accumulators fit in the 16 registers. Prefill: a 6-row x 16-token FMA micro-kernel. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { MAX_TOK = 4, PARAM_SEGMENT = 256, MAX_R = 2 };

typedef enum { Q_AFFINE4, Q_AFFINE8, Q_AFFINE_ANY, Q_MXFP4 } quant_kind;
typedef enum { F_F32, F_BF16, F_F16 } float_kind;

static const float e2m1_magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

typedef struct {
    __m256i nibble_shift; /* 0, 4, .., 28 */
    __m256i low4;
    __m256 magnitude;     /* MXFP4: E2M1 magnitudes by the low 3 bits */
    __m256i sign_bit;
    __m256i even_shift, odd_shift; /* any bits: 64-bit shifts of codes 0,2,4,6 and 1,3,5,7 */
    __m256i code_mask;
    int bits;
    const unsigned char *end; /* first byte past the matrix: no load may cross it */
} decoder;

static decoder make_decoder(const g4_matrix *w) {
    decoder d;
    const int b = w->bits;
    d.nibble_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    d.low4 = _mm256_set1_epi32(15);
    d.magnitude = _mm256_loadu_ps(e2m1_magnitude);
    d.sign_bit = _mm256_set1_epi32((int)0x80000000u);
    d.even_shift = _mm256_setr_epi64x(0, 2 * b, 4 * b, 6 * b);
    d.odd_shift = _mm256_setr_epi64x(b, 3 * b, 5 * b, 7 * b);
    d.code_mask = _mm256_set1_epi32((1 << b) - 1);
    d.bits = b;
    d.end = (const unsigned char *)w->data + (size_t)w->rows * w->row_bytes;
    return d;
}

/* 8 codes of `bits` bits stored in `bits` bytes at p, as one little-endian word. */
ALWAYS_INLINE uint64_t load_codes8(const decoder *d, const unsigned char *p) {
    uint64_t u = 0;
    if (p + 8 <= d->end) {
        memcpy(&u, p, 8);
    } else {
        for (int i = 0; i < d->bits; i++) u |= (uint64_t)p[i] << (8 * i);
    }
    return u;
}

/* Codes 8i .. 8i+7 of the 32-code block at p, as floats. */
ALWAYS_INLINE __m256 decode8(const decoder *d, const unsigned char *p, int i, quant_kind kind) {
    if (kind == Q_AFFINE4 || kind == Q_MXFP4) {
        int32_t word;
        memcpy(&word, p + 4 * i, 4);
        __m256i q = _mm256_srlv_epi32(_mm256_set1_epi32(word), d->nibble_shift);
        if (kind == Q_AFFINE4) return _mm256_cvtepi32_ps(_mm256_and_si256(q, d->low4));
        __m256 magnitude = _mm256_permutevar8x32_ps(d->magnitude, q);
        __m256i sign = _mm256_and_si256(_mm256_slli_epi32(q, 28), d->sign_bit);
        return _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
    }
    if (kind == Q_AFFINE8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * i))));
    __m256i v = _mm256_set1_epi64x((long long)load_codes8(d, p + i * d->bits));
    __m256i even = _mm256_srlv_epi64(v, d->even_shift);
    __m256i odd = _mm256_slli_epi64(_mm256_srlv_epi64(v, d->odd_shift), 32);
    __m256i codes = _mm256_blend_epi32(even, odd, 0xAA);
    return _mm256_cvtepi32_ps(_mm256_and_si256(codes, d->code_mask));
}

static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ALWAYS_INLINE float load_param(const void *base, g4_dtype dt, int is_e8m0, int64_t i) {
    if (is_e8m0) return cpu_e8m0_to_f32(((const uint8_t *)base)[i]);
    return cpu_load_param(base, dt, i);
}

/* dst[i] = parameter g0 + i of one row, for i < n, 8 at a time where the
 * type allows. */
static void load_params(const void *base, g4_dtype dt, int is_e8m0, int64_t g0, int64_t n, float *dst) {
    int64_t i = 0;
    if (is_e8m0) {
        const __m256i zero = _mm256_setzero_si256(), all = _mm256_set1_epi32(255);
        const __m256i smallest = _mm256_set1_epi32(0x00400000), nan = _mm256_set1_epi32(0x7fc00000);
        for (; i + 8 <= n; i += 8) {
            __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)base + g0 + i)));
            __m256i f = _mm256_slli_epi32(e, 23);
            f = _mm256_blendv_epi8(f, smallest, _mm256_cmpeq_epi32(e, zero));
            f = _mm256_blendv_epi8(f, nan, _mm256_cmpeq_epi32(e, all));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(f));
        }
    } else if (dt == G4_DTYPE_BF16) {
        for (; i + 8 <= n; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + g0 + i));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
        }
    } else if (dt == G4_DTYPE_F16) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + g0 + i))));
    }
    for (; i < n; i++) dst[i] = load_param(base, dt, is_e8m0, g0 + i);
}

static float dot_n(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* R rows of W against T tokens (R = 1 in use: see gemv_quant). Accumulator
 * arrays have fixed sizes (R*T*U <= 8) so that the compiler keeps them in
 * registers. */
ALWAYS_INLINE void quant_rows(const cpu_gemv_args *a, const decoder *d, int64_t r, quant_kind kind, const int T,
                              const int R) {
    const g4_matrix *w = a->w;
    const int64_t cols = w->cols, gs = w->group_size, n_groups = cols / gs, blocks_per_group = gs / 32;
    const int64_t block_bytes = 4 * w->bits;
    const int affine = kind != Q_MXFP4;
    const int U = R > 1 ? 2 : T == 1 ? 4 : T == 2 ? 2 : 1; /* accumulators per row and token */
    float scale[MAX_R][PARAM_SEGMENT], bias[MAX_R][PARAM_SEGMENT];
    const unsigned char *row[MAX_R], *srow[MAX_R], *brow[MAX_R];
    __m256 total[MAX_R * MAX_TOK];
    float bias_total[MAX_R * MAX_TOK];
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
        row[i] = (const unsigned char *)w->data + (size_t)(r + i) * w->row_bytes;
        srow[i] = (const unsigned char *)w->scales + (size_t)(r + i) * w->scale_row_bytes;
        brow[i] = affine ? (const unsigned char *)w->biases + (size_t)(r + i) * w->scale_row_bytes : NULL;
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            total[i * T + t] = _mm256_setzero_ps();
            bias_total[i * T + t] = 0.0f;
        }
    }
    for (int64_t g0 = 0; g0 < n_groups; g0 += PARAM_SEGMENT) {
        const int64_t n = n_groups - g0 < PARAM_SEGMENT ? n_groups - g0 : PARAM_SEGMENT;
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            load_params(srow[i], w->scale_dtype, !affine, g0, n, scale[i]);
            if (affine) load_params(brow[i], w->scale_dtype, 0, g0, n, bias[i]);
        }
        for (int64_t g = 0; g < n; g++) {
            __m256 acc[8];
#pragma GCC unroll 8
            for (int k = 0; k < R * T * U; k++) acc[k] = _mm256_setzero_ps();
            const int64_t c_group = (g0 + g) * gs;
            for (int64_t blk = 0; blk < blocks_per_group; blk++) {
                const float *xc = a->x + c_group + blk * 32;
                const int64_t offset = ((g0 + g) * blocks_per_group + blk) * block_bytes;
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    __m256 q[MAX_R];
#pragma GCC unroll 2
                    for (int i = 0; i < R; i++) q[i] = decode8(d, row[i] + offset, j, kind);
#pragma GCC unroll 4
                    for (int t = 0; t < T; t++) {
                        const __m256 xv = _mm256_loadu_ps(xc + t * cols + 8 * j);
#pragma GCC unroll 2
                        for (int i = 0; i < R; i++) {
                            __m256 *ac = &acc[(i * T + t) * U + j % U];
                            *ac = _mm256_fmadd_ps(q[i], xv, *ac);
                        }
                    }
                }
            }
#pragma GCC unroll 2
            for (int i = 0; i < R; i++) {
                const __m256 sv = _mm256_set1_ps(scale[i][g]);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    __m256 sum = acc[(i * T + t) * U];
#pragma GCC unroll 4
                    for (int u = 1; u < U; u++) sum = _mm256_add_ps(sum, acc[(i * T + t) * U + u]);
                    total[i * T + t] = _mm256_fmadd_ps(sv, sum, total[i * T + t]);
                }
            }
        }
        if (affine) {
#pragma GCC unroll 2
            for (int i = 0; i < R; i++)
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) bias_total[i * T + t] += dot_n(bias[i], a->xsum + t * n_groups + g0, n);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->out[t * a->ldo + r + i] = hsum(total[i * T + t]) + bias_total[i * T + t];
}

/* One row at a time. Taking R rows together (each x vector loaded then feeds
 * R FMAs) was measured here: the same speed from cache, but streaming from
 * memory fell to half (bf16 35 -> 18 GB/s on one Zen 5 core), the
 * interleaved row streams defeating the prefetchers, also for the 31B's
 * 21504-wide rows. quant_rows keeps R for further experiments. */
ALWAYS_INLINE void gemv_quant(const cpu_gemv_args *a, int64_t r0, int64_t r1, quant_kind kind, const int T) {
    const int R = 1;
    const decoder d = make_decoder(a->w);
    int64_t r = r0;
    for (; r + R <= r1; r += R) quant_rows(a, &d, r, kind, T, R);
    for (; r < r1; r++) quant_rows(a, &d, r, kind, T, 1);
}

ALWAYS_INLINE __m256 load_weights8(const void *row, int64_t c, float_kind kind) {
    if (kind == F_F32) return _mm256_loadu_ps((const float *)row + c);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + c));
    if (kind == F_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE float weight_at(const void *row, int64_t c, float_kind kind) {
    return cpu_load_param(row, kind == F_F32 ? G4_DTYPE_F32 : kind == F_F16 ? G4_DTYPE_F16 : G4_DTYPE_BF16, c);
}

ALWAYS_INLINE void float_rows(const cpu_gemv_args *a, int64_t r, float_kind kind, const int T, const int R) {
    const g4_matrix *w = a->w;
    const int64_t cols = w->cols;
    const int U = R > 1 ? 2 : T == 1 ? 4 : T == 2 ? 2 : 1; /* accumulators per row and token */
    const void *row[MAX_R];
    __m256 acc[8]; /* R*T*U <= 8 */
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) row[i] = (const unsigned char *)w->data + (size_t)(r + i) * w->row_bytes;
#pragma GCC unroll 8
    for (int k = 0; k < R * T * U; k++) acc[k] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 * U <= cols; c += 8 * U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m256 wv[MAX_R];
#pragma GCC unroll 2
            for (int i = 0; i < R; i++) wv[i] = load_weights8(row[i], c + 8 * u, kind);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m256 xv = _mm256_loadu_ps(a->x + t * cols + c + 8 * u);
#pragma GCC unroll 2
                for (int i = 0; i < R; i++) acc[(i * T + t) * U + u] = _mm256_fmadd_ps(wv[i], xv, acc[(i * T + t) * U + u]);
            }
        }
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 wv[MAX_R];
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) wv[i] = load_weights8(row[i], c, kind);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256 xv = _mm256_loadu_ps(a->x + t * cols + c);
#pragma GCC unroll 2
            for (int i = 0; i < R; i++) acc[(i * T + t) * U] = _mm256_fmadd_ps(wv[i], xv, acc[(i * T + t) * U]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 s = acc[(i * T + t) * U];
#pragma GCC unroll 4
            for (int u = 1; u < U; u++) s = _mm256_add_ps(s, acc[(i * T + t) * U + u]);
            float total = hsum(s);
            for (int64_t cc = c; cc < cols; cc++) total += weight_at(row[i], cc, kind) * a->x[t * cols + cc];
            a->out[t * a->ldo + r + i] = total;
        }
}

ALWAYS_INLINE void gemv_float(const cpu_gemv_args *a, int64_t r0, int64_t r1, float_kind kind, const int T) {
    const int R = 1; /* as gemv_quant */
    int64_t r = r0;
    for (; r + R <= r1; r += R) float_rows(a, r, kind, T, R);
    for (; r < r1; r++) float_rows(a, r, kind, T, 1);
}

/* The token count becomes a constant in each case, so that the accumulators
 * live in registers. */
ALWAYS_INLINE void gemv_quant_tokens(const cpu_gemv_args *a, int64_t r0, int64_t r1, quant_kind kind) {
    switch (a->n_tok) {
    case 1: gemv_quant(a, r0, r1, kind, 1); return;
    case 2: gemv_quant(a, r0, r1, kind, 2); return;
    case 3: gemv_quant(a, r0, r1, kind, 3); return;
    default: gemv_quant(a, r0, r1, kind, 4); return;
    }
}

ALWAYS_INLINE void gemv_float_tokens(const cpu_gemv_args *a, int64_t r0, int64_t r1, float_kind kind) {
    switch (a->n_tok) {
    case 1: gemv_float(a, r0, r1, kind, 1); return;
    case 2: gemv_float(a, r0, r1, kind, 2); return;
    case 3: gemv_float(a, r0, r1, kind, 3); return;
    default: gemv_float(a, r0, r1, kind, 4); return;
    }
}

static void gemv_f32(const cpu_gemv_args *a, int64_t r0, int64_t r1) { gemv_float_tokens(a, r0, r1, F_F32); }
static void gemv_bf16(const cpu_gemv_args *a, int64_t r0, int64_t r1) { gemv_float_tokens(a, r0, r1, F_BF16); }
static void gemv_f16(const cpu_gemv_args *a, int64_t r0, int64_t r1) { gemv_float_tokens(a, r0, r1, F_F16); }
static void gemv_affine4(const cpu_gemv_args *a, int64_t r0, int64_t r1) { gemv_quant_tokens(a, r0, r1, Q_AFFINE4); }
static void gemv_affine8(const cpu_gemv_args *a, int64_t r0, int64_t r1) { gemv_quant_tokens(a, r0, r1, Q_AFFINE8); }
static void gemv_affine_any(const cpu_gemv_args *a, int64_t r0, int64_t r1) {
    gemv_quant_tokens(a, r0, r1, Q_AFFINE_ANY);
}
static void gemv_mxfp4(const cpu_gemv_args *a, int64_t r0, int64_t r1) { gemv_quant_tokens(a, r0, r1, Q_MXFP4); }

static void gemv(const cpu_gemv_args *a, int64_t r0, int64_t r1) {
    switch (a->w->format) {
    case G4_WEIGHT_F32: gemv_f32(a, r0, r1); return;
    case G4_WEIGHT_BF16: gemv_bf16(a, r0, r1); return;
    case G4_WEIGHT_F16: gemv_f16(a, r0, r1); return;
    case G4_WEIGHT_MXFP4: gemv_mxfp4(a, r0, r1); return;
    case G4_WEIGHT_AFFINE:
        if (a->w->bits == 4) gemv_affine4(a, r0, r1);
        else if (a->w->bits == 8) gemv_affine8(a, r0, r1);
        else gemv_affine_any(a, r0, r1);
        return;
    }
}

ALWAYS_INLINE void dequant_quant(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, float *dst, quant_kind kind) {
    const unsigned char *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
    const unsigned char *srow = (const unsigned char *)w->scales + (size_t)r * w->scale_row_bytes;
    const unsigned char *brow = (const unsigned char *)w->biases + (size_t)r * w->scale_row_bytes;
    const int64_t block_bytes = 4 * w->bits;
    const decoder d = make_decoder(w);
    for (int64_t c = 0; c < nc; c += 32) {
        const int64_t g = (c0 + c) / w->group_size;
        const unsigned char *p = row + (c0 + c) / 32 * block_bytes;
        const __m256 s = _mm256_set1_ps(load_param(srow, w->scale_dtype, kind == Q_MXFP4, g));
        const __m256 b = kind == Q_MXFP4 ? _mm256_setzero_ps() : _mm256_set1_ps(load_param(brow, w->scale_dtype, 0, g));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + c + 8 * i, _mm256_fmadd_ps(decode8(&d, p, i, kind), s, b));
    }
}

ALWAYS_INLINE void dequant_float(const void *row, int64_t c0, int64_t nc, float *dst, float_kind kind) {
    int64_t c = 0;
    for (; c + 8 <= nc; c += 8) _mm256_storeu_ps(dst + c, load_weights8(row, c0 + c, kind));
    for (; c < nc; c++) dst[c] = weight_at(row, c0 + c, kind);
}

static void dequant_row(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, float *dst) {
    const void *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
    switch (w->format) {
    case G4_WEIGHT_F32: dequant_float(row, c0, nc, dst, F_F32); return;
    case G4_WEIGHT_BF16: dequant_float(row, c0, nc, dst, F_BF16); return;
    case G4_WEIGHT_F16: dequant_float(row, c0, nc, dst, F_F16); return;
    case G4_WEIGHT_MXFP4: dequant_quant(w, r, c0, nc, dst, Q_MXFP4); return;
    case G4_WEIGHT_AFFINE:
        if (w->bits == 4) dequant_quant(w, r, c0, nc, dst, Q_AFFINE4);
        else if (w->bits == 8) dequant_quant(w, r, c0, nc, dst, Q_AFFINE8);
        else dequant_quant(w, r, c0, nc, dst, Q_AFFINE_ANY);
        return;
    }
}

enum { MR = 6, NR = 16 };

/* 6 rows x 16 tokens: 12 accumulators, two packed x vectors and one
 * broadcast weight in flight (15 of the 16 registers) (J = 2); J = 1 is the
 * 8-token block. */
ALWAYS_INLINE void gemm_block(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc, const int J) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m256 bk[2];
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) bk[j] = _mm256_load_ps(b + k * 8 * J + 8 * j);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + i * lda + k);
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) acc[i][j] = _mm256_fmadd_ps(ai, bk[j], acc[i][j]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            float *cij = c + i * ldc + 8 * j;
            _mm256_storeu_ps(cij, _mm256_add_ps(_mm256_loadu_ps(cij), acc[i][j]));
        }
}

static void gemm_micro(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc) {
    gemm_block(a, lda, kc, b, c, ldc, 2);
}

static void gemm_micro_half(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc) {
    gemm_block(a, lda, kc, b, c, ldc, 1);
}

/* 4 rows x 8 tokens in float64: 8 accumulators; per k two packed-x loads
 * widened to double and four weight broadcasts. */
enum { F64_MR = 4 };
static void gemm_micro_f64(const double *a, int64_t lda, int64_t kc, const float *b, int64_t ldb, double *c,
                           int64_t ldc) {
    __m256d acc[F64_MR][2];
#pragma GCC unroll 4
    for (int i = 0; i < F64_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_pd();
    for (int64_t k = 0; k < kc; k++) {
        const __m256d b0 = _mm256_cvtps_pd(_mm_load_ps(b + k * ldb));
        const __m256d b1 = _mm256_cvtps_pd(_mm_load_ps(b + k * ldb + 4));
#pragma GCC unroll 4
        for (int i = 0; i < F64_MR; i++) {
            const __m256d ai = _mm256_broadcast_sd(a + i * lda + k);
            acc[i][0] = _mm256_fmadd_pd(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_pd(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < F64_MR; i++) {
        double *ci = c + i * ldc;
        _mm256_storeu_pd(ci, _mm256_add_pd(_mm256_loadu_pd(ci), acc[i][0]));
        _mm256_storeu_pd(ci + 4, _mm256_add_pd(_mm256_loadu_pd(ci + 4), acc[i][1]));
    }
}

static float read_sum(const float *p, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

static double fma_burn(int64_t n_iter, float *sink) {
    enum { CHAINS = 10 };
    __m256 v[CHAINS];
    const __m256 m = _mm256_set1_ps(0.999999f), d = _mm256_set1_ps(1e-7f);
#pragma GCC unroll 10
    for (int j = 0; j < CHAINS; j++) v[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < n_iter; i++) {
#pragma GCC unroll 10
        for (int j = 0; j < CHAINS; j++) v[j] = _mm256_fmadd_ps(v[j], m, d);
    }
    __m256 s = v[0];
#pragma GCC unroll 10
    for (int j = 1; j < CHAINS; j++) s = _mm256_add_ps(s, v[j]);
    *sink = hsum(s);
    return 2.0 * 8.0 * CHAINS * (double)n_iter;
}

/* 8 x 8 blocks through registers (unpack, shuffle, 128-bit swap), so that
 * each token's 8 rows go out as one 32-byte store: the scalar loop's one
 * store per value filled the store queue while its lines came in from
 * memory (E2B mlp up x 512 tokens, bf16, one thread: the store was ~5% of
 * the product, now ~2.5%). Edges: the scalar loop. */
void cpu_store_transposed_avx2(float *out, int64_t ldo, const float *acc, int64_t ldc, int64_t n_rows, int64_t n_tok) {
    const int64_t rows8 = n_rows / 8 * 8, tok8 = n_tok / 8 * 8;
    for (int64_t t = 0; t < tok8; t += 8)
        for (int64_t i = 0; i < rows8; i += 8) {
            __m256 r[8], u[8], v[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(acc + (i + k) * ldc + t);
#pragma GCC unroll 4
            for (int k = 0; k < 8; k += 2) {
                u[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                u[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
            }
#pragma GCC unroll 2
            for (int k = 0; k < 8; k += 4) {
                v[k] = _mm256_shuffle_ps(u[k], u[k + 2], 0x44);
                v[k + 1] = _mm256_shuffle_ps(u[k], u[k + 2], 0xee);
                v[k + 2] = _mm256_shuffle_ps(u[k + 1], u[k + 3], 0x44);
                v[k + 3] = _mm256_shuffle_ps(u[k + 1], u[k + 3], 0xee);
            }
            /* v[j] (j < 4) holds tokens j and 4 + j of rows i..i+3 in its
             * halves, v[4 + j] those of rows i+4..i+7 */
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                _mm256_storeu_ps(out + (t + j) * ldo + i, _mm256_permute2f128_ps(v[j], v[4 + j], 0x20));
                _mm256_storeu_ps(out + (t + 4 + j) * ldo + i, _mm256_permute2f128_ps(v[j], v[4 + j], 0x31));
            }
        }
    for (int64_t t = 0; t < n_tok; t++) {
        const int64_t i0 = t < tok8 ? rows8 : 0;
        for (int64_t i = i0; i < n_rows; i++) out[t * ldo + i] = acc[i * ldc + t];
    }
}

static int x_interleave(const g4_matrix *w) {
    (void)w;
    return 0;
}

const cpu_kernel_table cpu_kernels_avx2 = {
    .isa = CPU_ISA_AVX2,
    .gemv = gemv,
    .dequant_row = dequant_row,
    .gemm_micro = gemm_micro,
    .gemm_micro_half = gemm_micro_half,
    .prefill_min_tokens = 8,
    .mr = MR,
    .nr = NR,
    .gemm_micro_f64 = gemm_micro_f64,
    .f64_mr = F64_MR,
    .f64_nr = 8,
    .max_tok = MAX_TOK,
    .x_interleave = x_interleave,
    .lanes = 8,
    .store_transposed = cpu_store_transposed_avx2,
    .read_sum = read_sum,
    .fma_burn = fma_burn,
};
