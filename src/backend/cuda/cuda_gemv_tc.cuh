/* What the tensor-core GEMVs for quantised weights share: their argument
 * struct, group scales as stored, a block's activation staging, a lane's
 * place in its tile and the reduction of a tile's sums into the output.
 * Kernels: cuda_gemv_tc.cu (fp16 mma: MXFP4, 8-bit, group 32, several
 * tokens) and cuda_gemv_i8.cu (integer mma: one token of 4-bit affine
 * weights in groups of 64 or 128). */
#pragma once

#include "backend/cuda/cuda_internal.cuh"

#define TC_WARPS 4
#define TC_BLOCK_COLS 128

/* The first half of the pre-passes, by one warp: the block's 32 * PER
 * columns (PER consecutive ones per lane) into xs, its 8 floats into srow
 * (the sums of x over each group slot, `seg` lanes each, then the power of
 * two 2^e), and back 2^-e, which brings the block's largest magnitude into
 * [2^(TOP - 1), 2^TOP): 15 for fp16 halves, 22 for 24-bit integers. */
template <int PER, int TOP>
__device__ __forceinline__ float tc_stage_block(float *xs, const float *xr, int64_t col0, int64_t cols, int lane,
                                                int seg, float *srow) {
    float sum = 0.0f, peak = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int64_t col = col0 + PER * lane + i;
        const float v = col < cols ? xr[col] : 0.0f;
        xs[PER * lane + i] = v;
        sum += v;
        peak = fmaxf(peak, fabsf(v));
    }
    /* group slot sums: lanes of one slot hold consecutive columns */
    for (int o = 1; o < seg; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    peak = warp_max(peak);
    /* 2^e with peak / 2^e in [2^(TOP - 1), 2^TOP) */
    int e = 0;
    if (peak > 0.0f && peak <= 3.4e38f) {
        frexpf(peak, &e); /* peak = m 2^e, m in [0.5, 1) */
        e -= TOP;
    }
    if (lane < 8) srow[lane] = lane == 4 ? ldexpf(1.0f, e) : 0.0f;
    __syncwarp(); /* also: xs complete for every lane */
    if (lane % seg == 0) srow[lane / seg] = sum;
    return ldexpf(1.0f, -e);
}

/* the weights (rows: of one expert with ids), then the product's operands */
struct gemv_tc_args : dev_matrix {
    const uint4 *prepared; /* per activation row and block: the kernel's layout (TC_BLOCK_UINT4, I8_BLOCK_UINT4) */
    int n_blocks;
    int copies;            /* identical copies of the prepared rows, copy_uint4 apart: tile t reads copy t % copies */
    size_t copy_uint4;
    float *out;
    size_t out_stride;
    const int32_t *ids;
    int64_t expert_stride, row_offset;
    int x_div, n_experts;
    const float *gelu_mul;
    int parts;          /* column parts per tile (blocks per tile) */
    int64_t n_tiles, rows_padded;
    float *partial;     /* [slot][part][rows_padded] when parts > 1 */
    int *counters;      /* [slot][tile]: parts finished; zero between calls */
    int64_t pair;       /* > 0: gated pairs (see cuda_gemv): a tile is 8 gate rows and their up rows */
};

/* How group scales are stored; MXFP4 is the E8M0 case. */
enum { TC_SCALE_BF16 = 0, TC_SCALE_F16 = 1, TC_SCALE_F32 = 2, TC_SCALE_E8M0 = 3 };

/* Scale or bias g of a row as stored: 16 or 8 bits zero-extended, or
 * float32 bits. */
template <int SD> __device__ __forceinline__ uint32_t group_bits(const uint8_t *row, int g) {
    if constexpr (SD == TC_SCALE_BF16 || SD == TC_SCALE_F16) return reinterpret_cast<const uint16_t *>(row)[g];
    if constexpr (SD == TC_SCALE_F32) return reinterpret_cast<const uint32_t *>(row)[g];
    return row[g];
}

template <int SD> __device__ __forceinline__ float group_value(uint32_t bits) {
    if constexpr (SD == TC_SCALE_BF16) return bf16_bits_to_float(bits);
    if constexpr (SD == TC_SCALE_F16) return __half2float(__ushort_as_half((unsigned short)bits));
    if constexpr (SD == TC_SCALE_F32) return __uint_as_float(bits);
    return e8m0_value(bits);
}

