/* Fast kernels for AVX2 (+FMA, F16C): the int8 products, without VNNI.
 * Built with the AVX2 flags (file suffix); the reference is
 * cpu_fast_scalar.c. vpmaddubsw + vpmaddwd + vpaddd stand in for one
 * vpdpbusd: 32 multiply-adds in three instructions, against 8 for an FMA on
 * dequantised float32 weights.
 *
 * vpmaddubsw multiplies unsigned bytes by signed bytes and adds pairs into
 * 16 bits with saturation, then vpmaddwd adds pairs of those into 32 bits.
 * 4-bit codes (0..15) against activations (-127..127) cannot saturate
 * (2 * 15 * 127). 8-bit codes could (2 * 255 * 127), so they go as
 * q - 128: its magnitude (<= 128) times the activation carrying its sign
 * (vpsignb) stays within 2 * 128 * 127; the 128 * sum(x) this leaves out is
 * folded into the bias: s*d*sum(p*q) + b*xsum = s*d*sum(p*(q-128)) + (b + 128 s)*xsum. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { PARAM_SEGMENT = 256, MAX_R = 4, PREFETCH_8BIT = 3072 };

/* 32 4-bit codes from the 16 bytes at p as bytes, in order. */
ALWAYS_INLINE __m256i nibbles_to_bytes(const unsigned char *p) {
    const __m256i t = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    /* 16-bit lane v: (v | v << 4) & 0x0f0f puts v & 15 in the low byte, v >> 4 in the high one */
    return _mm256_and_si256(_mm256_or_si256(t, _mm256_slli_epi16(t, 4)), _mm256_set1_epi16(0x0f0f));
}

/* Sum over 32 codes of code * x into 8 int32 lanes (code offset by -128 for 8 bits). */
ALWAYS_INLINE __m256i dot32(__m256i w, __m256i x, const int bits) {
    __m256i pairs;
    if (bits == 4) pairs = _mm256_maddubs_epi16(w, x);
    else pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* Sum over 64 4-bit codes (32 bytes at p) of code * x into 8 int32 lanes, x
 * in split order (cpu_split_nibble_order): the low nibbles are the even
 * columns' codes, against xe; the high ones the odd columns', against xo.
 * The two 16-bit pair sums add without overflow (2 * 2 * 15 * 127). */
ALWAYS_INLINE __m256i dot64_split(const unsigned char *p, __m256i xe, __m256i xo) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p), m = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

ALWAYS_INLINE __m256i load_codes(const unsigned char *row, int64_t c, const int bits) {
    if (bits == 4) return nibbles_to_bytes(row + c / 2);
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + c)), _mm256_set1_epi8((char)0x80));
}

static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight scales or biases of a row (g .. g+8) as floats. */
ALWAYS_INLINE __m256 load_params8(const unsigned char *p, g4_dtype dt, int64_t g) {
    if (dt == G4_DTYPE_F32) return _mm256_loadu_ps((const float *)(const void *)(p + 4 * g));
    const __m128i h = _mm_loadu_si128((const __m128i *)(p + 2 * g));
    if (dt == G4_DTYPE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* One run of 64 columns of the R rows (at p) against the T tokens (at xq)
 * into isum: set on the group's first run, added to after. */
ALWAYS_INLINE void split_run(const unsigned char *const *p, const int8_t *xq, int64_t cols, int64_t ahead,
                             __m256i *isum, const int T, const int R, const int first) {
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) _mm_prefetch((const char *)p[i] + ahead, _MM_HINT_T0);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m256i xe = _mm256_loadu_si256((const __m256i *)(xq + t * cols));
        const __m256i xo = _mm256_loadu_si256((const __m256i *)(xq + t * cols + 32));
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const __m256i d = dot64_split(p[i], xe, xo);
            isum[i * T + t] = first ? d : _mm256_add_epi32(isum[i * T + t], d);
        }
    }
}

