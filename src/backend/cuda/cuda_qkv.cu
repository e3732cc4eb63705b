/* qkv_prepare: a layer's attention input in one launch. One block per
 * (token, output head): q heads go to q, k heads (normalised and rotated)
 * and v heads (normalised, no weight) to the token's cache slot, each read
 * from the merged projection's row [q | k | v]. The arithmetic is
 * rmsnorm_rope_kernel's (cuda_elementwise.cu) step by step, with its thread
 * counts, so the sums run in the same order. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv.cuh"

#define QKV_MAX_PAIRS 512

struct qkv_freqs {
    float inv_freq[QKV_MAX_PAIRS];
};

struct qkv_args {
    const float *qkv;
    float *q;
    float *kp, *vp; /* the cache pool; NULL: q only */
    const float *q_norm, *k_norm;
    const int32_t *pos, *seq;
    kv_tables tb;
    int n_q, n_kv, D, n_pairs, k_eq_v;
    size_t stride; /* floats per row of qkv */
    float eps;
};

/* 1 / sqrt(mean(x^2) + eps) of one head by the whole block, the sum of
 * squares in double (block_inv_rms of cuda_elementwise.cu). */
static __device__ float head_inv_rms(const float *x, int dim, float eps) {
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)x[i] * (double)x[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ double part[32];
    __shared__ float inv_s;
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) total += part[k];
        inv_s = (float)(1.0 / sqrt(total / dim + (double)eps));
    }
    __syncthreads();
    return inv_s;
}

__global__ void qkv_prepare_kernel(qkv_args a, qkv_freqs f) {
    pdl_wait();
    const int t = blockIdx.x, head = blockIdx.y, D = a.D, half = D / 2;
    const float *row = a.qkv + (size_t)t * a.stride;
    const float *src, *w;
    float *dst;
    int n_pairs = a.n_pairs;
    if (head < a.n_q) {
        src = row + (size_t)head * D;
        dst = a.q + ((size_t)t * a.n_q + head) * D;
        w = a.q_norm;
    } else {
        const int64_t slot = kv_slot(a.tb, a.seq[t], a.pos[t]);
        const size_t kv_row = (size_t)a.n_kv * D;
        const int h = head - a.n_q;
        if (h < a.n_kv) {
            src = row + (size_t)(a.n_q + h) * D;
            dst = a.kp + (size_t)slot * kv_row + (size_t)h * D;
            w = a.k_norm;
        } else {
            const int hv = h - a.n_kv;
            /* V, or with k_eq_v the raw K it equals */
            src = row + (size_t)(a.n_q + (a.k_eq_v ? 0 : a.n_kv) + hv) * D;
            dst = a.vp + (size_t)slot * kv_row + (size_t)hv * D;
            w = NULL;
            n_pairs = 0;
        }
    }
    const float inv = head_inv_rms(src, D, a.eps);
    const float p = (float)a.pos[t];
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float x0 = __fmul_rn(src[j], inv), x1 = __fmul_rn(src[j + half], inv);
        if (w) {
            x0 = __fmul_rn(x0, w[j]);
            x1 = __fmul_rn(x1, w[j + half]);
        }
        if (j < n_pairs) {
            const float angle = __fmul_rn(p, f.inv_freq[j]), cs = cosf(angle), sn = sinf(angle);
            dst[j] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
            dst[j + half] = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
        } else {
            dst[j] = x0;
            dst[j + half] = x1;
        }
    }
    if ((D & 1) && threadIdx.x == 0) { /* an odd last element is only normalised */
        const int i = D - 1;
        dst[i] = w ? __fmul_rn(__fmul_rn(src[i], inv), w[i]) : __fmul_rn(src[i], inv);
    }
}

void cuda_qkv_prepare(g4_backend *be, float *q, const float *qkv, const g4_qkv_params *p, void *kv,
                      const g4_attn_batch *b, int sliding) {
    cuda_ctx *c = cuda_of(be);
    const int D = p->head_dim, n = b->n_tokens;
    int n_pairs = p->n_pairs < D / 2 ? p->n_pairs : D / 2;
    if (n_pairs < 0) n_pairs = 0;
    if (n <= 0 || D <= 0 || p->n_q_heads <= 0) return;
    if (n_pairs > QKV_MAX_PAIRS) {
        cuda_fail_op(c, "qkv_prepare: %d frequency pairs exceed the supported %d", n_pairs, QKV_MAX_PAIRS);
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
    a.kp = cache ? cache->k : NULL;
    a.vp = cache ? cache->v : NULL;
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
    qkv_freqs f;
    /* exactly as PyTorch (and the CPU backend) build them, in float32 */
    for (int j = 0; j < n_pairs; j++) f.inv_freq[j] = 1.0f / powf(p->theta, (float)(2 * j) / (float)D);
    dim3 grid((unsigned)n, (unsigned)heads);
    cuda_launch(c, qkv_prepare_kernel, grid, D >= 512 ? 256 : 128, 0, a, f);
    cuda_launched(c, "qkv_prepare");
}
