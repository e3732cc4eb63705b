/* AVX-512 (F/BW/VL/DQ) kernels. Built with the AVX-512 flags (file suffix);
 * only reached when the processor has them (cpu_isa.c).
 *
 * Decode, 4-bit codes (AFFINE 4 and MXFP4): x arrives interleaved (see
 * cpu_interleave_x) so that a 64-byte load of 128 codes needs only a shift
 * per 16 codes before vpermps maps the low 4 bits to a float (0..15 for
 * AFFINE, the E2M1 values for MXFP4): no integer conversion, no lane
 * crossing. 8-bit codes widen with vpmovzxbd; other widths pick their bytes
 * with vpshufb and shift them into place with vpsrlvd. The affine scale
 * multiplies a whole group's dot product and the bias meets a precomputed
 * group sum of x, so the inner loop is decode + FMA. For one token, 4-bit rows
 * go four at a time so that each x vector loaded feeds four FMAs.
 *
 * Prefill: an 8-row x 32-token FMA micro-kernel over dequantised tiles. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef enum { Q_AFFINE4, Q_AFFINE8, Q_AFFINE_ANY, Q_MXFP4 } quant_kind;
typedef enum { F_F32, F_BF16, F_F16 } float_kind;

/* Scale/bias parameters are converted to float a segment of groups at a time. */
enum { PARAM_SEGMENT = 256 };
/* Decode takes up to this many rows at once (see gemv_quant), prefetching
 * each row's stream this far ahead. */
enum { MAX_R = 4, PREFETCH_BYTES = 2048 };

static const float affine4_table[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const float e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Constants for decoding 32-code blocks, set up once per call. */
typedef struct {
    __m512 table;             /* 4-bit code -> float */
    __m512i word_lo, word_hi; /* vpermd: lane k takes 32-bit word k/8 (lo) or 2 + k/8 (hi) */
    __m512i nibble_shift;     /* 4 * (k % 8) */
    __m512i byte_pick;        /* any bits: pshufb picking the 2 bytes that hold code k */
    __m512i bit_shift;        /* any bits: (k * bits) % 8 */
    __m512i code_mask;
    __mmask16 half_bytes;     /* any bits: the 2*bits bytes of 16 codes */
    __m512i lane_group;       /* 4-bit wide loads: lane i holds codes of group 8i / group_size of the block */
    int bits;
} decoder;

static decoder make_decoder(const g4_matrix *w, quant_kind kind) {
    decoder d;
    memset(&d, 0, sizeof d);
    d.bits = w->bits;
    d.table = _mm512_loadu_ps(kind == Q_MXFP4 ? e2m1_table : affine4_table);
    d.word_lo = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    d.word_hi = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    d.nibble_shift = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    int32_t lane_group[16];
    for (int i = 0; i < 16; i++) lane_group[i] = w->group_size > 0 ? 8 * i / w->group_size : 0;
    d.lane_group = _mm512_loadu_si512(lane_group);
    if (kind == Q_AFFINE_ANY) {
        int bits = w->bits;
        uint32_t pick[16];
        int32_t shift[16];
        for (int k = 0; k < 16; k++) {
            int bit = k * bits, byte = bit / 8;
            /* bytes byte, byte+1 into the low half of dword k (pshufb works per
             * 128-bit lane on a copy of all 16 bytes; 0x80 gives zero) */
            pick[k] = (uint32_t)byte | (uint32_t)(byte + 1) << 8 | 0x80u << 16 | 0x80u << 24;
            shift[k] = bit % 8;
        }
        d.byte_pick = _mm512_loadu_si512(pick);
        d.bit_shift = _mm512_loadu_si512(shift);
        d.code_mask = _mm512_set1_epi32((1 << bits) - 1);
        d.half_bytes = (__mmask16)((1u << (2 * bits)) - 1u);
    }
    return d;
}

/* Codes 0..15 and 16..31 of the 32-code block at p, as floats. */
ALWAYS_INLINE void decode_block(const decoder *d, const unsigned char *p, quant_kind kind, __m512 *q0, __m512 *q1) {
    if (kind == Q_AFFINE4 || kind == Q_MXFP4) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
        __m512i lo = _mm512_srlv_epi32(_mm512_permutexvar_epi32(d->word_lo, v), d->nibble_shift);
        __m512i hi = _mm512_srlv_epi32(_mm512_permutexvar_epi32(d->word_hi, v), d->nibble_shift);
        *q0 = _mm512_permutexvar_ps(lo, d->table);
        *q1 = _mm512_permutexvar_ps(hi, d->table);
    } else if (kind == Q_AFFINE8) {
        *q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
        *q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    } else {
        const int half = 2 * d->bits; /* bytes of 16 codes */
        __m512i v0 = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(d->half_bytes, p));
        __m512i v1 = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(d->half_bytes, p + half));
        v0 = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(v0, d->byte_pick), d->bit_shift), d->code_mask);
        v1 = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(v1, d->byte_pick), d->bit_shift), d->code_mask);
        *q0 = _mm512_cvtepi32_ps(v0);
        *q1 = _mm512_cvtepi32_ps(v1);
    }
}