/* The code pass of q8_rows_at over groups [g0, g0 + n) of R rows, 4-bit
 * codes against x in split order: per group, the int32 sums of its runs of
 * 64 codes, then one convert and one FMA with sd per (row, token) -- in
 * group order, so the float sums are the same whatever the group size.
 * one_run: groups of exactly 64 (MLX's default), one run each, so that the
 * loop is the bare products: no inner loop, no division for the byte offset
 * (from cache, one thread, 256 x 1536: 32.9 -> 37.2 Gweights/s for one
 * token, 4 tokens 11.4 -> 15.3; the same bits out). */
ALWAYS_INLINE void split_groups(const cpu_q8_gemv_args *a, const unsigned char *const *row, int64_t g0, int64_t n,
                                float sd[][PARAM_SEGMENT], __m256 *total, int64_t ahead, const int T, const int R,
                                const int one_run) {
    const int64_t gs = a->w->group_size, cols = a->x.cols;
    const unsigned char *p[MAX_R];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) p[i] = row[i] + g0 * gs / 2;
    const int8_t *xq = a->x.q + g0 * gs;
    for (int64_t g = 0; g < n; g++) {
        __m256i isum[4];
        split_run(p, xq, cols, ahead, isum, T, R, 1);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) p[i] += 32;
        xq += 64;
        for (int64_t j = 1; !one_run && j < gs / 64; j++) {
            split_run(p, xq, cols, ahead, isum, T, R, 0);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) p[i] += 32;
            xq += 64;
        }
#pragma GCC unroll 4
        for (int k = 0; k < R * T; k++)
            total[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_broadcast_ss(&sd[k][g]), total[k]);
    }
}

/* One run of 32 codes in order (8-bit, or 4-bit in groups of 32 or 96) of
 * the R rows against the T tokens, as split_run. */
ALWAYS_INLINE void plain_run(const unsigned char *const *p, const int8_t *xq, int64_t cols, int64_t ahead,
                             __m256i *isum, const int bits, const int T, const int R, const int first) {
    __m256i wv[MAX_R];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        wv[i] = load_codes(p[i], 0, bits);
        _mm_prefetch((const char *)p[i] + ahead, _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + t * cols));
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const __m256i d = dot32(wv[i], xv, bits);
            isum[i * T + t] = first ? d : _mm256_add_epi32(isum[i * T + t], d);
        }
    }
}

/* The same as split_groups for codes in order; runs: the group's runs of
 * 32 when fixed at compile time (2: 8-bit in groups of 64), else 0. */
ALWAYS_INLINE void plain_groups(const cpu_q8_gemv_args *a, const unsigned char *const *row, int64_t g0, int64_t n,
                                float sd[][PARAM_SEGMENT], __m256 *total, int64_t ahead, const int bits, const int T,
                                const int R, const int runs) {
    const int64_t gs = a->w->group_size, cols = a->x.cols, n_runs = runs ? runs : gs / 32, step = 32 * bits / 8;
    const unsigned char *p[MAX_R];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) p[i] = row[i] + g0 * gs * bits / 8;
    const int8_t *xq = a->x.q + g0 * gs;
    for (int64_t g = 0; g < n; g++) {
        __m256i isum[4];
        plain_run(p, xq, cols, ahead, isum, bits, T, R, 1);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) p[i] += step;
        xq += 32;
#pragma GCC unroll 2
        for (int64_t j = 1; j < n_runs; j++) {
            plain_run(p, xq, cols, ahead, isum, bits, T, R, 0);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) p[i] += step;
            xq += 32;
        }
#pragma GCC unroll 4
        for (int k = 0; k < R * T; k++)
            total[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_broadcast_ss(&sd[k][g]), total[k]);
    }
}

/* R rows against T tokens (R * T <= 4). Per run of up to PARAM_SEGMENT
 * groups, first each (row, token)'s scale products s * d into sd and its
 * bias term b * xsum summed, eight groups at a time; then the codes, whose
 * int32 group sums need only a convert and an FMA with a broadcast of sd. */
