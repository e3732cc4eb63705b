#include "backend/cpu/cpu_norm.h"

#include <math.h>

double cpu_row_inv_rms(const float *x, int dim, float eps) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * (double)x[i];
    return 1.0 / sqrt(ss / dim + (double)eps);
}

void cpu_rmsnorm_row(float *y, const float *x, const float *w, int dim, float eps) {
    const double inv = cpu_row_inv_rms(x, dim, eps);
    /* one rounding per output: the norm feeds every later layer */
    if (w)
        for (int i = 0; i < dim; i++) y[i] = (float)(x[i] * inv * w[i]);
    else
        for (int i = 0; i < dim; i++) y[i] = (float)(x[i] * inv);
}

void cpu_rope_inv_freq(float *inv_freq, float theta, int head_dim, int n_pairs) {
    for (int j = 0; j < n_pairs; j++) inv_freq[j] = 1.0f / powf(theta, (float)(2 * j) / (float)head_dim);
}

void cpu_rope_angles(float *cs, float *sn, int32_t pos, const float *inv_freq, int n_pairs) {
    for (int j = 0; j < n_pairs; j++) {
        float angle = (float)pos * inv_freq[j];
        cs[j] = cosf(angle);
        sn[j] = sinf(angle);
    }
}

void cpu_rope_head(float *v, int head_dim, const float *cs, const float *sn, int n_pairs) {
    const int half = head_dim / 2;
    for (int j = 0; j < n_pairs; j++) {
        float a = v[j], b = v[j + half];
        v[j] = a * cs[j] - b * sn[j];
        v[j + half] = b * cs[j] + a * sn[j];
    }
}
