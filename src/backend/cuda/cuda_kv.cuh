/* The CUDA KV cache pool and where the block tables put a position in it;
 * shared by the attention kernels and the fused qkv_prepare. */
#ifndef G4_BACKEND_CUDA_KV_CUH
#define G4_BACKEND_CUDA_KV_CUH

#include <cuda_fp8.h>

#include "backend/cuda/cuda_internal.cuh"

/* K and V: [slot][kv head][head_dim] values of `type` (F32, BF16, or FP8
 * e4m3 with one float32 scale per (slot, kv head) row in ks / vs: the CPU
 * pool's layout and arithmetic, so the two store the same bits). */
struct cuda_kv {
    g4_kv_type type;
    void *k, *v;
    float *ks, *vs; /* FP8 only */
    int n_blocks, block_size, n_kv_heads, head_dim;
};

/* Bytes of one stored value. */
__host__ __device__ __forceinline__ int kv_value_bytes(int type) {
    return type == G4_KV_F32 ? 4 : type == G4_KV_BF16 ? 2 : 1;
}

__device__ __forceinline__ float2 kv_e4m3x2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return __half22float2(__half2(h));
}

/* Values d..d+3 (d a multiple of 4, D too) of row `row` (= slot * n_kv +
 * kv head) of a pool half as floats, converted where they are read. */
__device__ __forceinline__ float4 kv_load4(const void *pool, const float *scales, int type, int64_t row, int D,
                                           int d) {
    const int64_t off = row * D + d;
    if (type == G4_KV_BF16) {
        const uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(pool) + off);
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                           __uint_as_float(u.y & 0xffff0000u));
    }
    if (type == G4_KV_FP8) {
        const uint32_t u = *reinterpret_cast<const uint32_t *>(static_cast<const uint8_t *>(pool) + off);
        const float s = scales[row];
        const float2 a = kv_e4m3x2(u), b = kv_e4m3x2(u >> 16);
        return make_float4(a.x * s, a.y * s, b.x * s, b.y * s);
    }
    return *reinterpret_cast<const float4 *>(static_cast<const float *>(pool) + off);
}

/* One value (any d). */
__device__ __forceinline__ float kv_load1(const void *pool, const float *scales, int type, int64_t row, int D, int d) {
    const int64_t off = row * D + d;
    if (type == G4_KV_BF16) return __uint_as_float((uint32_t) static_cast<const uint16_t *>(pool)[off] << 16);
    if (type == G4_KV_FP8) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const uint8_t *>(pool)[off], __NV_E4M3);
        return __half2float(__half(h)) * scales[row];
    }
    return static_cast<const float *>(pool)[off];
}

/* g4_f32_to_bf16 (tensor/dtype.h), bit for bit */
__device__ __forceinline__ uint16_t kv_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* max that keeps a NaN (the CPU pool's peak does) */
__device__ __forceinline__ float kv_nan_max(float a, float b) { return a > b || a != a ? a : b; }

/* The whole block writes row `row` from x[0..D) (readable by every thread:
 * shared or global memory) in the pool's type. FP8: the row's peak by a
 * block reduction, scale = peak / 448, codes = x * (448 / peak) rounded to
 * nearest even with saturation, as the CPU pool. Every thread of the block
 * must call it (it synchronises). */
__device__ __forceinline__ void kv_put_row(void *pool, float *scales, int type, int64_t row, int D, const float *x) {
    const int64_t off = row * D;
    if (type == G4_KV_F32) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) static_cast<float *>(pool)[off + i] = x[i];
        return;
    }
    if (type == G4_KV_BF16) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) static_cast<uint16_t *>(pool)[off + i] = kv_f32_to_bf16(x[i]);
        return;
    }
    __shared__ float peak_part[32];
    float peak = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) peak = kv_nan_max(fabsf(x[i]), peak);
    for (int o = 16; o > 0; o >>= 1) peak = kv_nan_max(peak, __shfl_xor_sync(0xffffffffu, peak, o));
    if ((threadIdx.x & 31) == 0) peak_part[threadIdx.x >> 5] = peak;
    __syncthreads();
    peak = peak_part[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) peak = kv_nan_max(peak_part[w], peak);
    __syncthreads(); /* peak_part may be reused by the next row */
    const float inv = peak > 0.0f ? 448.0f / peak : 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        static_cast<uint8_t *>(pool)[off + i] =
            (uint8_t)__nv_cvt_float_to_fp8(x[i] * inv, __NV_SATFINITE, __NV_E4M3);
    if (threadIdx.x == 0) scales[row] = peak / 448.0f;
}

/* Where the block tables put (sequence row, position). */
struct kv_tables {
    const int32_t *table;
    int stride; /* entries per sequence row */
    int ring;   /* sliding: ring blocks (logical block wraps); 0: linear */
    int block_size;
};