ALWAYS_INLINE void q8_rows_at(const cpu_q8_gemv_args *a, int64_t r, const int bits, const int T, const int R,
                              const int split) {
    const g4_matrix *w = a->w;
    const g4_dtype dt = w->scale_dtype;
    const int64_t gs = w->group_size, n_groups = w->cols / gs;
    const unsigned char *row[MAX_R], *srow[MAX_R], *brow[MAX_R];
    /* Software prefetch: rows are short (1-3 KB), too short for the hardware
     * prefetchers to learn R streams at once. 4-bit: the same bytes of the
     * next R rows; 8-bit (one row at a time): PREFETCH_8BIT bytes ahead.
     * Against none, from memory on one thread (E2B mlp up and down,
     * bench/RESULTS.md, issue 26): 8-bit 1.2-1.7x; 4-bit one row at a time
     * (two or more tokens) 1.02-1.35x. */
    const int64_t ahead = bits == 8 ? PREFETCH_8BIT : (int64_t)R * (int64_t)w->row_bytes;
    float sd[4][PARAM_SEGMENT], bias_tail[4];
    __m256 total[4], bias_total[4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        row[i] = (const unsigned char *)w->data + (size_t)(r + i) * w->row_bytes;
        srow[i] = (const unsigned char *)w->scales + (size_t)(r + i) * w->scale_row_bytes;
        brow[i] = (const unsigned char *)w->biases + (size_t)(r + i) * w->scale_row_bytes;
    }
#pragma GCC unroll 4
    for (int k = 0; k < R * T; k++) total[k] = bias_total[k] = _mm256_setzero_ps(), bias_tail[k] = 0.0f;
    for (int64_t g0 = 0; g0 < n_groups; g0 += PARAM_SEGMENT) {
        const int64_t n = n_groups - g0 < PARAM_SEGMENT ? n_groups - g0 : PARAM_SEGMENT;
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            int64_t g = 0;
            for (; g + 8 <= n; g += 8) {
                const __m256 sc = load_params8(srow[i], dt, g0 + g);
                __m256 bi = load_params8(brow[i], dt, g0 + g);
                if (bits == 8) bi = _mm256_fmadd_ps(_mm256_set1_ps(128.0f), sc, bi);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const int64_t xi = t * a->x.n_blocks + g0 + g;
                    _mm256_storeu_ps(sd[i * T + t] + g, _mm256_mul_ps(sc, _mm256_loadu_ps(a->x.d + xi)));
                    bias_total[i * T + t] = _mm256_fmadd_ps(bi, _mm256_loadu_ps(a->x.sum + xi), bias_total[i * T + t]);
                }
            }
            for (; g < n; g++) {
                const float sc = cpu_load_param(srow[i], dt, g0 + g);
                const float bi = cpu_load_param(brow[i], dt, g0 + g) + (bits == 8 ? 128.0f * sc : 0.0f);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const int64_t xi = t * a->x.n_blocks + g0 + g;
                    sd[i * T + t][g] = sc * a->x.d[xi];
                    bias_tail[i * T + t] += bi * a->x.sum[xi];
                }
            }
        }
        if (split && gs == 64) split_groups(a, row, g0, n, sd, total, ahead, T, R, 1);
        else if (split) split_groups(a, row, g0, n, sd, total, ahead, T, R, 0);
        else if (bits == 8 && gs == 64) plain_groups(a, row, g0, n, sd, total, ahead, 8, T, R, 2);
        else plain_groups(a, row, g0, n, sd, total, ahead, bits, T, R, 0);
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            a->out[t * a->ldo + r + i] =
                hsum(total[i * T + t]) + (hsum(bias_total[i * T + t]) + bias_tail[i * T + t]);
}