/* One lane of a one-token GEMV block (gemv_tc_pipe_kernel, gemv_i8_kernel):
 * its tile, rows, pointers, roles in the mma and range of blocks. */
struct tc_lane {
    int warp, lane, g, c;
    bool ok_lo, ok_hi;
    int gc, slots;
    int b_index;     /* as a B lane: the first of its 4 uint4 in a block's prepared activations */
    bool b_active;   /* as a B lane: it supplies activations (else zeros) */
    bool scale_lane; /* output columns 2c, 2c + 1 are group slot c */
    const uint8_t *w_lo, *w_hi, *s_lo, *s_hi, *b_lo, *b_hi;
    const uint4 *prepared;
    int first, last; /* this warp's blocks */
};

/* A block owns one 16-row tile (paired: 8 gate rows and their up rows) and
 * part blockIdx.x % parts of its columns, for MoE slot blockIdx.y. */
struct tc_place {
    int part, slot;
    int64_t tile, row0; /* row0: the first output row */
};

/* The copy of the prepared activations that a tile reads (spread over the
 * copies so that the GPU's warps do not all queue on the same L2 lines). */
__device__ __forceinline__ const uint4 *tc_prepared_copy(const gemv_tc_args &a, int64_t tile) {
    /* (32-bit: a 64-bit remainder is a long routine, run by every block) */
    return a.copies > 1 ? a.prepared + (size_t)((unsigned)tile % (unsigned)a.copies) * a.copy_uint4 : a.prepared;
}

/* (tc_finish recomputes it rather than holding it through the main loop) */
__device__ __forceinline__ tc_place tc_place_of(const gemv_tc_args &a) {
    tc_place t;
    t.part = (int)(blockIdx.x % (unsigned)a.parts);
    t.tile = blockIdx.x / (unsigned)a.parts;
    t.row0 = t.tile * (a.pair > 0 ? 8 : 16);
    t.slot = blockIdx.y;
    return t;
}

/* Fills L for tile place t (its MoE slot, rows and copy of the prepared
 * activations) and the blocks [first, last) of the row; false when the slot
 * has no valid expert. */
__device__ __forceinline__ bool tc_lane_place(const gemv_tc_args &a, tc_lane &L, int block_uint4, const tc_place &t,
                                              int first, int last) {
    L.warp = threadIdx.x >> 5, L.lane = threadIdx.x & 31;
    L.g = L.lane >> 2, L.c = L.lane & 3;
    const int g = L.g, c = L.c;
    const bool paired = a.pair > 0;
    const uint8_t *data = a.data, *scales = a.scales, *biases = a.biases;
    int xrow = 0;
    if (a.ids) {
        const int e = a.ids[t.slot];
        if (e < 0 || e >= a.n_experts) return false;
        const int64_t base = (int64_t)e * a.expert_stride + a.row_offset;
        data += (size_t)base * a.row_bytes;
        scales += (size_t)base * a.scale_row_bytes;
        if (biases) biases += (size_t)base * a.scale_row_bytes;
        xrow = t.slot / a.x_div;
    }
    /* this lane's rows g and g + 8 of the tile (paired: gate row g, its up row) */
    const int64_t r_lo = t.row0 + g, r_hi = paired ? t.row0 + g + a.pair : t.row0 + g + 8;
    L.ok_lo = r_lo < a.rows;
    L.ok_hi = paired ? L.ok_lo : r_hi < a.rows;
    /* group slots per 128-column block and this lane's roles */
    L.gc = a.group_size < TC_BLOCK_COLS ? a.group_size : TC_BLOCK_COLS;
    L.slots = TC_BLOCK_COLS / L.gc;
    const int my_slot = c * 32 / L.gc;  /* slot of the columns this lane's codes cover */
    const int b_part = g - 2 * my_slot; /* as a B lane: which part (hi 0, lo 1), if 0 or 1 */
    L.b_active = b_part == 0 || b_part == 1;
    L.b_index = (c * 2 + (L.b_active ? b_part : 0)) * 4;
    L.scale_lane = c < L.slots;
    L.w_lo = data + (size_t)(L.ok_lo ? r_lo : 0) * a.row_bytes + 16 * c;
    L.w_hi = data + (size_t)(L.ok_hi ? r_hi : 0) * a.row_bytes + 16 * c;
    L.s_lo = scales + (size_t)(L.ok_lo ? r_lo : 0) * a.scale_row_bytes;
    L.s_hi = scales + (size_t)(L.ok_hi ? r_hi : 0) * a.scale_row_bytes;
    L.b_lo = biases ? biases + (size_t)(L.ok_lo ? r_lo : 0) * a.scale_row_bytes : NULL;
    L.b_hi = biases ? biases + (size_t)(L.ok_hi ? r_hi : 0) * a.scale_row_bytes : NULL;
    L.prepared = tc_prepared_copy(a, t.tile) + (size_t)xrow * a.n_blocks * block_uint4;
    L.first = first;
    L.last = last;
    return true;
}

