/* RMSNorm and RoPE pieces shared by cuda_elementwise.cu (rmsnorm, rope,
 * rmsnorm_rope) and cuda_qkv.cu (qkv_prepare), so that every kernel that
 * normalises or rotates a head rounds exactly as the others do. */
#ifndef G4_CUDA_NORM_ROPE_CUH
#define G4_CUDA_NORM_ROPE_CUH

#include <math.h>

#include "backend/cuda/cuda_internal.cuh"

#define ROPE_MAX_PAIRS 512

struct rope_freqs {
    float inv_freq[ROPE_MAX_PAIRS];
};

/* The inverse frequencies of n_pairs (<= ROPE_MAX_PAIRS) pairs, exactly as
 * PyTorch (and the CPU backend) build them, in float32. */
static inline rope_freqs rope_freqs_of(float theta, int head_dim, int n_pairs) {
    rope_freqs f;
    for (int j = 0; j < n_pairs; j++) f.inv_freq[j] = 1.0f / powf(theta, (float)(2 * j) / (float)head_dim);
    return f;
}

/* 1 / sqrt(sum / dim + eps) from each thread's share of the sum of
 * squares (double, as the host sums), by the whole block. */
static __device__ __forceinline__ float block_inv_rms_of(double ss, int dim, float eps) {
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
    const float inv = inv_s;
    __syncthreads(); /* part and inv_s may be reused by a second call */
    return inv;
}

/* The same over a row in memory: each thread sums elements threadIdx.x,
 * + blockDim.x, ... in that order. */
static __device__ __forceinline__ float block_inv_rms(const float *xr, int dim, float eps) {
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    return block_inv_rms_of(ss, dim, eps);
}

/* One head of D values at position p, by the block: src * inv (times w if
 * given), then its first n_pairs pairs (j, j + D / 2) rotated, into dst
 * (which may be src). Rounds as rmsnorm_kernel then rope_kernel do. */
static __device__ __forceinline__ void norm_rope_head(float *dst, const float *src, const float *w, float inv, int D,
                                                      int n_pairs, float p, const rope_freqs &f) {
    const int half = D / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float a = __fmul_rn(src[j], inv), b = __fmul_rn(src[j + half], inv);
        if (w) {
            a = __fmul_rn(a, w[j]);
            b = __fmul_rn(b, w[j + half]);
        }
        if (j < n_pairs) {
            const float angle = __fmul_rn(p, f.inv_freq[j]), cs = cosf(angle), sn = sinf(angle);
            dst[j] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
            dst[j + half] = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
        } else {
            dst[j] = a;
            dst[j + half] = b;
        }
    }
    if ((D & 1) && threadIdx.x == 0) { /* an odd last element is only normalised */
        const int i = D - 1;
        dst[i] = w ? __fmul_rn(__fmul_rn(src[i], inv), w[i]) : __fmul_rn(src[i], inv);
    }
}

#endif