/* One token of 4-bit weights: two rows at once (each x vector feeds two
 * products); 8-bit weights and more tokens: a row at a time (up to 4 tokens a
 * pass), so that each thread reads one sequential stream. Four interleaved
 * rows, measured on E2B mlx4/mlx8 decode (bench/RESULTS.md, issue 26), lost
 * 20-30% to the memory system. */
ALWAYS_INLINE void q8_rows(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1, const int bits, const int T) {
    const int R = T == 1 && bits == 4 ? 2 : 1;
    const int split = bits == 4 && a->w->group_size % 64 == 0;
    int64_t r = r0;
    if (split) {
        for (; r + R <= r1; r += R) q8_rows_at(a, r, 4, T, R, 1);
        for (; r < r1; r++) q8_rows_at(a, r, 4, T, 1, 1);
        return;
    }
    for (; r + R <= r1; r += R) q8_rows_at(a, r, bits, T, R, 0);
    for (; r < r1; r++) q8_rows_at(a, r, bits, T, 1, 0);
}

ALWAYS_INLINE void q8_tokens(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1, const int bits) {
    for (int t0 = 0; t0 < a->n_tok; t0 += 4) {
        cpu_q8_gemv_args b = *a;
        b.x.q += t0 * a->x.cols;
        b.x.d += t0 * a->x.n_blocks;
        b.x.sum += t0 * a->x.n_blocks;
        b.out += t0 * a->ldo;
        b.n_tok = a->n_tok - t0 < 4 ? a->n_tok - t0 : 4;
        switch (b.n_tok) {
        case 1: q8_rows(&b, r0, r1, bits, 1); break;
        case 2: q8_rows(&b, r0, r1, bits, 2); break;
        case 3: q8_rows(&b, r0, r1, bits, 3); break;
        default: q8_rows(&b, r0, r1, bits, 4); break;
        }
    }
}

static void q8_gemv(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1) {
    if (a->w->bits == 4) q8_tokens(a, r0, r1, 4);
    else q8_tokens(a, r0, r1, 8);
}

static int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* cpu_quantize_token_q8 eight lanes at a time, 32 values a step (blocks are
 * multiples of 32): the same operations on the same values (vcvtps2dq
 * rounds to nearest even, as the reference does), so the same bytes. */
static void quantize_q8(const float *x, int64_t cols, int block, int8_t *q, float *d, float *sum) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < cols / block; b++) {
        const float *xb = x + b * block;
        __m256 m = _mm256_setzero_ps();
        /* |x| first: a NaN lane leaves m as it was, as in the reference */
        for (int i = 0; i < block; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), sign), m);
        const float amax = hmax(m);
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m256 iv = _mm256_set1_ps(inv);
        __m256i s = _mm256_setzero_si256();
        for (int i = 0; i < block; i += 32) {
            __m256i v[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * k), iv));
                v[k] = _mm256_min_epi32(_mm256_max_epi32(v[k], lo), hi);
                s = _mm256_add_epi32(s, v[k]);
            }
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(q + b * block + i), _mm256_permutevar8x32_epi32(bytes, order));
        }
        d[b] = scale;
        sum[b] = scale * (float)hsum_i32(s);
    }
}

/* The codes of W[r][c0 .. c0+nc) as bytes: 4-bit codes as they are, 8-bit
 * ones as q - 128 (signed; see dot32). */
static void q8_codes(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, uint8_t *dst) {
    const unsigned char *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
    for (int64_t c = 0; c < nc; c += 32) {
        const __m256i v = w->bits == 4 ? load_codes(row, c0 + c, 4) : load_codes(row, c0 + c, 8);
        _mm256_storeu_si256((__m256i *)(dst + c), v);
    }
}

static int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

enum { Q8_MR = 4, Q8_NR = 16 };

/* 4 rows x 8*J tokens (cpu_q8_tile): per four columns, J loads of packed x
 * (four bytes of each of 8 tokens) and one broadcast of each row's four code
 * bytes feed 4*J int8 dot products into int32 sums. At the end of each group
 * the sums meet the row's scale times each token's, and the bias (plus
 * 128 * scale for 8-bit codes stored as q - 128) each token's group sum; the
 * float accumulators live in c (L1), which leaves registers for the sums. */
