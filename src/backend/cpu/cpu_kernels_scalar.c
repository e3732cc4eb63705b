/* Portable C kernels: the same algorithms as the SIMD levels (fused decode
 * per 32-code block, bias folded through group sums of x, a register-tiled
 * prefill micro-kernel), written so that any C compiler does well with them. */
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

static const float e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Codes 32*blk .. 32*blk+31 of a row as floats (AFFINE: q; MXFP4: e2m1(q)). */
static void decode_block32(const g4_matrix *w, const unsigned char *row, int64_t blk, float *q) {
    const int bits = w->bits;
    const unsigned char *p = row + blk * 4 * bits; /* 32 codes = 4*bits bytes */
    if (w->format == G4_WEIGHT_MXFP4) {
        for (int i = 0; i < 16; i++) {
            q[2 * i] = e2m1_values[p[i] & 15];
            q[2 * i + 1] = e2m1_values[p[i] >> 4];
        }
    } else if (bits == 8) {
        for (int i = 0; i < 32; i++) q[i] = (float)p[i];
    } else if (bits == 4) {
        for (int i = 0; i < 16; i++) {
            q[2 * i] = (float)(p[i] & 15);
            q[2 * i + 1] = (float)(p[i] >> 4);
        }
    } else {
        /* 8 codes fill exactly `bits` bytes: read them as one little-endian word */
        const unsigned mask = (1u << bits) - 1u;
        for (int o = 0; o < 4; o++) {
            uint64_t word = 0;
            for (int b = 0; b < bits; b++) word |= (uint64_t)p[o * bits + b] << (8 * b);
            for (int i = 0; i < 8; i++) q[8 * o + i] = (float)((unsigned)(word >> (i * bits)) & mask);
        }
    }
}

static float row_param(const g4_matrix *w, const void *base, int64_t r, int64_t g) {
    const unsigned char *p = (const unsigned char *)base + (size_t)r * w->scale_row_bytes;
    if (w->format == G4_WEIGHT_MXFP4) return cpu_e8m0_to_f32(p[g]);
    return cpu_load_param(p, w->scale_dtype, g);
}

static void dequant_row(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, float *dst) {
    const unsigned char *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
    switch (w->format) {
    case G4_WEIGHT_F32: memcpy(dst, (const float *)row + c0, (size_t)nc * sizeof *dst); return;
    case G4_WEIGHT_BF16:
        for (int64_t c = 0; c < nc; c++) dst[c] = cpu_load_param(row, G4_DTYPE_BF16, c0 + c);
        return;
    case G4_WEIGHT_F16:
        for (int64_t c = 0; c < nc; c++) dst[c] = cpu_load_param(row, G4_DTYPE_F16, c0 + c);
        return;
    case G4_WEIGHT_AFFINE:
    case G4_WEIGHT_MXFP4: break;
    }
    for (int64_t c = 0; c < nc; c += 32) {
        int64_t g = (c0 + c) / w->group_size;
        float s = row_param(w, w->scales, r, g);
        float b = w->format == G4_WEIGHT_AFFINE ? row_param(w, w->biases, r, g) : 0.0f;
        float q[32];
        decode_block32(w, row, (c0 + c) / 32, q);
        for (int i = 0; i < 32; i++) dst[c + i] = q[i] * s + b;
    }
}

