/* The log-sum-exp of a float vector, computed one way everywhere: the
 * sampler's log-probabilities and the CPU backend's top_logits op call the
 * same compiled code, so a log-probability from the op's candidates is the
 * same bits as one from the full row. */
#ifndef G4_TENSOR_LOGSUMEXP_H
#define G4_TENSOR_LOGSUMEXP_H

#include <stddef.h>
#include <stdint.h>

/* exp(x) for x <= 0 (exactly 0 below -87, so exp(-inf) = 0), within 1.4
 * ulp of the true value. Branch-free (integer selects only), so loops over
 * the vocabulary vectorise; glibc's expf does not. Cephes-style: x = n ln2 + r,
 * exp(r) by a degree-6 polynomial, 2^n through the exponent bits. */
static inline float g4_exp_nonpos(float x) {
    union {
        float f;
        uint32_t u;
        int32_t i;
    } in = {x}, scale, out;
    /* a float <= 0 orders like its bits: clamp at -87 by an unsigned min */
    uint32_t keep = (uint32_t) - (int32_t)(in.u <= 0xC2AE0000u);
    in.u = in.u <= 0xC2AE0000u ? in.u : 0xC2AE0000u;
    x = in.f;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    scale.i = ((int32_t)n + 127) << 23;
    out.f = p * scale.f;
    out.u &= keep;
    return out.f;
}

/* The largest of x[0..n) (-inf for n = 0; NaN-free input). */
float g4_max_of(const float *x, size_t n);

/* m + log(sum exp(x[i] - m)) over x[0..n), m = g4_max_of(x, n) given
 * (finite): float sums of blocks of 256, the blocks added in double. */
double g4_log_sum_exp(const float *x, size_t n, float m);

#endif
