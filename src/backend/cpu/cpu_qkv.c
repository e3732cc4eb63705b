/* qkv_prepare on the CPU: each head of the merged projection's rows is
 * normalised (and rotated) straight into its destination, q into q and k, v
 * into their cache slots, through the same row helpers as the rmsnorm,
 * rmsnorm_rope and kv_store ops, so that it equals them bit for bit. */
#include "backend/cpu/cpu_qkv.h"

#include <stddef.h>
#include <stdlib.h>

#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_norm.h"

/* One head: y = rmsnorm(x) * w, then rotated when n_pairs > 0. */
static void norm_rope_head(float *y, const float *x, const float *w, int D, float eps, const float *cs,
                           const float *sn, int n_pairs) {
    cpu_rmsnorm_row(y, x, w, D, eps);
    if (n_pairs > 0) cpu_rope_head(y, D, cs, sn, n_pairs);
}

void cpu_qkv_prepare(g4_backend *be, float *q, const float *qkv, const g4_qkv_params *p, void *kv,
                     const g4_attn_batch *b, int sliding) {
    (void)be;
    const int Hq = p->n_q_heads, Hkv = kv ? p->n_kv_heads : 0, D = p->head_dim, n = b->n_tokens;
    const size_t stride = (size_t)(p->n_q_heads + (p->k_eq_v ? 1 : 2) * p->n_kv_heads) * D;
    const size_t v_off = (size_t)(Hq + (p->k_eq_v ? 0 : p->n_kv_heads)) * D; /* V, or the raw K it equals */
    int n_pairs = p->n_pairs < D / 2 ? p->n_pairs : D / 2;
    if (n_pairs > CPU_ROPE_MAX_PAIRS) n_pairs = CPU_ROPE_MAX_PAIRS;
    if (n_pairs < 0) n_pairs = 0;
    float inv_freq[CPU_ROPE_MAX_PAIRS];
    cpu_rope_inv_freq(inv_freq, p->theta, D, n_pairs);
    /* tokens in parallel for q; K and V in token order, as kv_store writes them */
#pragma omp parallel for schedule(static) if (n > 1)
    for (int t = 0; t < n; t++) {
        float cs[CPU_ROPE_MAX_PAIRS], sn[CPU_ROPE_MAX_PAIRS];
        cpu_rope_angles(cs, sn, b->pos[t], inv_freq, n_pairs);
        const float *row = qkv + (size_t)t * stride;
        for (int h = 0; h < Hq; h++)
            norm_rope_head(q + ((size_t)t * Hq + h) * D, row + (size_t)h * D, p->q_norm, D, p->eps, cs, sn,
                           n_pairs);
    }
    if (!kv || Hkv <= 0) return;
    float *kh = malloc((size_t)D * 2 * sizeof *kh);
    if (!kh) return; /* (the CPU ops cannot report; 2 x head_dim floats) */
    float *vh = kh + D;
    for (int t = 0; t < n; t++) {
        float cs[CPU_ROPE_MAX_PAIRS], sn[CPU_ROPE_MAX_PAIRS];
        cpu_rope_angles(cs, sn, b->pos[t], inv_freq, n_pairs);
        const float *row = qkv + (size_t)t * stride;
        /* normalised in float32, then rounded to the cache's type as kv_store does */
        for (int h = 0; h < Hkv; h++) {
            norm_rope_head(kh, row + (size_t)(Hq + h) * D, p->k_norm, D, p->eps, cs, sn, n_pairs);
            norm_rope_head(vh, row + v_off + (size_t)h * D, NULL, D, p->eps, cs, sn, 0);
            cpu_kv_put(kv, b, t, sliding, h, kh, vh);
        }
    }
    free(kh);
}