static __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* dst[i] = parameter g0 + i of one row, for i < n. */
static void load_params(const void *base, g4_dtype dt, int is_e8m0, int64_t g0, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v;
        if (is_e8m0) {
            __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, (const uint8_t *)base + g0 + i));
            __m512i f = _mm512_slli_epi32(e, 23);
            f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                      _mm512_set1_epi32(0x00400000));
            f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)),
                                      _mm512_set1_epi32(0x7fc00000));
            v = _mm512_castsi512_ps(f);
        } else if (dt == G4_DTYPE_BF16) {
            __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)base + g0 + i);
            v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        } else if (dt == G4_DTYPE_F16) {
            v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)base + g0 + i));
        } else {
            v = _mm512_maskz_loadu_ps(m, (const float *)base + g0 + i);
        }
        _mm512_mask_storeu_ps(dst + i, m, v);
    }
}

static float dot_n(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Step s of a 64-byte load of 4-bit codes: lane i gets code 8i + s as a
 * float (AFFINE: the code; MXFP4: its E2M1 value). vpermps reads only the
 * low 4 bits of each index, so a shift is all the unpacking needed (measured
 * faster here than and + vcvtdq2ps, and than widening bytes first). */
ALWAYS_INLINE __m512 wide_step(const decoder *d, __m512i v, int s) {
    return _mm512_permutexvar_ps(s ? _mm512_srli_epi32(v, (unsigned)(4 * s)) : v, d->table);
}

/* R rows of W against T tokens (see gemv_quant for when R > 1). */
ALWAYS_INLINE void quant_rows(const cpu_gemv_args *a, const decoder *d, int64_t r, quant_kind kind, const int T,
                              const int R) {
    const g4_matrix *w = a->w;
    const int64_t cols = w->cols, gs = w->group_size, n_groups = cols / gs, blocks_per_group = gs / 32;
    const int64_t block_bytes = 4 * w->bits; /* 32 codes */
    const int affine = kind != Q_MXFP4;
    /* 4-bit codes: columns [0, wide_cols) go 128 at a time against interleaved x */
    const int64_t wide_codes = 128;
    const int64_t wide_cols = kind == Q_AFFINE4 || kind == Q_MXFP4 ? cpu_wide_cols(w, 8, 16) : 0;
    const int64_t unit = gs > wide_codes ? gs : wide_codes; /* codes under one scale vector */
    const int U = R > 1 ? 1 : T == 1 ? 4 : T == 2 ? 2 : 1; /* accumulators per row and token */
    /* fixed-size arrays (R*T <= 8, R*T*U <= 16) that the compiler keeps in registers */
    float scale[MAX_R][PARAM_SEGMENT + 16], bias[MAX_R][PARAM_SEGMENT + 16];
    const unsigned char *row[MAX_R], *srow[MAX_R], *brow[MAX_R];
    __m512 total[MAX_R * CPU_DECODE_TOKENS];
    float bias_total[MAX_R * CPU_DECODE_TOKENS];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        row[i] = (const unsigned char *)w->data + (size_t)(r + i) * w->row_bytes;
        srow[i] = (const unsigned char *)w->scales + (size_t)(r + i) * w->scale_row_bytes;
        brow[i] = affine ? (const unsigned char *)w->biases + (size_t)(r + i) * w->scale_row_bytes : NULL;
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            total[i * T + t] = _mm512_setzero_ps();
            bias_total[i * T + t] = 0.0f;
        }
    }
    for (int64_t g0 = 0; g0 < n_groups; g0 += PARAM_SEGMENT) {
        const int64_t n = n_groups - g0 < PARAM_SEGMENT ? n_groups - g0 : PARAM_SEGMENT;
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            load_params(srow[i], w->scale_dtype, !affine, g0, n, scale[i]);
            if (affine) load_params(brow[i], w->scale_dtype, 0, g0, n, bias[i]);
        }
        const int64_t c_begin = g0 * gs, c_end = (g0 + n) * gs;
        const int64_t c_wide = c_end < wide_cols ? c_end : wide_cols;
        int64_t c = c_begin;
        /* wide part: 64-byte loads against interleaved x */
        for (; c < c_wide; c += unit) {
            __m512 acc[16];
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
#pragma GCC unroll 4
                    for (int u = 0; u < U; u++) acc[(i * T + t) * U + u] = _mm512_setzero_ps();
            for (int64_t cb = c; cb < c + unit; cb += wide_codes) {
                __m512i v[MAX_R];
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) {
                    v[i] = _mm512_loadu_si512(row[i] + cb / 2);
                    /* the hardware prefetchers lose track of several row streams */
                    if (R > 1) _mm_prefetch((const char *)row[i] + cb / 2 + PREFETCH_BYTES, _MM_HINT_T0);
                }
                const float *xc = a->x + cb;
#pragma GCC unroll 8
                for (int s = 0; s < 8; s++) {
                    __m512 q[MAX_R];
#pragma GCC unroll 4
                    for (int i = 0; i < R; i++) q[i] = wide_step(d, v[i], s);
#pragma GCC unroll 8
                    for (int t = 0; t < T; t++) {
                        const __m512 xv = _mm512_loadu_ps(xc + t * cols + 16 * s);
#pragma GCC unroll 4
                        for (int i = 0; i < R; i++) {
                            __m512 *ac = &acc[(i * T + t) * U + s % U];
                            *ac = _mm512_fmadd_ps(q[i], xv, *ac);
                        }
                    }
                }
            }
            const int64_t g = (c - c_begin) / gs;
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                const __m512 sv = gs >= wide_codes ? _mm512_set1_ps(scale[i][g])
                                                   : _mm512_permutexvar_ps(d->lane_group, _mm512_loadu_ps(scale[i] + g));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    __m512 sum = acc[(i * T + t) * U];
