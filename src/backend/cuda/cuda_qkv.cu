/* qkv_prepare: a layer's attention input in one launch. One block per
 * (token, output head): q heads go to q, k heads (normalised and rotated)
 * and v heads (normalised, no weight) to the token's cache slot, each read
 * from the merged projection's row [q | k | v]. The arithmetic is
 * rmsnorm_rope_kernel's (cuda_elementwise.cu; the same norm_rope_head of
 * cuda_norm_rope.cuh), with its thread counts, so the sums run in the same
 * order. */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_norm_rope.cuh"

struct qkv_args {
    const float *qkv;
    float *q;
    cuda_kv kv;     /* the cache pool (kv.k NULL: q only) */
    const float *q_norm, *k_norm;
    const int32_t *pos, *seq;
    kv_tables tb;
    int n_q, n_kv, D, n_pairs, k_eq_v;
    size_t stride; /* floats per row of qkv */
    float eps;
};

/* a typed cache's row, normalised in float32 before kv_put_row rounds it */
#define QKV_ROW_MAX 1024

__global__ void qkv_prepare_kernel(qkv_args a, rope_freqs f) {
    pdl_wait();
    pdl_launch_next();
    const int t = blockIdx.x, head = blockIdx.y, D = a.D;
    const float *row = a.qkv + (size_t)t * a.stride;
    if (head < a.n_q) {
        norm_rope_head(a.q + ((size_t)t * a.n_q + head) * D, row + (size_t)head * D, a.q_norm,
                       block_inv_rms(row + (size_t)head * D, D, a.eps), D, a.n_pairs, (float)a.pos[t], f);
        return;
    }
    const int64_t slot = kv_slot(a.tb, a.seq[t], a.pos[t]);
    const int h = head - a.n_q;
    const bool is_k = h < a.n_kv;
    const int hk = is_k ? h : h - a.n_kv;
    /* K, or V (with k_eq_v the raw K it equals; no weight, not rotated) */
    const float *src = row + (size_t)(a.n_q + (is_k || a.k_eq_v ? 0 : a.n_kv) + hk) * D;
    const float *w = is_k ? a.k_norm : NULL;
    const int n_pairs = is_k ? a.n_pairs : 0;
    const int64_t r = slot * a.n_kv + hk;
    const float inv = block_inv_rms(src, D, a.eps);
    if (a.kv.type == G4_KV_F32) {
        float *dst = static_cast<float *>(is_k ? a.kv.k : a.kv.v) + (size_t)r * D;
        norm_rope_head(dst, src, w, inv, D, n_pairs, (float)a.pos[t], f);
        return;
    }
    __shared__ float x[QKV_ROW_MAX];
    norm_rope_head(x, src, w, inv, D, n_pairs, (float)a.pos[t], f);
    __syncthreads();
    kv_put_row(is_k ? a.kv.k : a.kv.v, is_k ? a.kv.ks : a.kv.vs, a.kv.type, r, D, x);
}

void cuda_qkv_prepare(g4_backend *be, float *q, const float *qkv, const g4_qkv_params *p, void *kv,
                      const g4_attn_batch *b, int sliding) {
    cuda_ctx *c = cuda_of(be);
    const int D = p->head_dim, n = b->n_tokens;
    int n_pairs = p->n_pairs < D / 2 ? p->n_pairs : D / 2;
    if (n_pairs < 0) n_pairs = 0;
    if (n <= 0 || D <= 0 || p->n_q_heads <= 0) return;
    if (n_pairs > ROPE_MAX_PAIRS) {
        cuda_fail_op(c, "qkv_prepare: %d frequency pairs exceed the supported %d", n_pairs, ROPE_MAX_PAIRS);
        return;
    }
    const cuda_kv *cache = (const cuda_kv *)kv;
    const int n_kv = cache ? p->n_kv_heads : 0;
    if (cache && (cache->n_kv_heads != n_kv || cache->head_dim != D)) {
        cuda_fail_op(c, "qkv_prepare: cache of %d x %d, rows of %d x %d", cache->n_kv_heads, cache->head_dim, n_kv,
                     D);
        return;
    }
    const int heads = p->n_q_heads + 2 * n_kv;
    if (heads > 65535) {
        cuda_fail_op(c, "qkv_prepare: %d heads", heads);
        return;
    }
    qkv_args a;
    a.qkv = qkv;
    a.q = q;
    if (cache && cache->type != G4_KV_F32 && D > QKV_ROW_MAX) {
        cuda_fail_op(c, "qkv_prepare: head_dim %d over %d for a %s cache", D, QKV_ROW_MAX,
                     cache->type == G4_KV_BF16 ? "bf16" : "fp8");
        return;
    }
    memset(&a.kv, 0, sizeof a.kv);
    if (cache) a.kv = *cache;
    a.q_norm = p->q_norm;
    a.k_norm = p->k_norm;
    a.pos = b->pos;
    a.seq = b->seq;
    a.tb = cuda_kv_tables(b, sliding);
    a.n_q = p->n_q_heads;
    a.n_kv = n_kv;
    a.D = D;
    a.n_pairs = n_pairs;
    a.k_eq_v = p->k_eq_v;
    a.stride = (size_t)(p->n_q_heads + (p->k_eq_v ? 1 : 2) * p->n_kv_heads) * D;
    a.eps = p->eps;
    const rope_freqs f = rope_freqs_of(p->theta, D, n_pairs);
    dim3 grid((unsigned)n, (unsigned)heads);
    cuda_launch(c, qkv_prepare_kernel, grid, D >= 512 ? 256 : 128, 0, a, f);
    cuda_launched(c, "qkv_prepare");
}
