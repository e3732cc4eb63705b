/* A real-input FFT in double precision for power-of-two lengths: the 512-point
 * transform behind the log-mel features. In-tree rather than kissfft because
 * Debian's kissfft is float-only: on the e2b fixture, features through
 * kissfft-float differ from transformers' by 5.5e-7 (relative RMS), through
 * this double FFT by 3.8e-8 (numpy 2 itself runs the FFT in float32, numpy 1
 * in float64; double sits within 4e-8 of both). Speed is no concern: one
 * 512-point transform per 10 ms of audio. */
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