#pragma GCC unroll 4
                    for (int u = 1; u < U; u++) sum = _mm512_add_ps(sum, acc[(i * T + t) * U + u]);
                    total[i * T + t] = _mm512_fmadd_ps(sv, sum, total[i * T + t]);
                }
            }
        }
        /* group by group, 32 codes at a time, x in plain order */
        const int split = R == 1 && T <= 4; /* two accumulators per token: shorter FMA chains */
        for (int64_t g = (c - c_begin) / gs; g < n; g++) {
            __m512 acc0[MAX_R * CPU_DECODE_TOKENS], acc1[MAX_R * CPU_DECODE_TOKENS];
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) acc0[i * T + t] = acc1[i * T + t] = _mm512_setzero_ps();
            const int64_t c_group = (g0 + g) * gs;
            for (int64_t blk = 0; blk < blocks_per_group; blk++) {
                __m512 q0[MAX_R], q1[MAX_R];
#pragma GCC unroll 4
                for (int i = 0; i < R; i++)
                    decode_block(d, row[i] + ((g0 + g) * blocks_per_group + blk) * block_bytes, kind, &q0[i], &q1[i]);
                const float *xc = a->x + c_group + blk * 32;
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const __m512 x0 = _mm512_loadu_ps(xc + t * cols), x1 = _mm512_loadu_ps(xc + t * cols + 16);
#pragma GCC unroll 4
                    for (int i = 0; i < R; i++) {
                        const int k = i * T + t;
                        acc0[k] = _mm512_fmadd_ps(q0[i], x0, acc0[k]);
                        if (split) acc1[k] = _mm512_fmadd_ps(q1[i], x1, acc1[k]);
                        else acc0[k] = _mm512_fmadd_ps(q1[i], x1, acc0[k]);
                    }
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                const __m512 sv = _mm512_set1_ps(scale[i][g]);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const int k = i * T + t;
                    total[k] = _mm512_fmadd_ps(sv, split ? _mm512_add_ps(acc0[k], acc1[k]) : acc0[k], total[k]);
                }
            }
        }
        if (affine) {
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) bias_total[i * T + t] += dot_n(bias[i], a->xsum + t * n_groups + g0, n);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            a->out[t * a->ldo + r + i] = _mm512_reduce_add_ps(total[i * T + t]) + bias_total[i * T + t];
}