/* Fills L; false when the block has nothing to do (a slot without a valid
 * expert). The block's TC_WARPS warps split its part of the columns into
 * contiguous ranges. */
__device__ __forceinline__ bool tc_lane_setup(const gemv_tc_args &a, tc_lane &L, int block_uint4) {
    const tc_place t = tc_place_of(a);
    /* this warp's blocks: a contiguous share of the block's part of the row */
    const int per_part = (a.n_blocks + a.parts - 1) / a.parts;
    const int part_first = t.part * per_part, part_last = min(a.n_blocks, part_first + per_part);
    const int per = (part_last - part_first + TC_WARPS - 1) / TC_WARPS;
    const int first = part_first + (int)(threadIdx.x >> 5) * per;
    return tc_lane_place(a, L, block_uint4, t, first, min(part_last, first + per));
}

/* Whether the lane's 32 columns of block blk are in the row. */
__device__ __forceinline__ bool tc_block_in(const gemv_tc_args &a, const tc_lane &L, int blk) {
    return blk < L.last && (int64_t)blk * TC_BLOCK_COLS + 32 * L.c < a.cols;
}

/* A tile's rows summed over column parts (several blocks per tile): each
 * block's thread of a row (have) leaves its value v at `mine`, the block
 * counts its arrival at *count, and the block that arrives last gets back
 * true with v the sum of every part's value in part order (deterministic),
 * read from all + p * stride; the others get false. It resets *count for
 * the next call. Every thread of the block calls it. */
__device__ __forceinline__ bool tc_parts_sum(float *mine, const float *all, size_t stride, int parts, int *count,
                                             bool have, float &v) {
    __shared__ int last_part;
    if (have) {
        *mine = v;
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int before = atomicAdd(count, 1);
        last_part = before == parts - 1;
        if (last_part) *count = 0; /* every part has arrived: ready for the next call */
    }
    __syncthreads();
    if (!last_part) return false;
    __threadfence();
    if (have) {
        v = 0.0f;
        for (int p = 0; p < parts; p++) v += __ldcg(all + (size_t)p * stride);
    }
    return true;
}

/* The lanes' sums into the tile's rows: the quad's group slots, then the
 * warps' column ranges. With several parts (enough blocks for whole waves on
 * every shape) each block leaves its partial sums in a.partial and the last
 * to finish (a counter per tile) adds them in part order (deterministic) and
 * stores the rows (paired: gelu(gate) * up; else times gelu_mul if given). */
