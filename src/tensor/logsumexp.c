#include "tensor/logsumexp.h"

#include <math.h>

float g4_max_of(const float *x, size_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (size_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

double g4_log_sum_exp(const float *x, size_t n, float m) {
    double z = 0;
    const size_t block = 256;
    for (size_t i = 0; i < n; i += block) {
        size_t e = i + block < n ? i + block : n;
        float part = 0;
#pragma omp simd reduction(+ : part)
        for (size_t j = i; j < e; j++) part += g4_exp_nonpos(x[j] - m);
        z += part;
    }
    return (double)m + log(z);
}