/* For one token, 4-bit rows go four at a time: the kernel is compute bound
 * there and each x vector then feeds four FMAs (measured +15% on two Zen 5
 * cores, with the software prefetch in quant_rows). From five tokens on
 * (the server's concurrent streams) two rows share each x load: 6144x1536
 * with 6 tokens, affine4 162 -> 221 GFLOP/s, mxfp4 155 -> 260, affine8 equal.
 * Everything else goes a row at a time: several interleaved row streams cost
 * the memory-bound formats (bf16, 8-bit) a third to a half of their
 * bandwidth here. */
ALWAYS_INLINE void gemv_quant(const cpu_gemv_args *a, int64_t r0, int64_t r1, quant_kind kind, const int T) {
    const int R = T == 1 && (kind == Q_AFFINE4 || kind == Q_MXFP4) ? 4 : T >= 5 ? 2 : 1;
    const decoder d = make_decoder(a->w, kind);
    int64_t r = r0;
    for (; r + R <= r1; r += R) quant_rows(a, &d, r, kind, T, R);
    for (; r < r1; r++) quant_rows(a, &d, r, kind, T, 1);
}

ALWAYS_INLINE __m512 load_weights16(const void *row, int64_t c, float_kind kind, __mmask16 m) {
    if (kind == F_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + c);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + c);
    if (kind == F_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE void float_rows(const cpu_gemv_args *a, int64_t r, float_kind kind, const int T, const int R) {
    const g4_matrix *w = a->w;
    const int64_t cols = w->cols;
    const int U = R > 1 ? 1 : T == 1 ? 4 : T == 2 ? 2 : 1; /* accumulators per row and token */
    const void *row[MAX_R];
    __m512 acc[16]; /* R*T*U <= 16: fixed size, kept in registers */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        row[i] = (const unsigned char *)w->data + (size_t)(r + i) * w->row_bytes;
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
#pragma GCC unroll 4
            for (int u = 0; u < U; u++) acc[(i * T + t) * U + u] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 16 * U <= cols; c += 16 * U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m512 wv[MAX_R];
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) wv[i] = load_weights16(row[i], c + 16 * u, kind, 0xffff);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const __m512 xv = _mm512_loadu_ps(a->x + t * cols + c + 16 * u);
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) acc[(i * T + t) * U + u] = _mm512_fmadd_ps(wv[i], xv, acc[(i * T + t) * U + u]);
            }
        }
    }
    for (; c < cols; c += 16) {
        const __mmask16 m = tail_mask(cols - c);
        __m512 wv[MAX_R];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) wv[i] = load_weights16(row[i], c, kind, m);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, a->x + t * cols + c);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) acc[(i * T + t) * U] = _mm512_fmadd_ps(wv[i], xv, acc[(i * T + t) * U]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 sum = acc[(i * T + t) * U];
#pragma GCC unroll 4
            for (int u = 1; u < U; u++) sum = _mm512_add_ps(sum, acc[(i * T + t) * U + u]);
            a->out[t * a->ldo + r + i] = _mm512_reduce_add_ps(sum);
        }
}