ALWAYS_INLINE void q8_block(const cpu_q8_tile *t, const int J, const int bits) {
    const int nb = 8 * J;
    const int64_t n_groups = t->kc / t->group;
    for (int64_t g = 0; g < n_groups; g++) {
        __m256i isum[Q8_MR][2];
#pragma GCC unroll 4
        for (int i = 0; i < Q8_MR; i++)
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) isum[i][j] = _mm256_setzero_si256();
        const int8_t *xg = t->x + g * t->group * nb;
        const uint8_t *wg = t->w + g * t->group;
        if (bits == 4) {
            /* 4-bit codes: eight steps' pair sums add up in 16 bits
             * (8 * 2 * 15 * 127 < 2^15) before one vpmaddwd widens them */
            for (int64_t k0 = 0; k0 < t->group / 4; k0 += 8) {
                __m256i pairs[Q8_MR][2];
#pragma GCC unroll 4
                for (int i = 0; i < Q8_MR; i++)
#pragma GCC unroll 2
                    for (int j = 0; j < J; j++) pairs[i][j] = _mm256_setzero_si256();
                for (int64_t k4 = k0; k4 < k0 + 8; k4++) {
                    __m256i xv[2];
#pragma GCC unroll 2
                    for (int j = 0; j < J; j++) xv[j] = _mm256_loadu_si256((const __m256i *)(xg + k4 * 4 * nb + 32 * j));
#pragma GCC unroll 4
                    for (int i = 0; i < Q8_MR; i++) {
                        const __m256i wv = _mm256_set1_epi32(load_i32(wg + i * t->ldw + 4 * k4));
#pragma GCC unroll 2
                        for (int j = 0; j < J; j++)
                            pairs[i][j] = _mm256_add_epi16(pairs[i][j], _mm256_maddubs_epi16(wv, xv[j]));
                    }
                }
#pragma GCC unroll 4
                for (int i = 0; i < Q8_MR; i++)
#pragma GCC unroll 2
                    for (int j = 0; j < J; j++)
                        isum[i][j] = _mm256_add_epi32(isum[i][j], _mm256_madd_epi16(pairs[i][j], _mm256_set1_epi16(1)));
            }
        } else
            for (int64_t k4 = 0; k4 < t->group / 4; k4++) {
                __m256i xv[2];
#pragma GCC unroll 2
                for (int j = 0; j < J; j++) xv[j] = _mm256_loadu_si256((const __m256i *)(xg + k4 * 4 * nb + 32 * j));
#pragma GCC unroll 4
                for (int i = 0; i < Q8_MR; i++) {
                    const __m256i wv = _mm256_set1_epi32(load_i32(wg + i * t->ldw + 4 * k4));
#pragma GCC unroll 2
                    for (int j = 0; j < J; j++) isum[i][j] = _mm256_add_epi32(isum[i][j], dot32(wv, xv[j], bits));
                }
            }
        __m256 dv[2], sv[2];
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            dv[j] = _mm256_loadu_ps(t->xd + g * nb + 8 * j);
            sv[j] = _mm256_loadu_ps(t->xs + g * nb + 8 * j);
        }
#pragma GCC unroll 4
        for (int i = 0; i < Q8_MR; i++) {
            const float scale = t->scale[i * t->ldp + g];
            const float bias = t->bias[i * t->ldp + g] + (bits == 8 ? 128.0f * scale : 0.0f);
            const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(bias);
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) {
                float *cij = t->c + i * t->ldc + 8 * j;
                __m256 acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][j]), _mm256_mul_ps(s, dv[j]), _mm256_loadu_ps(cij));
                _mm256_storeu_ps(cij, _mm256_fmadd_ps(b, sv[j], acc));
            }
        }
    }
}

