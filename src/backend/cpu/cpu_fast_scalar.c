/* Portable C fast kernels: the reference for the SIMD ones (the same sums in
 * the same precisions), and what the scalar level runs. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_kernels.h"
#include "tensor/dtype.h"
#include "tensor/fp8.h"

static float bf16_value(uint16_t h) { return g4_bf16_to_f32(h); }

/* codes 4/8-bit, as bytes (the fast path takes no other widths) */
static void q8_codes(const g4_matrix *w, int64_t r, int64_t c0, int64_t nc, uint8_t *dst) {
    const unsigned char *row = (const unsigned char *)w->data + (size_t)r * w->row_bytes;
    if (w->bits == 8) {
        memcpy(dst, row + c0, (size_t)nc);
        return;
    }
    for (int64_t c = 0; c < nc; c += 2) {
        const unsigned char b = row[(c0 + c) / 2];
        dst[c] = b & 15;
        dst[c + 1] = b >> 4;
    }
}

static float group_param(const g4_matrix *w, const void *base, int64_t r, int64_t g) {
    return cpu_load_param((const unsigned char *)base + (size_t)r * w->scale_row_bytes, w->scale_dtype, g);
}

static void q8_gemv(const cpu_q8_gemv_args *a, int64_t r0, int64_t r1) {
    const g4_matrix *w = a->w;
    const int64_t gs = w->group_size, n_groups = w->cols / gs;
    uint8_t codes[256];
    for (int64_t r = r0; r < r1; r++) {
        float total[CPU_DECODE_TOKENS] = {0};
        for (int64_t g = 0; g < n_groups; g++) {
            int32_t isum[CPU_DECODE_TOKENS] = {0};
            for (int64_t c = g * gs; c < (g + 1) * gs; c += 256) {
                const int64_t n = (g + 1) * gs - c < 256 ? (g + 1) * gs - c : 256;
                q8_codes(w, r, c, n, codes);
                for (int t = 0; t < a->n_tok; t++) {
                    const int8_t *xq = a->x.q + t * a->x.cols + c;
                    for (int64_t k = 0; k < n; k++) isum[t] += (int32_t)codes[k] * xq[k];
                }
            }
            const float s = group_param(w, w->scales, r, g), b = group_param(w, w->biases, r, g);
            for (int t = 0; t < a->n_tok; t++) {
                const int64_t i = t * a->x.n_blocks + g;
                total[t] += s * a->x.d[i] * (float)isum[t] + b * a->x.sum[i];
            }
        }
        for (int t = 0; t < a->n_tok; t++) a->out[t * a->ldo + r] = total[t];
    }
}

enum { MR = 4, NR = 8 };