ALWAYS_INLINE void gemv_float(const cpu_gemv_args *a, int64_t r0, int64_t r1, float_kind kind, const int T) {
    /* one token is memory bound: one row stream at a time (see gemv_quant);
     * from five tokens on two rows share each x load (6144x1536 bf16 on two
     * Zen 5 cores: 6 tokens 89 -> 122 GFLOP/s, 8 tokens 88 -> 122; equal at 4) */
    const int R = T >= 5 ? 2 : 1;
    int64_t r = r0;
    for (; r + R <= r1; r += R) float_rows(a, r, kind, T, R);
    for (; r < r1; r++) float_rows(a, r, kind, T, 1);
}

/* The token count becomes a constant in each case, so that the accumulators
 * live in registers; one function per format keeps each one a fair size. */
ALWAYS_INLINE void gemv_quant_tokens(const cpu_gemv_args *a, int64_t r0, int64_t r1, quant_kind kind) {
    switch (a->n_tok) {
    case 1: gemv_quant(a, r0, r1, kind, 1); return;
    case 2: gemv_quant(a, r0, r1, kind, 2); return;
    case 3: gemv_quant(a, r0, r1, kind, 3); return;
    case 4: gemv_quant(a, r0, r1, kind, 4); return;
    case 5: gemv_quant(a, r0, r1, kind, 5); return;
    case 6: gemv_quant(a, r0, r1, kind, 6); return;
    case 7: gemv_quant(a, r0, r1, kind, 7); return;
    default: gemv_quant(a, r0, r1, kind, 8); return;
    }
}

