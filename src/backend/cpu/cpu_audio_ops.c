#include "backend/cpu/cpu_audio_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void cpu_scale_rows(g4_backend *be, float *out, const float *a, const float *s, int rows, int dim) {
    (void)be;
#pragma omp parallel for schedule(static) if ((size_t)rows * dim > 65536)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dim; c++) out[(size_t)r * dim + c] = a[(size_t)r * dim + c] * s[r];
}

void cpu_add_rows(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim) {
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dim; c++) out[(size_t)r * dim + c] = a[(size_t)r * dim + c] + v[c];
}

void cpu_clamp(g4_backend *be, float *out, const float *x, float lo, float hi, size_t n) {
    (void)be;
    /* torch.clamp: max first, then min (so lo > hi gives hi) */
    for (size_t i = 0; i < n; i++) {
        float y = x[i] < lo ? lo : x[i];
        out[i] = y > hi ? hi : y;
    }
}

void cpu_relu(g4_backend *be, float *out, const float *x, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void cpu_silu(g4_backend *be, float *out, const float *x, size_t n) {
    (void)be;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) out[i] = x[i] / (1.0f + expf(-x[i]));
}

void cpu_glu(g4_backend *be, float *out, const float *x, int rows, int dim) {
    (void)be;
#pragma omp parallel for schedule(static) if ((size_t)rows * dim > 65536)
    for (int r = 0; r < rows; r++) {
        const float *a = x + (size_t)r * 2 * dim, *g = a + dim;
        float *y = out + (size_t)r * dim;
        for (int c = 0; c < dim; c++) y[c] = a[c] / (1.0f + expf(-g[c]));
    }
}

void cpu_layer_norm(g4_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int dim,
                    float eps) {
    (void)be;
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *yr = out + (size_t)r * dim;
        double sum = 0, sq = 0;
        for (int c = 0; c < dim; c++) sum += xr[c];
        double mean = sum / dim;
        for (int c = 0; c < dim; c++) sq += ((double)xr[c] - mean) * ((double)xr[c] - mean);
        float inv = (float)(1.0 / sqrt(sq / dim + (double)eps)), mu = (float)mean;
        for (int c = 0; c < dim; c++) {
            float y = (xr[c] - mu) * inv;
            if (w) y *= w[c];
            if (b) y += b[c];
            yr[c] = y;
        }
    }
}

void cpu_conv2d(g4_backend *be, float *out, const float *x, const float *w, int H, int W, int c_in, int c_out,
                int kh, int kw, int stride, int pad) {
    (void)be;
    const int Ho = (H + 2 * pad - kh) / stride + 1, Wo = (W + 2 * pad - kw) / stride + 1;
    const size_t patch = (size_t)kh * kw * c_in;
#pragma omp parallel
    {
        /* one output pixel at a time: gather its zero-padded receptive field
         * (the same [kh][kw][c_in] order as a weight row), then one dot per
         * output channel */
        float *col = malloc(patch * sizeof *col);
#pragma omp for schedule(static)
        for (int i = 0; i < Ho; i++) {
            if (!col) continue;
            for (int j = 0; j < Wo; j++) {
                for (int a = 0; a < kh; a++) {
                    int y = i * stride - pad + a;
                    for (int bx = 0; bx < kw; bx++) {
                        int xx = j * stride - pad + bx;
                        float *dst = col + ((size_t)a * kw + bx) * c_in;
                        if (y < 0 || y >= H || xx < 0 || xx >= W)
                            memset(dst, 0, (size_t)c_in * sizeof *dst);
                        else
                            memcpy(dst, x + ((size_t)y * W + xx) * c_in, (size_t)c_in * sizeof *dst);
                    }
                }
                float *o = out + ((size_t)i * Wo + j) * c_out;
                for (int oc = 0; oc < c_out; oc++) {
                    const float *wr = w + (size_t)oc * patch;
                    float acc = 0.0f;
                    for (size_t e = 0; e < patch; e++) acc += wr[e] * col[e];
                    o[oc] = acc;
                }
            }
        }
        free(col);
    }
}

void cpu_depthwise_conv1d_causal(g4_backend *be, float *out, const float *x, const float *w, int T, int C, int K) {
    (void)be;
#pragma omp parallel for schedule(static) if ((size_t)T * C > 65536)
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                int src = t - (K - 1) + k;
                if (src >= 0) acc += w[(size_t)c * K + k] * x[(size_t)src * C + c];
            }
            o[c] = acc;
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

void cpu_chunked_attention(g4_backend *be, float *out, const float *q, const float *k, const float *v,
                           const float *rel_k, const int32_t *valid, const g4_chunked_attn_params *p) {
    (void)be;
    const int T = p->n_frames, H = p->n_heads, D = p->head_dim, Wc = p->chunk + p->past + p->future;
    const size_t row = (size_t)H * D;
#pragma omp parallel
    {
        float *logit = malloc((size_t)(Wc > 0 ? Wc : 1) * sizeof *logit);
#pragma omp for schedule(static) collapse(2)
        for (int i = 0; i < T; i++) {
            for (int h = 0; h < H; h++) {
                if (!logit) continue;
                const int w = i % p->chunk, first = i - w - p->past; /* frame of context slot 0 */
                const float *qi = q + (size_t)i * row + (size_t)h * D;
                float *oi = out + (size_t)i * row + (size_t)h * D;
                float mx = -INFINITY;
                for (int c = 0; c < Wc; c++) {
                    const int j = first + c, dist = i - j, r = c - w;
                    const int inside = j >= 0 && j < T;
                    float l = inside ? dot(qi, k + (size_t)j * row + (size_t)h * D, D) : 0.0f;
                    if (r >= 0 && r < p->n_rel) l += dot(qi, rel_k + (size_t)r * row + (size_t)h * D, D);
                    if (p->logit_cap > 0.0f) l = p->logit_cap * tanhf(l / p->logit_cap);
                    int visible = inside && valid[j] && dist <= p->max_past_dist && -dist <= p->max_future_dist;
                    if (p->invert_mask) visible = inside && !visible;
                    if (!visible) l = p->invalid_logit;
                    logit[c] = l;
                    if (l > mx) mx = l;
                }
                float sum = 0.0f;
                for (int c = 0; c < Wc; c++) {
                    logit[c] = expf(logit[c] - mx);
                    sum += logit[c];
                }
                memset(oi, 0, (size_t)D * sizeof *oi);
                for (int c = 0; c < Wc; c++) {
                    const int j = first + c;
                    if (j < 0 || j >= T) continue; /* zero value vectors */
                    const float pw = logit[c] / sum, *vj = v + (size_t)j * row + (size_t)h * D;
                    for (int d = 0; d < D; d++) oi[d] += pw * vj[d];
                }
            }
        }
        free(logit);
    }
}
