/* What the two tensor-core prefill attention kernels share: their
 * parameters and the power-of-two scaling and fp16 hi + lo splitting that
 * keeps their products float32-accurate (see cuda_attention_tc.cu). */
#ifndef G4_BACKEND_CUDA_ATTENTION_TC_CUH
#define G4_BACKEND_CUDA_ATTENTION_TC_CUH

#include "backend/cuda/cuda_kv.cuh"

#define TCA_P_EXP 14        /* P is stored as p * 2^14: its lo part stays normal down to p = 2^-17 */
#define TCA_V_EXP_START 100 /* the V scale before any tile (and for a tile of zeros) */

struct attn_tc_params : attn_common {
    int tiles;             /* blocks of BM query rows per KV head */
    int splits, split_len; /* key pieces per run (counted from its first key) and their length */
    float *part_acc, *part_ml; /* splits > 1: the pieces' partials (cuda_attention_merge) */
};

/* 2^e as a float, e in [-126, 127] */
__device__ __forceinline__ float tca_pow2(int e) { return __int_as_float((e + 127) << 23); }

/* e with peak * 2^e in [2^14, 2^15) (clamped to [-126, cap]); `none` for
 * a zero or non-finite peak. */
__device__ __forceinline__ int tca_exponent(float peak, int none, int cap) {
    if (!(peak > 0.0f && peak <= 3.4e38f)) return none;
    int e;
    frexpf(peak, &e); /* peak = m 2^e, m in [0.5, 1) */
    return max(-126, min(cap, 15 - e));
}

/* (a, b) = hi + lo, each an fp16 pair (a in the low half) */
__device__ __forceinline__ void tca_split(float a, float b, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

__device__ __forceinline__ float tca_absmax4(float4 v) {
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

/* the query row of block row gr (token gr / G, head kvh * G + gr % G) */
__device__ __forceinline__ const float *tca_q_row(const attn_tc_params &p, int kvh, int gr) {
    const int t = gr / p.G, h = kvh * p.G + gr % p.G;
    return p.q + ((size_t)t * p.n_heads + h) * p.D;
}

/* This block's key piece, KV head and tile of BM rows (blocks in order of
 * tile, last first; KV head; key piece: the tiles of the latest tokens,
 * which see the most keys, start first). */
__device__ __forceinline__ void tca_block(const attn_tc_params &p, int *split, int *kvh, int *tile) {
    *split = (int)(blockIdx.x % p.splits);
    *kvh = (int)(blockIdx.x / p.splits % p.n_kv);
    *tile = p.tiles - 1 - (int)(blockIdx.x / p.splits / p.n_kv);
}

/* A run's key range [*lo_u, *hi_u] narrowed to this block's piece when
 * each tile's keys are split (empty when the run has no keys there). */
__device__ __forceinline__ void tca_piece(const attn_tc_params &p, int split, int *lo_u, int *hi_u) {
    if (p.splits <= 1) return;
    if (*lo_u <= *hi_u && (int64_t)split * p.split_len <= (int64_t)(*hi_u - *lo_u)) {
        *lo_u += split * p.split_len;
        if (split + 1 < p.splits) *hi_u = (int)min((int64_t)*hi_u, (int64_t)*lo_u + p.split_len - 1);
    } else {
        *hi_u = *lo_u - 1;
    }
}

/* Launches a prefill attention kernel over p's blocks (tiles x KV heads x
 * key pieces), first opting it into the GPU's shared memory (once:
 * *configured). */
static inline void tca_launch(cuda_ctx *c, void (*kernel)(attn_tc_params), unsigned *configured,
                              const attn_tc_params &p, int threads, size_t smem, const char *name) {
    if (!cuda_done_on_device(configured, c)) {
        if (!cuda_check(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->caps.smem_optin),
                        "cudaFuncSetAttribute"))
            return;
        cuda_mark_device(configured, c);
    }
    const int64_t blocks = (int64_t)p.tiles * p.n_kv * p.splits;
    if (blocks > INT32_MAX) {
        cuda_fail_op(c, "%s: %lld blocks", name, (long long)blocks);
        return;
    }
    cuda_launch(c, kernel, dim3((unsigned)blocks), threads, smem, p);
    cuda_launched(c, name);
}

/* The flash kernel (cuda_attention_flash.cu) for these parameters, if it
 * takes head_dim D and fits this GPU's shared memory: rows per block (its
 * tiling), else 0. */
int cuda_attention_flash_rows(const cuda_ctx *c, int D);
/* Launches it (p.tiles from cuda_attention_flash_rows). */
void cuda_attention_flash(cuda_ctx *c, const attn_tc_params &p);

#endif
