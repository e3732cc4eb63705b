/* Fast kernels for AVX-512 with VNNI and BF16 (Zen 4/5, Sapphire Rapids and
 * later). Built with those flags (file suffix); only reached when the
 * processor has them (cpu_isa.c). The arithmetic is cpu_fast.h's; the
 * reference is cpu_fast_scalar.c.
 *
 * int8: vpdpbusd multiplies 4 unsigned bytes (the weight codes, 0..15 or
 * 0..255) by 4 signed bytes (the quantised activations) and adds the four
 * products to a 32-bit lane: exact, since |sum| <= 4 * 255 * 127 per
 * instruction and a group holds at most a few hundred codes. 4-bit codes are
 * unpacked to bytes in their own order (widen each byte to 16 bits, then one
 * shift, or and mask), so that activations stay in plain order.
 *
 * bf16: vdpbf16ps adds the products of two pairs of bf16 values to a float32
 * lane; each product is exact in float32. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Decode takes up to MAX_R rows at once, prefetching each row's stream this
 * far ahead. */
enum { MAX_R = 4, PREFETCH_BYTES = 2048 };

/* 2n 4-bit codes from the n bytes at p (n = 32 or 16) as bytes, in order:
 * byte v becomes the bytes v & 15, v >> 4. */
ALWAYS_INLINE __m512i nibbles_to_bytes(const unsigned char *p, int n) {
    const __m512i t = n == 32 ? _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p))
                              : _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)));
    /* 16-bit lane v: (v | v << 4) & 0x0f0f puts v & 15 in the low byte, v >> 4 in the high one */
    return _mm512_ternarylogic_epi32(t, _mm512_slli_epi16(t, 4), _mm512_set1_epi16(0x0f0f), 0xa8);
}

/* n = 64 or 32 codes at column c of row as bytes (the upper half zero for 32). */
ALWAYS_INLINE __m512i load_codes(const unsigned char *row, int64_t c, int bits, int n) {
    if (bits == 4) return nibbles_to_bytes(row + c / 2, n / 2);
    if (n == 64) return _mm512_loadu_si512(row + c);
    return _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(row + c)));
}

ALWAYS_INLINE __m512i load_x(const int8_t *p, int n) {
    if (n == 64) return _mm512_loadu_si512(p);
    return _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p));
}

static __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* g4_f32_to_bf16 16 lanes at a time, in integers as it is (vcvtneps2bf16
 * would flush subnormals). */
static void to_bf16(const float *x, int64_t n, uint16_t *dst) {
    const __m512i low = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), abs = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x40);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512i u = _mm512_maskz_loadu_epi32(m, x + i);
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(low, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        const __m512i h = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(h));
    }
}

/* cpu_quantize_token_q8 16 lanes at a time: the same operations on the same
 * values (vcvtps2dq rounds to nearest even, as the reference does), so the
 * same bytes. */
static void quantize_q8(const float *x, int64_t cols, int block, int8_t *q, float *d, float *sum) {
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < cols / block; b++) {
        const float *xb = x + b * block;
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < block; i += 16) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(xb + i), sign));
        const float amax = _mm512_reduce_max_ps(m);
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512 iv = _mm512_set1_ps(inv);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        __m512i s = _mm512_setzero_si512();
        for (int i = 0; i < block; i += 16) {
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + i), iv));
            v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
            s = _mm512_add_epi32(s, v);
            _mm_storeu_si128((__m128i *)(q + b * block + i), _mm512_cvtepi32_epi8(v));
        }
        d[b] = scale;
        sum[b] = scale * (float)_mm512_reduce_add_epi32(s);
    }
}

static void q8_codes(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, uint8_t *dst) {
    const unsigned char *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
    int64_t c = 0;
    for (; c + 64 <= nc; c += 64) _mm512_storeu_si512(dst + c, load_codes(row, c0 + c, w->bits, 64));
    if (c < nc) _mm256_storeu_si256((__m256i *)(dst + c), _mm512_castsi512_si256(load_codes(row, c0 + c, w->bits, 32)));
}

/* R rows against T tokens; step = codes per vpdpbusd (64, or 32 where the
 * group size is not a multiple of 64). Several rows at once for few tokens:
 * each x vector then feeds R products, and the R float sums are independent
 * chains (one row alone waits on the latency of its one FMA per group). A
 * group's scale and bias are read as scalars where they are used (converting
 * them a row at a time into arrays first measured as a tenth of decode). */