static void q8_block(const cpu_q8_tile *t, const int nb) {
    float acc[MR][NR] = {{0}};
    for (int64_t g = 0; g < t->kc / t->group; g++) {
        int32_t isum[MR][NR] = {{0}};
        for (int64_t k = g * t->group; k < (g + 1) * t->group; k++) {
            const int8_t *xk = t->x + (k / 4) * 4 * nb + k % 4;
            for (int i = 0; i < MR; i++)
                for (int j = 0; j < nb; j++) isum[i][j] += (int32_t)t->w[i * t->ldw + k] * xk[4 * j];
        }
        for (int i = 0; i < MR; i++) {
            const float s = t->scale[i * t->ldp + g], b = t->bias[i * t->ldp + g];
            for (int j = 0; j < nb; j++)
                acc[i][j] += s * t->xd[g * nb + j] * (float)isum[i][j] + b * t->xs[g * nb + j];
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < nb; j++) t->c[i * t->ldc + j] += acc[i][j];
}

static void q8_micro(const cpu_q8_tile *t) { q8_block(t, NR); }
static void q8_micro_half(const cpu_q8_tile *t) { q8_block(t, NR / 2); }

static void bf16_block(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc,
                       const int nb) {
    float acc[MR][NR] = {{0}};
    for (int64_t k = 0; k < kc; k++) {
        const uint16_t *bk = b + (k / 2) * 2 * nb + k % 2;
        for (int i = 0; i < MR; i++) {
            const float ai = bf16_value(a[i * lda + k]);
            for (int j = 0; j < nb; j++) acc[i][j] += ai * bf16_value(bk[2 * j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < nb; j++) c[i * ldc + j] += acc[i][j];
}

static void bf16_micro(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc) {
    bf16_block(a, lda, kc, b, c, ldc, NR);
}

static void bf16_micro_half(const uint16_t *a, int64_t lda, int64_t kc, const uint16_t *b, float *c, int64_t ldc) {
    bf16_block(a, lda, kc, b, c, ldc, NR / 2);
}

void cpu_attn_scores_ref(const float *q, int nq, int64_t q_stride, const float *const *rows, int n, int D,
                         float scale, float *scores) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += q[i * q_stride + d] * rows[j][d];
            scores[i * n + j] = acc * scale;
        }
}

void cpu_softmax_rows_ref(float *p, int nq, int n) {
    for (int i = 0; i < nq; i++) {
        float *row = p + (int64_t)i * n, max = row[0], total = 0.0f;
        for (int j = 1; j < n; j++) max = row[j] > max ? row[j] : max;
        for (int j = 0; j < n; j++) {
            row[j] = expf(row[j] - max);
            total += row[j];
        }
        const float inv = 1.0f / total;
        for (int j = 0; j < n; j++) row[j] *= inv;
    }
}

void cpu_attn_mix_ref(const float *p, int nq, const float *const *rows, int n, int D, float *out,
                      int64_t out_stride) {
    for (int i = 0; i < nq; i++) {
        float *o = out + i * out_stride;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = 0; j < n; j++)
            for (int d = 0; d < D; d++) o[d] += p[i * n + j] * rows[j][d];
    }
}

/* The typed rows' versions: each value converted where it is read. */
void cpu_attn_scores_bf16_ref(const float *q, int nq, int64_t q_stride, const uint16_t *const *rows, int n, int D,
                              float scale, float *scores) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += q[i * q_stride + d] * g4_bf16_to_f32(rows[j][d]);
            scores[i * n + j] = acc * scale;
        }
}

void cpu_attn_mix_bf16_ref(const float *p, int nq, const uint16_t *const *rows, int n, int D, float *out,
                           int64_t out_stride) {
    for (int i = 0; i < nq; i++) {
        float *o = out + i * out_stride;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = 0; j < n; j++)
            for (int d = 0; d < D; d++) o[d] += p[i * n + j] * g4_bf16_to_f32(rows[j][d]);
    }
}

void cpu_attn_scores_e4m3_ref(const float *q, int nq, int64_t q_stride, const uint8_t *const *rows, int n, int D,
                              float scale, float *scores) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += q[i * q_stride + d] * g4_e4m3_to_f32(rows[j][d]);
            scores[i * n + j] = acc * scale;
        }
}

void cpu_attn_mix_e4m3_ref(const float *p, int nq, const uint8_t *const *rows, int n, int D, float *out,
                           int64_t out_stride) {
    for (int i = 0; i < nq; i++) {
        float *o = out + i * out_stride;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = 0; j < n; j++)
            for (int d = 0; d < D; d++) o[d] += p[i * n + j] * g4_e4m3_to_f32(rows[j][d]);
    }
}

const cpu_fast_table cpu_fast_scalar = {
    .isa = CPU_ISA_SCALAR,
    .bf16_micro = bf16_micro,
    .bf16_micro_half = bf16_micro_half,
    .bf16_mr = MR,
    .bf16_nr = NR,
    .quantize_q8 = cpu_quantize_token_q8,
    .q8_gemv = q8_gemv,
    .q8_codes = q8_codes,
    .q8_micro = q8_micro,
    .q8_micro_half = q8_micro_half,
    .q8_mr = MR,
    .q8_nr = NR,
    .prefill_min_tokens = 8,
    .attn_scores = cpu_attn_scores_ref,
    .softmax_rows = cpu_softmax_rows_ref,
    .attn_mix = cpu_attn_mix_ref,
    .attn_scores_bf16 = cpu_attn_scores_bf16_ref,
    .attn_mix_bf16 = cpu_attn_mix_bf16_ref,
    .attn_scores_e4m3 = cpu_attn_scores_e4m3_ref,
    .attn_mix_e4m3 = cpu_attn_mix_e4m3_ref,
};
