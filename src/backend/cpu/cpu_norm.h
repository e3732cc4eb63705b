/* Per-row RMSNorm and RoPE arithmetic of the CPU backend, shared by the
 * rmsnorm/rope ops and the fused qkv_prepare so that both round exactly
 * alike (one definition, one rounding sequence). */
#ifndef G4_BACKEND_CPU_NORM_H
#define G4_BACKEND_CPU_NORM_H

#include <stdint.h>

/* Most frequency pairs a RoPE head may rotate (head_dim / 2 <= this). */
enum { CPU_ROPE_MAX_PAIRS = 1024 };

/* 1 / sqrt(mean(x^2) + eps) of one row, summed in double. */
double cpu_row_inv_rms(const float *x, int dim, float eps);
/* y = x * inv_rms(x) * w (w NULL: no scale), one rounding per element; y may be x. */
void cpu_rmsnorm_row(float *y, const float *x, const float *w, int dim, float eps);
/* The RoPE frequencies theta^(-2j/head_dim), j < n_pairs, in float32 exactly
 * as PyTorch builds them. */
void cpu_rope_inv_freq(float *inv_freq, float theta, int head_dim, int n_pairs);
/* cos and sin of pos * inv_freq[j] for j < n_pairs, in float32 (as
 * transformers, even in float64 runs: it matters at large positions). */
void cpu_rope_angles(float *cs, float *sn, int32_t pos, const float *inv_freq, int n_pairs);
/* Rotates one head in place ("rotate half": j with j + head_dim/2). */
void cpu_rope_head(float *v, int head_dim, const float *cs, const float *sn, int n_pairs);

#endif