ALWAYS_INLINE void q8_rows_at(const cpu_q8_gemv_args *a, int64_t r, const int bits, const int T, const int R,
                              const int step) {
    const g4_matrix *w = a->w;
    const int64_t gs = w->group_size, n_groups = w->cols / gs;
    const unsigned char *row[MAX_R], *srow[MAX_R], *brow[MAX_R];
    float bias_total[MAX_R * CPU_DECODE_TOKENS];
    __m512 total[MAX_R * CPU_DECODE_TOKENS];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        row[i] = (const unsigned char *)w->data + (size_t)(r + i) * w->row_bytes;
        srow[i] = (const unsigned char *)w->scales + (size_t)(r + i) * w->scale_row_bytes;
        brow[i] = (const unsigned char *)w->biases + (size_t)(r + i) * w->scale_row_bytes;
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            total[i * T + t] = _mm512_setzero_ps();
            bias_total[i * T + t] = 0.0f;
        }
    }
    for (int64_t g = 0; g < n_groups; g++) {
        __m512i isum[MAX_R * CPU_DECODE_TOKENS];
#pragma GCC unroll 32
        for (int k = 0; k < R * T; k++) isum[k] = _mm512_setzero_si512();
        for (int64_t c = g * gs; c < (g + 1) * gs; c += step) {
            __m512i wv[MAX_R];
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                wv[i] = load_codes(row[i], c, bits, step);
                /* the hardware prefetchers lose track of several row streams */
                if (R > 1) _mm_prefetch((const char *)row[i] + c * bits / 8 + PREFETCH_BYTES, _MM_HINT_T0);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const __m512i xv = load_x(a->x.q + t * a->x.cols + c, step);
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) isum[i * T + t] = _mm512_dpbusd_epi32(isum[i * T + t], wv[i], xv);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const float s = cpu_load_param(srow[i], w->scale_dtype, g), b = cpu_load_param(brow[i], w->scale_dtype, g);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int64_t xi = t * a->x.n_blocks + g;
                const __m512 sd = _mm512_set1_ps(s * a->x.d[xi]);
                total[i * T + t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i * T + t]), sd, total[i * T + t]);
                bias_total[i * T + t] += b * a->x.sum[xi];
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            a->out[t * a->ldo + r + i] = _mm512_reduce_add_ps(total[i * T + t]) + bias_total[i * T + t];
}

ALWAYS_INLINE void q8_rows_step(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1, const int bits, const int T,
                                const int step) {
    const int R = T == 1 ? 4 : T <= 3 ? 2 : 1;
    int64_t r = r0;
    for (; r + R <= r1; r += R) q8_rows_at(a, r, bits, T, R, step);
    for (; r < r1; r++) q8_rows_at(a, r, bits, T, 1, step);
}

ALWAYS_INLINE void q8_rows(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1, const int T) {
    const int bits = a->w->bits, wide = a->w->group_size % 64 == 0;
    if (bits == 4 && wide) q8_rows_step(a, r0, r1, 4, T, 64);
    else if (bits == 4) q8_rows_step(a, r0, r1, 4, T, 32);
    else if (wide) q8_rows_step(a, r0, r1, 8, T, 64);
    else q8_rows_step(a, r0, r1, 8, T, 32);
}

/* The token count becomes a constant in each case, so that the
 * accumulators live in registers. */
static void q8_gemv(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1) {
    switch (a->n_tok) {
    case 1: q8_rows(a, r0, r1, 1); return;
    case 2: q8_rows(a, r0, r1, 2); return;
    case 3: q8_rows(a, r0, r1, 3); return;
    case 4: q8_rows(a, r0, r1, 4); return;
    case 5: q8_rows(a, r0, r1, 5); return;
    case 6: q8_rows(a, r0, r1, 6); return;
    case 7: q8_rows(a, r0, r1, 7); return;
    default: q8_rows(a, r0, r1, 8); return;
    }
}

static int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

enum { Q8_MR = 4, Q8_NR = 32 };

/* 4 rows x 16*J tokens: per four columns, J loads of packed x and 4
 * broadcasts of weight bytes feed 4*J vpdpbusd into int32 sums; at the end of
 * each group the sums turn into float with the row's scale times each
 * token's scale, and the bias meets each token's group sum. */