/* sum_i v[i] * x[i] over 32 values with 4 partial sums. */
static float dot32(const float *v, const float *x) {
    float s[4] = {0, 0, 0, 0};
    for (int i = 0; i < 32; i += 4)
        for (int j = 0; j < 4; j++) s[j] += v[i + j] * x[i + j];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void gemv(const cpu_gemv_args *a, int64_t r0, int64_t r1) {
    const g4_matrix *w = a->w;
    const int64_t cols = w->cols;
    const int quantised = w->format == G4_WEIGHT_AFFINE || w->format == G4_WEIGHT_MXFP4;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
        float total[CPU_DECODE_TOKENS] = {0};
        if (!quantised) {
            float v[32];
            for (int64_t c = 0; c < cols; c += 32) {
                int64_t n = cols - c < 32 ? cols - c : 32;
                dequant_row(w, r, c, n, v);
                for (int64_t i = n; i < 32; i++) v[i] = 0.0f;
                for (int t = 0; t < a->n_tok; t++) {
                    const float *xt = a->x + t * cols + c;
                    if (n == 32) {
                        total[t] += dot32(v, xt);
                    } else {
                        for (int64_t i = 0; i < n; i++) total[t] += v[i] * xt[i];
                    }
                }
            }
        } else {
            const int64_t gs = w->group_size, n_groups = cols / gs;
            for (int64_t g = 0; g < n_groups; g++) {
                float group_dot[CPU_DECODE_TOKENS] = {0};
                for (int64_t c = g * gs; c < (g + 1) * gs; c += 32) {
                    float q[32];
                    decode_block32(w, row, c / 32, q);
                    for (int t = 0; t < a->n_tok; t++) group_dot[t] += dot32(q, a->x + t * cols + c);
                }
                float s = row_param(w, w->scales, r, g);
                float b = w->format == G4_WEIGHT_AFFINE ? row_param(w, w->biases, r, g) : 0.0f;
                for (int t = 0; t < a->n_tok; t++) {
                    total[t] += s * group_dot[t];
                    if (a->xsum) total[t] += b * a->xsum[t * n_groups + g];
                }
            }
        }
        for (int t = 0; t < a->n_tok; t++) a->out[t * a->ldo + r] = total[t];
    }
}

enum { MR = 4, NR = 8 };

static inline void gemm_block(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc,
                              const int nr) {
    float acc[MR][NR] = {{0}};
    for (int64_t k = 0; k < kc; k++) {
        const float *bk = b + k * nr;
        for (int i = 0; i < MR; i++) {
            float ai = a[i * lda + k];
            for (int j = 0; j < nr; j++) acc[i][j] += ai * bk[j];
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] += acc[i][j];
}

static void gemm_micro(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc) {
    gemm_block(a, lda, kc, b, c, ldc, NR);
}

static void gemm_micro_half(const float *a, int64_t lda, int64_t kc, const float *b, float *c, int64_t ldc) {
    gemm_block(a, lda, kc, b, c, ldc, NR / 2);
}

enum { F64_MR = 4, F64_NR = 4 };

static void gemm_micro_f64(const double *a, int64_t lda, int64_t kc, const float *b, int64_t ldb, double *c,
                           int64_t ldc) {
    double acc[F64_MR][F64_NR] = {{0}};
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < F64_MR; i++)
            for (int j = 0; j < F64_NR; j++) acc[i][j] += a[i * lda + k] * (double)b[k * ldb + j];
    for (int i = 0; i < F64_MR; i++)
        for (int j = 0; j < F64_NR; j++) c[i * ldc + j] += acc[i][j];
}

static float read_sum(const float *p, int64_t n) {
    float s[8] = {0};
    for (int64_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static double fma_burn(int64_t n_iter, float *sink) {
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float m = 0.999999f, d = 1e-7f;
    for (int64_t i = 0; i < n_iter; i++)
        for (int j = 0; j < 8; j++) v[j] = v[j] * m + d;
    *sink = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    return 2.0 * 8.0 * (double)n_iter;
}

void cpu_store_transposed_ref(float *out, int64_t ldo, const float *acc, int64_t ldc, int64_t n_rows, int64_t n_tok) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n_rows; i++) out[t * ldo + i] = acc[i * ldc + t];
}

static int x_interleave(const g4_matrix *w) {
    (void)w;
    return 0;
}

const cpu_kernel_table cpu_kernels_scalar = {
    .isa = CPU_ISA_SCALAR,
    .gemv = gemv,
    .dequant_row = dequant_row,
    .gemm_micro = gemm_micro,
    .gemm_micro_half = gemm_micro_half,
    .prefill_min_tokens = 8,
    .mr = MR,
    .nr = NR,
    .gemm_micro_f64 = gemm_micro_f64,
    .f64_mr = F64_MR,
    .f64_nr = F64_NR,
    .max_tok = CPU_DECODE_TOKENS,
    .x_interleave = x_interleave,
    .lanes = 1,
    .store_transposed = cpu_store_transposed_ref,
    .read_sum = read_sum,
    .fma_burn = fma_burn,
};