static void q8_micro(const cpu_q8_tile *t) {
    if (t->bits == 4) q8_block(t, 2, 4);
    else q8_block(t, 2, 8);
}

static void q8_micro_half(const cpu_q8_tile *t) {
    if (t->bits == 4) q8_block(t, 1, 4);
    else q8_block(t, 1, 8);
}

/* Attention in float32 for nq query heads of one KV head (D a multiple of
 * 8): each key row loaded serves all of them. */
ALWAYS_INLINE void scores_block(const float *q, int64_t q_stride, const float *const *rows, int n, int D, float scale,
                                float *scores, const int NQ) {
    for (int j = 0; j < n; j++) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[i] = _mm256_setzero_ps();
        const float *k = rows[j];
        for (int d = 0; d < D; d += 8) {
            const __m256 kv = _mm256_loadu_ps(k + d);
#pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * q_stride + d), kv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) scores[i * n + j] = hsum(acc[i]) * scale;
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
 * polynomial for e^r (relative error ~1e-7), times 2^n built in the exponent
 * bits. x is clamped to [-87, 88] so that 2^n stays a normal float: below,
 * e^x < 1.7e-38 (nothing beside the 1 of a softmax row's maximum); above, it
 * stays finite (3e38), and x / (1 + e^x) in GELU is still -0. */
ALWAYS_INLINE __m256 exp_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
}

/* The first n of 8 lanes (n < 8: the tail of a row). */
ALWAYS_INLINE __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static void softmax_rows(float *p, int nq, int n) {
    for (int i = 0; i < nq; i++) {
        float *row = p + (int64_t)i * n;
        float max = -INFINITY;
        for (int j = 0; j < n; j++) max = row[j] > max ? row[j] : max;
        const __m256 mv = _mm256_set1_ps(max);
        __m256 total = _mm256_setzero_ps();
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv));
            _mm256_storeu_ps(row + j, e);
            total = _mm256_add_ps(total, e);
        }
        if (j < n) {
            const __m256i m = tail_mask(n - j);
            const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(_mm256_maskload_ps(row + j, m), mv)), _mm256_castsi256_ps(m));
            _mm256_maskstore_ps(row + j, m, e);
            total = _mm256_add_ps(total, e);
        }
        const float inv = 1.0f / hsum(total);
        for (j = 0; j < n; j++) row[j] *= inv;
    }
}

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 * written as x / (1 + exp(-2u)): the same function with one exp. */
ALWAYS_INLINE __m256 gelu_mul8(__m256 x, __m256 u) {
    const __m256 k = _mm256_set1_ps(-2.0f * 0.7978845608028654f), c = _mm256_set1_ps(0.044715f);
    const __m256 inner = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(c, x), _mm256_mul_ps(x, x), x));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_ps(inner))), u);
}

static void gelu_mul(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, gelu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        const __m256i m = tail_mask((int)(n - i));
        _mm256_maskstore_ps(out + i, m, gelu_mul8(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
    }
}

/* tanh(u) for 8 lanes: near zero (|u| < 0.4) its odd Taylor series to
 * u^11 (the next term is below 3e-8 u there), elsewhere (1 - e) / (1 + e)
 * with e = exp(-2|u|), which no longer cancels; the sign put back. NaN
 * stays NaN; +-inf give +-1. */
ALWAYS_INLINE __m256 tanh_ps(__m256 u) {
    const __m256 sign = _mm256_set1_ps(-0.0f), a = _mm256_andnot_ps(sign, u);
    const __m256 e = exp_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f), a)), one = _mm256_set1_ps(1.0f);
    const __m256 far = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 u2 = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-1382.0f / 155925.0f);
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(62.0f / 2835.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, u2, _mm256_set1_ps(-1.0f / 3.0f));
    const __m256 near = _mm256_fmadd_ps(_mm256_mul_ps(p, u2), a, a);
    const __m256 t = _mm256_blendv_ps(far, near, _mm256_cmp_ps(a, _mm256_set1_ps(0.4f), _CMP_LT_OQ));
    const __m256 signed_t = _mm256_or_ps(t, _mm256_and_ps(sign, u));
    return _mm256_blendv_ps(signed_t, u, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
}

