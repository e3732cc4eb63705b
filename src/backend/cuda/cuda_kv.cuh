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

static inline kv_tables cuda_kv_tables(const g4_attn_batch *b, int sliding) {
    kv_tables tb;
    tb.table = sliding ? b->sliding_tables : b->full_tables;
    tb.stride = sliding ? b->ring_blocks : b->full_table_stride;
    tb.ring = sliding ? b->ring_blocks : 0;
    tb.block_size = b->block_size;
    return tb;
}

/* Prefill attention on tensor cores (cuda_attention_tc.cu): 1 when it ran
 * (or recorded a failure), 0 when the shape is not its own (head_dim not
 * 64..512 in multiples of 16, misaligned q/out, too little shared memory). */
int cuda_attention_tc(cuda_ctx *c, float *out, const float *q, const cuda_kv *kv, const g4_attn_batch *b, int sliding,
                      int n_heads, float scale);

#endif
