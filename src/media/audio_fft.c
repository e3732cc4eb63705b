/* Real FFT of length n through one complex FFT of length n/2: pack even and
 * odd samples as real and imaginary parts, transform (iterative radix-2),
 * then separate the two interleaved spectra. */
#include "media/audio_fft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void g4_rfft_plan_free(g4_rfft_plan *plan) {
    if (!plan) return;
    free(plan->cos_t);
    free(plan->sin_t);
    free(plan->bit_rev);
    free(plan->work);
    memset(plan, 0, sizeof *plan);
}

g4_status g4_rfft_plan_init(g4_rfft_plan *plan, int n) {
    memset(plan, 0, sizeof *plan);
    if (n < 4 || (n & (n - 1)) != 0 || n > (1 << 24))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "FFT length %d is not a power of two in [4, 2^24]", n);
    const int m = n / 2;
    plan->n = n;
    plan->cos_t = malloc((size_t)m * sizeof(double));
    plan->sin_t = malloc((size_t)m * sizeof(double));
    plan->bit_rev = malloc((size_t)m * sizeof(int));
    plan->work = malloc((size_t)n * sizeof(double));
    if (!plan->cos_t || !plan->sin_t || !plan->bit_rev || !plan->work) {
        g4_rfft_plan_free(plan);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for a %d-point FFT plan", n);
    }
    for (int k = 0; k < m; k++) {
        double angle = 2.0 * M_PI * k / n;
        plan->cos_t[k] = cos(angle);
        plan->sin_t[k] = sin(angle);
    }
    int bits = 0;
    while ((1 << bits) < m) bits++;
    for (int i = 0; i < m; i++) {
        int r = 0;
        for (int b = 0; b < bits; b++) r |= ((i >> b) & 1) << (bits - 1 - b);
        plan->bit_rev[i] = r;
    }
    return G4_OK;
}

/* In-place complex FFT of length m = n/2 on interleaved (re, im) pairs in
 * bit-reversed order; twiddles exp(-2 pi i k / s) come from the length-n
 * table at index k * n / s. */
static void complex_fft(const g4_rfft_plan *plan, double *z) {
    const int m = plan->n / 2;
    for (int size = 2; size <= m; size *= 2) {
        const int half = size / 2, stride = plan->n / size;
        for (int start = 0; start < m; start += size) {
            for (int k = 0; k < half; k++) {
                double c = plan->cos_t[k * stride], s = plan->sin_t[k * stride];
                double *a = z + 2 * (start + k), *b = z + 2 * (start + k + half);
                double tr = c * b[0] + s * b[1], ti = c * b[1] - s * b[0]; /* b * exp(-i angle) */
                b[0] = a[0] - tr;
                b[1] = a[1] - ti;
                a[0] += tr;
                a[1] += ti;
            }
        }
    }
}

void g4_rfft(g4_rfft_plan *plan, const double *x, double *re, double *im) {
    const int n = plan->n, m = n / 2;
    double *z = plan->work;
    for (int j = 0; j < m; j++) {
        int r = plan->bit_rev[j];
        z[2 * r] = x[2 * j];
        z[2 * r + 1] = x[2 * j + 1];
    }
    complex_fft(plan, z);
    /* Z = E + i O where E, O are the spectra of the even and odd samples;
     * X[k] = E[k] + exp(-2 pi i k / n) O[k]. */
    re[0] = z[0] + z[1];
    im[0] = 0.0;
    re[m] = z[0] - z[1];
    im[m] = 0.0;
    for (int k = 1; k < m; k++) {
        double zr = z[2 * k], zi = z[2 * k + 1];
        double cr = z[2 * (m - k)], ci = -z[2 * (m - k) + 1]; /* conj(Z[m - k]) */
        double er = 0.5 * (zr + cr), ei = 0.5 * (zi + ci);
        double orr = 0.5 * (zi - ci), oi = -0.5 * (zr - cr); /* (Z - conj) / 2i */
        double c = plan->cos_t[k], s = plan->sin_t[k];
        re[k] = er + c * orr + s * oi;
        im[k] = ei + c * oi - s * orr;
    }
}