ALWAYS_INLINE void q8_block(const cpu_q8_tile *t, const int J) {
    const int nb = 16 * J;
    __m512 acc[Q8_MR][2];
#pragma GCC unroll 4
    for (int i = 0; i < Q8_MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) acc[i][j] = _mm512_setzero_ps();
    const int64_t n_groups = t->kc / t->group;
    for (int64_t g = 0; g < n_groups; g++) {
        __m512i isum[Q8_MR][2];
#pragma GCC unroll 4
        for (int i = 0; i < Q8_MR; i++)
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) isum[i][j] = _mm512_setzero_si512();
        const int8_t *xg = t->x + g * t->group * nb;
        const uint8_t *wg = t->w + g * t->group;
        for (int64_t k4 = 0; k4 < t->group / 4; k4++) {
            __m512i xv[2];
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) xv[j] = _mm512_loadu_si512(xg + k4 * 4 * nb + 64 * j);
#pragma GCC unroll 4
            for (int i = 0; i < Q8_MR; i++) {
                const __m512i wv = _mm512_set1_epi32(load_i32(wg + i * t->ldw + 4 * k4));
#pragma GCC unroll 2
                for (int j = 0; j < J; j++) isum[i][j] = _mm512_dpbusd_epi32(isum[i][j], wv, xv[j]);
            }
        }
        __m512 dv[2], sv[2];
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            dv[j] = _mm512_loadu_ps(t->xd + g * nb + 16 * j);
            sv[j] = _mm512_loadu_ps(t->xs + g * nb + 16 * j);
        }
#pragma GCC unroll 4
        for (int i = 0; i < Q8_MR; i++) {
            const __m512 s = _mm512_set1_ps(t->scale[i * t->ldp + g]), b = _mm512_set1_ps(t->bias[i * t->ldp + g]);
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) {
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i][j]), _mm512_mul_ps(s, dv[j]), acc[i][j]);
                acc[i][j] = _mm512_fmadd_ps(b, sv[j], acc[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < Q8_MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            float *cij = t->c + i * t->ldc + 16 * j;
            _mm512_storeu_ps(cij, _mm512_add_ps(_mm512_loadu_ps(cij), acc[i][j]));
        }
}

static void q8_micro(const cpu_q8_tile *t) { q8_block(t, 2); }
static void q8_micro_half(const cpu_q8_tile *t) { q8_block(t, 1); }

enum { BF16_MR = 8, BF16_NR = 32 };

/* 8 rows x 16*J tokens: per pair of columns, J loads of packed x and 8
 * broadcasts of weight pairs feed 8*J vdpbf16ps. */
ALWAYS_INLINE void bf16_block(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc,
                              const int J) {
    const int nb = 16 * J;
    __m512 acc[BF16_MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < BF16_MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k2 = 0; k2 < kc / 2; k2++) {
        __m512bh bv[2];
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) bv[j] = (__m512bh)_mm512_loadu_si512(b + k2 * 2 * nb + 32 * j);
#pragma GCC unroll 8
        for (int i = 0; i < BF16_MR; i++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32(load_i32(a + i * lda + 2 * k2));
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < BF16_MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            float *cij = c + i * ldc + 16 * j;
            _mm512_storeu_ps(cij, _mm512_add_ps(_mm512_loadu_ps(cij), acc[i][j]));
        }
}

static void bf16_micro(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc) {
    bf16_block(a, lda, kc, b, c, ldc, 2);
}

static void bf16_micro_half(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc) {
    bf16_block(a, lda, kc, b, c, ldc, 1);
}

/* Attention: the query heads of one KV head together, so that each K or V
 * row loaded serves all of them. */
