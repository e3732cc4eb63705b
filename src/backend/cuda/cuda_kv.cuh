/* The CUDA KV cache pool and where the block tables put a position in it;
 * shared by the attention kernels and the fused qkv_prepare. */
#ifndef G4_BACKEND_CUDA_KV_CUH
#define G4_BACKEND_CUDA_KV_CUH

#include "backend/cuda/cuda_internal.cuh"

struct cuda_kv {
    float *k, *v;
    int n_blocks, block_size, n_kv_heads, head_dim;
};

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
    const float *kp, *vp;
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
#define ATTN_MAX_SPLITS 64
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