void cpu_softcap_avx2(float *x, int64_t n, float cap) {
    const __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv))));
    if (i < n) {
        const __m256i m = tail_mask((int)(n - i));
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(c, tanh_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv))));
    }
}

/* 8 * W columns of every head in registers at a time, over all rows (W = 2
 * for up to 4 heads; 8 heads leave registers for one vector each). */
ALWAYS_INLINE void mix_block(const float *p, const float *const *rows, int n, int D, float *out, int64_t out_stride,
                             const int NQ, const int W) {
    for (int d = 0; d < D; d += 8 * W) {
        const int two = W == 2 && d + 16 <= D;
        __m256 acc[8][2];
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const __m256 v0 = _mm256_loadu_ps(rows[j] + d);
            const __m256 v1 = two ? _mm256_loadu_ps(rows[j] + d + 8) : _mm256_setzero_ps();
#pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) {
                const __m256 pj = _mm256_set1_ps(p[i * n + j]);
                acc[i][0] = _mm256_fmadd_ps(pj, v0, acc[i][0]);
                if (W == 2) acc[i][1] = _mm256_fmadd_ps(pj, v1, acc[i][1]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            _mm256_storeu_ps(out + i * out_stride + d, acc[i][0]);
            if (two) _mm256_storeu_ps(out + i * out_stride + d + 8, acc[i][1]);
        }
    }
}

static void attn_mix(const float *p, int nq, const float *const *rows, int n, int D, float *out, int64_t out_stride) {
    switch (nq) {
    case 8: mix_block(p, rows, n, D, out, out_stride, 8, 1); return;
    case 4: mix_block(p, rows, n, D, out, out_stride, 4, 2); return;
    case 2: mix_block(p, rows, n, D, out, out_stride, 2, 2); return;
    case 1: mix_block(p, rows, n, D, out, out_stride, 1, 2); return;
    default:
        for (int i = 0; i < nq; i++) mix_block(p + i * n, rows, n, D, out + i * out_stride, out_stride, 1, 2);
    }
}

/* Attention over bf16 and fp8 e4m3 rows: the kernels above with each row
 * converted as it is loaded. bf16 is the high half of a float32; an e4m3
 * byte s.eeee.mmm moved to s.0eeee.mmm0000000 is an fp16 of the same value
 * times 2^-8 (subnormals included: both formats' subnormals line up), which
 * F16C converts; the 2^8 goes into the scale (scores) or the output (mix). */
enum { ROWS_BF16 = 1, ROWS_E4M3 = 2 };

ALWAYS_INLINE __m256 load_typed8(const void *row, int d, const int type) {
    if (type == ROWS_BF16) {
        const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)((const uint8_t *)row + d)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7));
    return _mm256_cvtph_ps(h);
}

ALWAYS_INLINE void scores_typed(const float *q, int64_t q_stride, const void *const *rows, int n, int D, float scale,
                                float *scores, const int NQ, const int type) {
    if (type == ROWS_E4M3) scale *= 256.0f;
    for (int j = 0; j < n; j++) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[i] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            const __m256 kv = load_typed8(rows[j], d, type);
#pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i * q_stride + d), kv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) scores[i * n + j] = hsum(acc[i]) * scale;
    }
}

ALWAYS_INLINE void scores_typed_any(const float *q, int nq, int64_t q_stride, const void *const *rows, int n, int D,
                                    float scale, float *scores, const int type) {
    switch (nq) {
    case 8: scores_typed(q, q_stride, rows, n, D, scale, scores, 8, type); return;
    case 4: scores_typed(q, q_stride, rows, n, D, scale, scores, 4, type); return;
    case 2: scores_typed(q, q_stride, rows, n, D, scale, scores, 2, type); return;
    case 1: scores_typed(q, q_stride, rows, n, D, scale, scores, 1, type); return;
    default:
        for (int i = 0; i < nq; i++)
            scores_typed(q + i * q_stride, q_stride, rows, n, D, scale, scores + i * n, 1, type);
    }
}

