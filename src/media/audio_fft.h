/* A real-input FFT in double precision for power-of-two lengths: the 512-point
 * transform behind the log-mel features. In-tree rather than kissfft because
 * Debian's kissfft is float-only and the reference (numpy) is float32 or
 * float64 depending on the numpy version; double keeps us within ~4e-8 of
 * either, and a 512-point transform per 10 ms frame is cheap at any speed. */
#ifndef G4_MEDIA_AUDIO_FFT_H
#define G4_MEDIA_AUDIO_FFT_H

#include "base/status.h"

typedef struct {
    int n;          /* real length, a power of two >= 4 */
    double *cos_t;  /* cos(2 pi k / n), k < n/2 */
    double *sin_t;  /* sin(2 pi k / n), k < n/2 */
    int *bit_rev;   /* bit reversal permutation of n/2 indices */
    double *work;   /* 2 * (n/2) scratch values */
} g4_rfft_plan;

g4_status g4_rfft_plan_init(g4_rfft_plan *plan, int n);
void g4_rfft_plan_free(g4_rfft_plan *plan);

/* X[k] = sum_j x[j] exp(-2 pi i j k / n) for k = 0..n/2 (n/2 + 1 bins).
 * Not thread-safe per plan (it uses plan->work). */
void g4_rfft(g4_rfft_plan *plan, const double *x, double *re, double *im);

#endif