__device__ __forceinline__ void tc_finish(const gemv_tc_args &a, const tc_lane &L, float acc_lo, float acc_hi) {
    const tc_place t = tc_place_of(a);
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
    __shared__ float sum_warps[TC_WARPS][16];
    if (L.c == 0) {
        sum_warps[L.warp][L.g] = acc_lo;
        sum_warps[L.warp][L.g + 8] = acc_hi;
    }
    __syncthreads();
    const int parts = a.parts;
    const int64_t row0 = t.row0;
    const int r = threadIdx.x; /* one thread per row of the tile */
    float v = 0.0f;
    if (r < 16)
        for (int w = 0; w < TC_WARPS; w++) v += sum_warps[w][r];
    if (parts > 1) {
        const size_t first = (size_t)t.slot * parts * a.rows_padded + (size_t)t.tile * 16 + (r < 16 ? r : 0);
        if (!tc_parts_sum(a.partial + first + (size_t)t.part * a.rows_padded, a.partial + first, a.rows_padded, parts,
                          a.counters + (size_t)t.slot * a.n_tiles + t.tile, r < 16, v))
            return;
    }
    /* MoE slots: each its own rows of out and gelu_mul */
    const size_t slot_off = a.ids ? (size_t)t.slot * a.out_stride : 0;
    float *out = a.out + slot_off;
    const float *mul = a.gelu_mul ? a.gelu_mul + slot_off : NULL;
    if (a.pair > 0) {
        /* rows 0..7 of the tile are gate sums, 8..15 the matching up sums */
        __shared__ float tile_sums[16];
        if (r < 16) tile_sums[r] = v;
        __syncthreads();
        if (r < 8 && row0 + r < a.rows) out[row0 + r] = __fmul_rn(gelu_tanh(tile_sums[r]), tile_sums[r + 8]);
        return;
    }
    if (r < 16 && row0 + r < a.rows) out[row0 + r] = mul ? __fmul_rn(gelu_tanh(v), mul[row0 + r]) : v;
}

/* ---- the MoE experts' down projection with each token's weighted sum of
 * its k experts (moe_combine) in one launch ----
 * A block per (16-row tile, token), a warp per chosen expert of the token
 * (k <= TC_MOE_WARPS), each over the whole row (a few blocks: 704 columns
 * for the 26B-A4B); the block then adds the experts' rows in choice order,
 * weighted. (Before: a block per (tile, slot) whose four warps shared six
 * blocks of the row, then a combine launch.) */
#define TC_MOE_WARPS 8

/* warp j's place: tile, rows, slot token * k + j */
__device__ __forceinline__ tc_place tc_moe_place(unsigned tile, unsigned token, int k, int warp) {
    tc_place t;
    t.part = 0;
    t.tile = tile;
    t.row0 = t.tile * 16;
    t.slot = (int)token * k + warp;
    return t;
}

/* Every thread: the warps' sums per row (zero for idle warps), then
 * out[token] = sum_j weights[j] row_j over valid choices in order (as
 * moe_combine_kernel), stored at a.out + token * a.out_stride. */
__device__ __forceinline__ void tc_moe_down_finish(const gemv_tc_args &a, const float *weights, int k, int token,
                                                   int64_t row0, float acc_lo, float acc_hi) {
    __shared__ float sums[TC_MOE_WARPS][16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
    if ((lane & 3) == 0) {
        sums[warp][lane >> 2] = acc_lo;
        sums[warp][(lane >> 2) + 8] = acc_hi;
    }
    __syncthreads();
    const int r = threadIdx.x;
    const int64_t row = row0 + r;
    if (r >= 16 || row >= a.rows) return;
    float v = 0.0f;
    for (int j = 0; j < k; j++) {
        const int e = a.ids[token * k + j];
        if (e >= 0 && e < a.n_experts) v = fmaf(weights[token * k + j], sums[j][r], v);
    }
    a.out[(size_t)token * a.out_stride + row] = v;
}

/* Asks for the shared-memory carveout `blocks` blocks of kernel need per
 * multiprocessor, the rest left to L1 (which the scale loads need); once
 * per kernel (*carved). False when a CUDA call failed (recorded). */
template <typename Kernel> static bool tc_carve(cuda_ctx *c, Kernel kernel, int blocks, int *carved) {
    if (*carved) return true;
    cudaFuncAttributes fa;
    int per_sm = 0, reserved = 0;
    if (!cuda_check(c, cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes") ||
        !cuda_check(c, cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, c->device),
                    "cudaDeviceGetAttribute") ||
        !cuda_check(c, cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, c->device),
                    "cudaDeviceGetAttribute"))
        return false;
    const size_t need = (size_t)blocks * (fa.sharedSizeBytes + (size_t)reserved);
    const size_t percent = per_sm > 0 ? (100 * need + per_sm - 1) / (size_t)per_sm : 100;
    if (!cuda_check(c, cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            percent < 100 ? (int)percent : 100),
                    "cudaFuncSetAttribute"))
        return false;
    *carved = 1;
    return true;
}