ALWAYS_INLINE void gemv_float_tokens(const cpu_gemv_args *a, int64_t r0, int64_t r1, float_kind kind) {
    switch (a->n_tok) {
    case 1: gemv_float(a, r0, r1, kind, 1); return;
    case 2: gemv_float(a, r0, r1, kind, 2); return;
    case 3: gemv_float(a, r0, r1, kind, 3); return;
    case 4: gemv_float(a, r0, r1, kind, 4); return;
    case 5: gemv_float(a, r0, r1, kind, 5); return;
    case 6: gemv_float(a, r0, r1, kind, 6); return;
    case 7: gemv_float(a, r0, r1, kind, 7); return;
    default: gemv_float(a, r0, r1, kind, 8); return;
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
    const decoder d = make_decoder(w, kind);
    for (int64_t c = 0; c < nc; c += 32) {
        const int64_t g = (c0 + c) / w->group_size;
        __m512 q0, q1;
        decode_block(&d, row + (c0 + c) / 32 * block_bytes, kind, &q0, &q1);
        if (kind == Q_MXFP4) {
            __m512 s = _mm512_set1_ps(cpu_e8m0_to_f32(srow[g]));
            _mm512_storeu_ps(dst + c, _mm512_mul_ps(q0, s));
            _mm512_storeu_ps(dst + c + 16, _mm512_mul_ps(q1, s));
        } else {
            __m512 s = _mm512_set1_ps(cpu_load_param(srow, w->scale_dtype, g));
            __m512 b = _mm512_set1_ps(cpu_load_param(brow, w->scale_dtype, g));
            _mm512_storeu_ps(dst + c, _mm512_fmadd_ps(q0, s, b));
            _mm512_storeu_ps(dst + c + 16, _mm512_fmadd_ps(q1, s, b));
        }
    }
}

ALWAYS_INLINE void dequant_float(const void *row, int64_t c0, int64_t nc, float *dst, float_kind kind) {
    for (int64_t c = 0; c < nc; c += 16) {
        __mmask16 m = tail_mask(nc - c);
        _mm512_mask_storeu_ps(dst + c, m, load_weights16(row, c0 + c, kind, m));
    }
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

enum { MR = 8, NR = 32 };

/* 8 rows x 32 tokens: 16 accumulators, per k two loads of packed x and eight
 * broadcasts of weights feed 16 FMAs (J = 2); J = 1 is the 16-token block. */
ALWAYS_INLINE void gemm_block(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc, const int J) {
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m512 bk[2];
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) bk[j] = _mm512_load_ps(b + k * 16 * J + 16 * j);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const __m512 ai = _mm512_set1_ps(a[i * lda + k]);
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) acc[i][j] = _mm512_fmadd_ps(ai, bk[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            float *cij = c + i * ldc + 16 * j;
            _mm512_storeu_ps(cij, _mm512_add_ps(_mm512_loadu_ps(cij), acc[i][j]));
        }
}

static void gemm_micro(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc) {
    gemm_block(a, lda, kc, b, c, ldc, 2);
}

static void gemm_micro_half(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc) {
    gemm_block(a, lda, kc, b, c, ldc, 1);
}

/* 8 rows x 16 tokens in float64: 16 accumulators; per k two packed-x loads
 * widened to double and eight weight broadcasts (folded into the FMAs). */
enum { F64_MR = 8 };
static void gemm_micro_f64(const double *a, int64_t lda, int64_t kc, const float *b, int64_t ldb, double *c,
                           int64_t ldc) {
    __m512d acc[F64_MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < F64_MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_pd();
    for (int64_t k = 0; k < kc; k++) {
        const __m512d b0 = _mm512_cvtps_pd(_mm256_load_ps(b + k * ldb));
        const __m512d b1 = _mm512_cvtps_pd(_mm256_load_ps(b + k * ldb + 8));
#pragma GCC unroll 8
        for (int i = 0; i < F64_MR; i++) {
            const __m512d ai = _mm512_set1_pd(a[i * lda + k]);
            acc[i][0] = _mm512_fmadd_pd(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_pd(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < F64_MR; i++) {
        double *ci = c + i * ldc;
        _mm512_storeu_pd(ci, _mm512_add_pd(_mm512_loadu_pd(ci), acc[i][0]));
        _mm512_storeu_pd(ci + 8, _mm512_add_pd(_mm512_loadu_pd(ci + 8), acc[i][1]));
    }
}

static float read_sum(const float *p, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static double fma_burn(int64_t n_iter, float *sink) {
    enum { CHAINS = 12 };
    __m512 v[CHAINS];
    const __m512 m = _mm512_set1_ps(0.999999f), d = _mm512_set1_ps(1e-7f);
#pragma GCC unroll 12
    for (int j = 0; j < CHAINS; j++) v[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < n_iter; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) v[j] = _mm512_fmadd_ps(v[j], m, d);
    }
    __m512 s = v[0];
#pragma GCC unroll 12
    for (int j = 1; j < CHAINS; j++) s = _mm512_add_ps(s, v[j]);
    *sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16.0 * CHAINS * (double)n_iter;
}

static int x_interleave(const g4_matrix *w) {
    if (w->format == G4_WEIGHT_MXFP4 || (w->format == G4_WEIGHT_AFFINE && w->bits == 4)) return 8;
    return 0; /* 8-bit: widening bytes with vpmovzxbd measured faster than shifts and masks */
}

const cpu_kernel_table cpu_kernels_avx512 = {
    .isa = CPU_ISA_AVX512,
    .gemv = gemv,
    .dequant_row = dequant_row,
    .gemm_micro = gemm_micro,
    .gemm_micro_half = gemm_micro_half,
    .prefill_min_tokens = 16,
    .mr = MR,
    .nr = NR,
    .gemm_micro_f64 = gemm_micro_f64,
    .f64_mr = F64_MR,
    .f64_nr = 16,
    .max_tok = CPU_DECODE_TOKENS,
    .x_interleave = x_interleave,
    .lanes = 16,
    .store_transposed = cpu_store_transposed_avx2,
    .read_sum = read_sum,
    .fma_burn = fma_burn,
};
