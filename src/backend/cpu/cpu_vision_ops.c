#include "backend/cpu/cpu_vision_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void cpu_affine(g4_backend *be, float *out, const float *a, float s, float b, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) out[i] = a[i] * s + b;
}

void cpu_rope_2d(g4_backend *be, float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, float theta) {
    (void)be;
    const int part = head_dim / 2, half = part / 2;
    float inv_freq[512];
    for (int j = 0; j < half && j < 512; j++) inv_freq[j] = 1.0f / powf(theta, (float)(2 * j) / (float)part);
#pragma omp parallel for schedule(static) if (n > 16)
    for (int t = 0; t < n; t++) {
        for (int axis = 0; axis < 2; axis++) {
            float cs[512], sn[512];
            for (int j = 0; j < half && j < 512; j++) {
                /* float32 angles, as transformers computes them */
                float angle = (float)pos_xy[2 * t + axis] * inv_freq[j];
                cs[j] = cosf(angle);
                sn[j] = sinf(angle);
            }
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)t * n_heads + h) * head_dim + axis * part;
                for (int j = 0; j < half && j < 512; j++) {
                    float a = v[j], b = v[j + half];
                    v[j] = a * cs[j] - b * sn[j];
                    v[j + half] = b * cs[j] + a * sn[j];
                }
            }
        }
    }
}

void cpu_pool_rows(g4_backend *be, float *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim,
                   float scale) {
    (void)be;
    double *acc = calloc((size_t)n_out * dim, sizeof *acc);
    if (!acc) return;
    for (int r = 0; r < n_in; r++) {
        if (slot[r] < 0 || slot[r] >= n_out) continue;
        double *o = acc + (size_t)slot[r] * dim;
        const float *x = in + (size_t)r * dim;
        for (int c = 0; c < dim; c++) o[c] += x[c];
    }
    for (size_t i = 0; i < (size_t)n_out * dim; i++) out[i] = (float)(acc[i] * scale);
    free(acc);
}