ALWAYS_INLINE void mix_typed(const float *p, const void *const *rows, int n, int D, float *out, int64_t out_stride,
                             const int NQ, const int W, const int type) {
    const __m256 post = _mm256_set1_ps(type == ROWS_E4M3 ? 256.0f : 1.0f);
    for (int d = 0; d < D; d += 8 * W) {
        const int two = W == 2 && d + 16 <= D;
        __m256 acc[8][2];
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const __m256 v0 = load_typed8(rows[j], d, type);
            const __m256 v1 = two ? load_typed8(rows[j], d + 8, type) : _mm256_setzero_ps();
#pragma GCC unroll 8
            for (int i = 0; i < NQ; i++) {
                const __m256 pj = _mm256_set1_ps(p[i * n + j]);
                acc[i][0] = _mm256_fmadd_ps(pj, v0, acc[i][0]);
                if (W == 2) acc[i][1] = _mm256_fmadd_ps(pj, v1, acc[i][1]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            _mm256_storeu_ps(out + i * out_stride + d, _mm256_mul_ps(acc[i][0], post));
            if (two) _mm256_storeu_ps(out + i * out_stride + d + 8, _mm256_mul_ps(acc[i][1], post));
        }
    }
}

ALWAYS_INLINE void mix_typed_any(const float *p, int nq, const void *const *rows, int n, int D, float *out,
                                 int64_t out_stride, const int type) {
    switch (nq) {
    case 8: mix_typed(p, rows, n, D, out, out_stride, 8, 1, type); return;
    case 4: mix_typed(p, rows, n, D, out, out_stride, 4, 2, type); return;
    case 2: mix_typed(p, rows, n, D, out, out_stride, 2, 2, type); return;
    case 1: mix_typed(p, rows, n, D, out, out_stride, 1, 2, type); return;
    default:
        for (int i = 0; i < nq; i++) mix_typed(p + i * n, rows, n, D, out + i * out_stride, out_stride, 1, 2, type);
    }
}

void cpu_attn_scores_bf16_avx2(const float *q, int nq, int64_t q_stride, const uint16_t *const *rows, int n, int D,
                               float scale, float *scores) {
    scores_typed_any(q, nq, q_stride, (const void *const *)rows, n, D, scale, scores, ROWS_BF16);
}

void cpu_attn_mix_bf16_avx2(const float *p, int nq, const uint16_t *const *rows, int n, int D, float *out,
                            int64_t out_stride) {
    mix_typed_any(p, nq, (const void *const *)rows, n, D, out, out_stride, ROWS_BF16);
}

void cpu_attn_scores_e4m3_avx2(const float *q, int nq, int64_t q_stride, const uint8_t *const *rows, int n, int D,
                               float scale, float *scores) {
    scores_typed_any(q, nq, q_stride, (const void *const *)rows, n, D, scale, scores, ROWS_E4M3);
}

void cpu_attn_mix_e4m3_avx2(const float *p, int nq, const uint8_t *const *rows, int n, int D, float *out,
                            int64_t out_stride) {
    mix_typed_any(p, nq, (const void *const *)rows, n, D, out, out_stride, ROWS_E4M3);
}

const cpu_fast_table cpu_fast_avx2 = {
    .isa = CPU_ISA_AVX2,
    .quantize_q8 = quantize_q8,
    .q8_gemv = q8_gemv,
    .q8_split_nibbles = 1,
    .q8_codes = q8_codes,
    .q8_micro = q8_micro,
    .q8_micro_half = q8_micro_half,
    .q8_mr = Q8_MR,
    .q8_nr = Q8_NR,
    .prefill_min_tokens = 8,
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