ALWAYS_INLINE void scores_block(const float *q, int64_t q_stride, const float *const *rows, int n, int D, float scale,
                                float *scores, const int NQ) {
    for (int j = 0; j < n; j++) {
        __m512 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[i] = _mm512_setzero_ps();
        const float *k = rows[j];
        for (int d = 0; d < D; d += 16) {
            const __m512 kv = _mm512_loadu_ps(k + d);
#pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(q + i * q_stride + d), kv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) scores[i * n + j] = _mm512_reduce_add_ps(acc[i]) * scale;
    }
}

static void attn_scores(const float *q, int nq, int64_t q_stride, const float *const *rows, int n, int D, float scale,
                        float *scores) {
    switch (nq) {
    case 8: scores_block(q, q_stride, rows, n, D, scale, scores, 8); return;
    case 4: scores_block(q, q_stride, rows, n, D, scale, scores, 4); return;
    case 2: scores_block(q, q_stride, rows, n, D, scale, scores, 2); return;
    case 1: scores_block(q, q_stride, rows, n, D, scale, scores, 1); return;
    default:
        for (int i = 0; i < nq; i++) scores_block(q + i * q_stride, q_stride, rows, n, D, scale, scores + i * n, 1);
    }
}

/* exp(x) in float32: x = n ln2 + r with |r| <= ln2/2, Cephes' degree-6
 * polynomial for e^r (relative error ~1e-7), times 2^n by vscalefps (which
 * also gives 0 for very negative x; softmax arguments are <= 0). */
ALWAYS_INLINE __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

static void softmax_rows(float *p, int nq, int n) {
    for (int i = 0; i < nq; i++) {
        float *row = p + (int64_t)i * n;
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, tail_mask(n - j), row + j));
        const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        __m512 total = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) {
            const __mmask16 k = tail_mask(n - j);
            const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), max));
            _mm512_mask_storeu_ps(row + j, k, e);
            total = _mm512_add_ps(total, _mm512_maskz_mov_ps(k, e));
        }
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
        for (int j = 0; j < n; j += 16) {
            const __mmask16 k = tail_mask(n - j);
            _mm512_mask_storeu_ps(row + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), inv));
        }
    }
}

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 * written as x / (1 + exp(-2u)): the same function, one exp, and the right
 * limits (x for large x, -0 for very negative x, where exp gives inf). */
static void gelu_mul(float *out, const float *gate, const float *up, int64_t n) {
    const __m512 k = _mm512_set1_ps(-2.0f * 0.7978845608028654f), c = _mm512_set1_ps(0.044715f);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 inner = _mm512_mul_ps(k, _mm512_fmadd_ps(_mm512_mul_ps(c, x), _mm512_mul_ps(x, x), x));
        const __m512 g = _mm512_div_ps(x, _mm512_add_ps(one, exp_ps(inner)));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(g, u));
    }
}

/* 32 columns of every head at a time in registers, over all rows. */
ALWAYS_INLINE void mix_block(const float *p, const float *const *rows, int n, int D, float *out, int64_t out_stride,
                             const int NQ) {
    for (int d = 0; d < D; d += 32) {
        const int two = d + 32 <= D;
        __m512 acc[8][2];
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const __m512 v0 = _mm512_loadu_ps(rows[j] + d);
            const __m512 v1 = two ? _mm512_loadu_ps(rows[j] + d + 16) : _mm512_setzero_ps();
#pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) {
                const __m512 pj = _mm512_set1_ps(p[i * n + j]);
                acc[i][0] = _mm512_fmadd_ps(pj, v0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(pj, v1, acc[i][1]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            _mm512_storeu_ps(out + i * out_stride + d, acc[i][0]);
            if (two) _mm512_storeu_ps(out + i * out_stride + d + 16, acc[i][1]);
        }
    }
}

static void attn_mix(const float *p, int nq, const float *const *rows, int n, int D, float *out, int64_t out_stride) {
    switch (nq) {
    case 8: mix_block(p, rows, n, D, out, out_stride, 8); return;
    case 4: mix_block(p, rows, n, D, out, out_stride, 4); return;
    case 2: mix_block(p, rows, n, D, out, out_stride, 2); return;
    case 1: mix_block(p, rows, n, D, out, out_stride, 1); return;
    default:
        for (int i = 0; i < nq; i++) mix_block(p + i * n, rows, n, D, out + i * out_stride, out_stride, 1);
    }
}

const cpu_fast_table cpu_fast_avx512vnni = {
    .isa = CPU_ISA_AVX512_VNNI,
    .bf16_micro = bf16_micro,
    .bf16_micro_half = bf16_micro_half,
    .bf16_mr = BF16_MR,
    .bf16_nr = BF16_NR,
    .to_bf16 = to_bf16,
    .quantize_q8 = quantize_q8,
    .q8_gemv = q8_gemv,
    .q8_codes = q8_codes,
    .q8_micro = q8_micro,
    .q8_micro_half = q8_micro_half,
    .q8_mr = Q8_MR,
    .q8_nr = Q8_NR,
    .prefill_min_tokens = 16,
    .attn_scores = attn_scores,
    .softmax_rows = softmax_rows,
    .attn_mix = attn_mix,
    .attn_scores_bf16 = cpu_attn_scores_bf16_avx2,
    .attn_mix_bf16 = cpu_attn_mix_bf16_avx2,
    .attn_scores_e4m3 = cpu_attn_scores_e4m3_avx2,
    .attn_mix_e4m3 = cpu_attn_mix_e4m3_avx2,
    .gelu_mul = gelu_mul,
    .softcap = cpu_softcap_avx2,
};