__device__ __forceinline__ int64_t kv_slot(const kv_tables &tb, int seq, int pos) {
    const int logical = pos / tb.block_size;
    const int block = tb.table[(size_t)seq * tb.stride + (tb.ring ? logical % tb.ring : logical)];
    return (int64_t)block * tb.block_size + pos % tb.block_size;
}

/* A run of an attention tile's rows: tokens run_start.. of one sequence
 * (consecutive, up to t_last), which share one pass over the union
 * [*lo_u, *hi_u] of their key ranges (range_off 0: sliding, 2: full;
 * *lo_u > *hi_u when none has a key). Returns the token after the run. */
__device__ __forceinline__ int attn_run(const int32_t *seq, const int32_t *kv_range, int range_off, int run_start,
                                        int t_last, int *lo_u, int *hi_u) {
    const int s = seq[run_start];
    int run_end = run_start + 1;
    while (run_end <= t_last && seq[run_end] == s) run_end++;
    int lo_min = INT32_MAX, hi_max = INT32_MIN;
    for (int t = run_start; t < run_end; t++) {
        const int lo = kv_range[4 * t + range_off], hi = kv_range[4 * t + range_off + 1];
        if (lo <= hi) {
            lo_min = min(lo_min, lo);
            hi_max = max(hi_max, hi);
        }
    }
    *lo_u = lo_min;
    *hi_u = hi_max;
    return run_end;
}

static inline kv_tables cuda_kv_tables(const g4_attn_batch *b, int sliding) {
    kv_tables tb;
    tb.table = sliding ? b->sliding_tables : b->full_tables;
    tb.stride = sliding ? b->ring_blocks : b->full_table_stride;
    tb.ring = sliding ? b->ring_blocks : 0;
    tb.block_size = b->block_size;
    return tb;
}

/* What both attention kernels are given (cuda_attention.cu's attn_params
 * and cuda_attention_tc.cu's attn_tc_params add their own tiling). */
struct attn_common {
    const float *q;
    float *out;
    const void *kp, *vp;      /* the pool's K and V (kv_load4 reads them) */
    const float *ks, *vs;     /* FP8: their row scales */
    int kv_type;
    const int32_t *seq, *kv_range;
    kv_tables tb;
    int range_off; /* 0: sliding range, 2: full range */
    int n_tokens, n_heads, n_kv, D, G;
    float scale;
};

static inline attn_common attn_common_of(float *out, const float *q, const cuda_kv *kv, const g4_attn_batch *b,
                                         int sliding, int n_heads, float scale) {
    attn_common p;
    p.q = q;
    p.out = out;
    p.kp = kv->k;
    p.vp = kv->v;
    p.ks = kv->ks;
    p.vs = kv->vs;
    p.kv_type = kv->type;
    p.seq = b->seq;
    p.kv_range = b->kv_range;
    p.tb = cuda_kv_tables(b, sliding);
    p.range_off = sliding ? 0 : 2;
    p.n_tokens = b->n_tokens;
    p.n_heads = n_heads;
    p.n_kv = kv->n_kv_heads;
    p.D = kv->head_dim;
    p.G = n_heads / kv->n_kv_heads;
    p.scale = scale;
    return p;
}

/* Split-K attention: a (token, head) row's keys in up to ATTN_MAX_SPLITS
 * pieces, each giving its partial sum acc (part_acc [row][split][D]) and its
 * softmax max and sum (part_ml [row][split][2]; sum 0: no keys). */
#define ATTN_MAX_SPLITS 256 /* a multiple of 32: one KV head's decode over 32K keys fills the GPU at 256 (E2B: 64 blocks gave 12% of the warps, 217 us a full layer) */
/* Scratch for rows x splits partials (0 and a recorded failure when out of memory). */
int cuda_attention_parts(cuda_ctx *c, int64_t rows, int splits, int D, float **part_acc, float **part_ml);
/* out[row] = sum_k acc_k e^(m_k - M) / sum_k l_k e^(m_k - M) over the row's pieces. */
void cuda_attention_merge(cuda_ctx *c, float *out, const float *part_acc, const float *part_ml, int64_t rows,
                          int splits, int D);

/* Prefill attention on tensor cores (cuda_attention_tc.cu): 1 when it ran
 * (or recorded a failure), 0 when the shape is not its own (head_dim not
 * 64..512 in multiples of 16, misaligned q/out, too little shared memory). */
int cuda_attention_tc(cuda_ctx *c, float *out, const float *q, const cuda_kv *kv, const g4_attn_batch *b, int sliding,
                      int n_heads, float scale);

#endif
