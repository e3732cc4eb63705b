/* GEMV for 4-bit weights (MLX affine, MXFP4) and 8-bit MLX affine weights
 * on tensor cores: one token (dense, or one per MoE slot) or 2..8 tokens of
 * dense weights.
 *
 * Why: the float32 GEMV in cuda_matmul.cu spends ~4 instructions per 4-bit
 * weight (extract, convert, fma, plus its share of activation loads) and
 * reaches about a quarter of the memory bandwidth: it is issue-bound, not
 * memory-bound. Here one mask turns two 4-bit codes into an fp16 pair
 * (decode_word) and an mma.sync multiplies 16 rows x 16 columns at once.
 *
 * Exactness: the codes become exact fp16 values (scaled by powers of two).
 * The activations of each 128-column block are scaled by a power of
 * two (largest magnitude into [2^14, 2^15): no overflow, no loss) and split
 * into fp16 hi + lo (about 22 significant bits); both parts go through the
 * tensor core as two of the mma's eight output columns. Products of fp16 are
 * exact in float32 and the tensor core accumulates in float32 (measured
 * against float64 CPU sums: 2e-7 to 3e-6 relative, the float32 GEMV 2e-7
 * to 5e-7). (bf16 hi + lo
 * keeps only 16 bits: 4e-6 to 1e-5 relative error on affine rows, whose bias
 * term cancels much of the sum.) Block and group scales and the biases are
 * applied in float32 after each block: sum = s * (q . x) + b * sum(x).
 *
 * Layout (mma.m16n8k16, A = weights 16 rows x 16 k, B = activations 16 k x
 * 8 n): lane (g, c) = (lane / 4, lane % 4) loads 16 bytes (32 columns
 * 32c .. 32c + 31 of the 128-column block) of rows g and g + 8. The order
 * of the k dimension inside an mma is free as long as A and B agree, so a
 * lane feeds its own codes in the order they decode (nibbles i and i + 4 of
 * a word form one fp16 pair) and a pre-pass writes the activations as B
 * fragments in the same order. The four lanes of a quad hold four different
 * 32-column runs; when a group is shorter than 128 columns they belong to
 * different groups, so B's eight columns are n = 2 p + h: activation part h
 * (hi, lo) of the columns in group slot p of the block, zero elsewhere.
 * Output column n = 2p + h then lands in lane c = p of each quad: that lane
 * applies group p's scale. Several tokens reuse each block's decoded A
 * fragments for every token; 8-bit codes take 64-column blocks (see
 * gemv_tc_tokens_kernel).
 *
 * One token of 4 bits runs on the software-pipelined gemv_tc_pipe_kernel.
 * Which kernel takes a product is planned by g4_plan_gemv (cuda_plan.h). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_gemv_i8.cuh"
#include "backend/cuda/cuda_moe_route.cuh"

/* Per activation row and 128-column block the pre-pass writes TC_BLOCK_UINT4
 * uint4: 32 of B fragments (index (c * 2 + h) * 4 + u: quad lane c, part h,
 * code word u), then 8 floats: the sum of x over each group slot of the
 * block (4), the power of two the fragments were divided by, 3 unused. */
#define TC_BLOCK_UINT4 34

/* Two scaled activations as an fp16 pair: part 0 their rounding, part 1
 * what that rounding left. */
__device__ __forceinline__ uint32_t tc_half_pair(float a, float b, int part) {
    __half2 v = __floats2half2_rn(a, b);
    if (part == 1) {
        const float2 hf = __half22float2(v);
        v = __floats2half2_rn(a - hf.x, b - hf.y);
    }
    return *reinterpret_cast<uint32_t *>(&v);
}

/* 8-bit blocks: 64 columns; per activation row and block 16 uint4 of B
 * fragments (index (c * 2 + h) * 2 + v: quad lane c, part h, code words
 * 2v and 2v + 1) then the same 8 floats as TC_BLOCK_UINT4's. */
#define TC8_BLOCK_COLS 64
#define TC8_BLOCK_UINT4 18

/* One warp per block of columns (128 of 4-bit weights, 64 of 8-bit). */
template <int BITS>
__global__ void gemv_tc_prepare_kernel(uint4 *prepared, const float *x, size_t x_stride, int64_t cols, int n_blocks,
                                       int n_rows, int group_cols, int copies, size_t copy_uint4,
                                       cuda_moe_route_job route) {
    constexpr int BC = BITS == 4 ? TC_BLOCK_COLS : TC8_BLOCK_COLS, BU = BITS == 4 ? TC_BLOCK_UINT4 : TC8_BLOCK_UINT4;
    constexpr int PER = BC / 32, FRAGS = BU - 2; /* columns per lane; uint4 of B fragments */
    pdl_launch_next(); /* before the wait (see gemv_i8_prepare_kernel) */
    pdl_wait();
    if (route.n > 0 && blockIdx.x == gridDim.x - 1) { /* (see gemv_i8_prepare_kernel) */
        moe_route_job_run(route);
        return;
    }
    __shared__ float xs[TC_WARPS][BC];
    __shared__ __align__(16) float srow[TC_WARPS][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* one warp per (copy, activation row, block): each copy written by warps of its own */
    const int items = n_blocks * n_rows, all = (int)blockIdx.x * TC_WARPS + warp; /* (32-bit: cheap remainders) */
    if (all >= items * copies) return;
    const int item = all % items;
    const int row = (int)(item / n_blocks), blk = (int)(item % n_blocks);
    uint4 *frags = prepared + (size_t)(all / items) * copy_uint4 + (size_t)item * BU;
    /* lanes per group slot: 8, 16 or 32 */
    const float down = tc_stage_block<PER, 15>(xs[warp], x + (size_t)row * x_stride, (int64_t)blk * BC, cols, lane,
                                           group_cols / PER, srow[warp]);
    __syncwarp();
    if (lane < 2) frags[FRAGS + lane] = reinterpret_cast<const uint4 *>(srow[warp])[lane];
    if (lane >= FRAGS) return;
    uint32_t out[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int k, partner;
        if constexpr (BITS == 4) {
            /* quad lane c, part h, word u; its four registers hold the
             * columns of code pairs 0, 2, 1, 3 (see decode_word) */
            const int c = lane >> 3, u = lane & 3, pair_of[4] = {0, 2, 1, 3};
            k = 32 * c + 8 * u + pair_of[j];
            partner = k + 4;
        } else {
            /* quad lane c, part h, words 2v and 2v + 1 of the lane's 16
             * columns; per word the pairs of bytes (0, 2) and (1, 3) */
            const int c = lane >> 2, v = lane & 1;
            k = 16 * c + 4 * (2 * v + (j >> 1)) + (j & 1);
            partner = k + 2;
        }
        const int h = BITS == 4 ? (lane >> 2) & 1 : (lane >> 1) & 1;
        out[j] = tc_half_pair(xs[warp][k] * down, xs[warp][partner] * down, h);
    }
    frags[lane] = make_uint4(out[0], out[1], out[2], out[3]);
}

/* A word of eight 4-bit codes as four fp16 pairs, pair i = (code i,
 * code i + 4), in the order pairs 0, 2, 1, 3. The codes land in the low
 * bits of fp16 subnormals, which the tensor core multiplies exactly:
 *  affine: bits of code q as the subnormal q 2^-24 (pairs 0, 2) or, left
 *    in place one nibble up, 16 q 2^-24 (pairs 1, 3): one mask per pair;
 *  MXFP4: code bits e1 e0 m as the exponent's two low bits and the top
 *    mantissa bit, the sign as the sign: E2M1 2^-14 (e = 0 gives the
 *    subnormal m 2^-15, as E2M1's own m / 2 would have it).
 * The caller multiplies the sums back (2^24, 2^20 or 2^14). */
template <bool MX>
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t *p) {
    if constexpr (!MX) {
        const uint32_t t = w >> 8;
        p[0] = w & 0x000F000Fu;
        p[1] = t & 0x000F000Fu;
        p[2] = w & 0x00F000F0u;
        p[3] = t & 0x00F000F0u;
    } else {
        const int order[4] = {0, 2, 1, 3};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = order[j];
            const uint32_t low3 = (i < 3 ? w << (9 - 4 * i) : w >> 3) & 0x0E000E00u;
            p[j] = low3 | ((w << (12 - 4 * i)) & 0x80008000u);
        }
    }
}
/* Scales and biases of a lane's two rows for one block. */
struct tc_params {
    float sl, sh, bl, bh;
};

/* The same as loaded, held until their block's turn, one to a register
 * (scale lo, scale hi, bias lo, bias hi; MXFP4 has no biases). Nothing may
 * touch them before then: an instruction that did (packing two 16-bit
 * values into one register) would wait for the load right where it is
 * issued. */
template <int SD> struct tc_params_raw {
    uint32_t v[SD == TC_SCALE_E8M0 ? 2 : 4];
};

/* group slot c of block blk (groups are 32, 64 or 128 columns); zero bits
 * past the warp's blocks or the row (E8M0's 2^-127 then scales exact zeros:
 * those columns' codes and activations are zero) */
template <int SD>
__device__ __forceinline__ tc_params_raw<SD> tc_block_params_raw(const gemv_tc_args &a, const tc_lane &L, int blk) {
    constexpr bool MX = SD == TC_SCALE_E8M0;
    tc_params_raw<SD> p = {};
    if (blk < L.last && L.scale_lane && (int64_t)blk * TC_BLOCK_COLS + L.c * L.gc < a.cols) {
        const int grp = blk * L.slots + L.c;
        p.v[0] = group_bits<SD>(L.s_lo, grp);
        p.v[1] = group_bits<SD>(L.s_hi, grp);
        if constexpr (!MX) {
            if (L.b_lo) {
                p.v[2] = group_bits<SD>(L.b_lo, grp);
                p.v[3] = group_bits<SD>(L.b_hi, grp);
            }
        }
    }
    return p;
}

template <int SD> __device__ __forceinline__ tc_params tc_params_of(const tc_params_raw<SD> &r) {
    if constexpr (SD == TC_SCALE_E8M0)
        return {group_value<SD>(r.v[0]), group_value<SD>(r.v[1]), 0.0f, 0.0f};
    else
        return {group_value<SD>(r.v[0]), group_value<SD>(r.v[1]), group_value<SD>(r.v[2]), group_value<SD>(r.v[3])};
}

/* One block: the lane's 16 bytes of each row (wl, wh) decoded against the
 * block's prepared activations x (shared memory), then scales and biases
 * applied into acc_lo, acc_hi. */
template <bool MX>
__device__ __forceinline__ void tc_block_mma(const tc_lane &L, uint4 wl, uint4 wh, const uint4 *x, const tc_params &p,
                                             float &acc_lo, float &acc_hi) {
    uint4 xb[4];
#pragma unroll
    for (int u = 0; u < 4; u++) xb[u] = L.b_active ? x[L.b_index + u] : make_uint4(0, 0, 0, 0);
    const uint32_t wlw[4] = {wl.x, wl.y, wl.z, wl.w};
    const uint32_t whw[4] = {wh.x, wh.y, wh.z, wh.w};
    /* d: pairs 0 and 2; e: pairs 1 and 3 (affine: in units 16 times larger) */
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < 4; u++) {
        uint32_t pl[4], ph[4];
        decode_word<MX>(wlw[u], pl);
        decode_word<MX>(whw[u], ph);
        const uint32_t b0[2] = {xb[u].x, xb[u].y}, b1[2] = {xb[u].z, xb[u].w};
        const uint32_t a0[4] = {pl[0], ph[0], pl[1], ph[1]}, a1[4] = {pl[2], ph[2], pl[3], ph[3]};
        mma_f16_16816(d, a0, b0);
        mma_f16_16816(MX ? d : e, a1, b1);
    }
    if (L.scale_lane) {
        const float *sums = reinterpret_cast<const float *>(x + 32);
        /* the block's power of two, and the codes' own (see decode_word) */
        const float up = sums[4] * (MX ? 16384.0f : 1048576.0f);
        const float vlo = MX ? d[0] + d[1] : (d[0] + d[1]) * 16.0f + (e[0] + e[1]);
        const float vhi = MX ? d[2] + d[3] : (d[2] + d[3]) * 16.0f + (e[2] + e[3]);
        acc_lo = fmaf(p.sl, vlo * up, acc_lo);
        acc_hi = fmaf(p.sh, vhi * up, acc_hi);
        if (!MX) {
            acc_lo = fmaf(p.bl, sums[L.c], acc_lo);
            acc_hi = fmaf(p.bh, sums[L.c], acc_hi);
        }
    }
}
/* ---- one token, software-pipelined ----
 *
 * The lane's weights go to shared memory (cp.async, the same 16 bytes of
 * rows g and g + 8 it would load), with the block's prepared activations,
 * into a ring of S stages per warp: while block i is computed, blocks
 * i + 1 .. i + S - 1 are in flight (one cp.async group per block;
 * wait_group S - 1 = block i has landed), so a warp's requests in flight
 * never fall to zero. Scales and biases are 2-byte values at some group
 * sizes, which cp.async cannot copy: ordinary loads issued with their
 * block's copies, into a register ring (the loop is unrolled by S so its
 * indices are constants). The math is tc_block_mma.
 *
 * Shared memory: a stage is 64 uint4 of weights + TC_BLOCK_UINT4 of
 * activations = 1568 bytes per warp, 6272 per block of 4 warps (+ 324 of
 * tc_finish and the 1 KB each block reserves). What shared memory takes L1
 * loses, and the scales' loads need L1: each warp keeps 32 lines of them
 * (16 rows, scales and biases) alive for 4 to 8 blocks, 80 KB for 20
 * warps. S = 5 (5 x 32708 bytes: 164 KB of shared memory, 92 KB of L1)
 * keeps them and still has 4 blocks (80 KB of weights per SM) in flight,
 * about twice the bandwidth-latency product; float32 scales spill above 5
 * stages at the launch bounds' 96 registers. (Other stage counts and the
 * unpipelined kernel measured slower: bench/RESULTS.md.) */
#define TC_PIPE_STAGES 5

struct tc_pipe_stage {
    uint4 w[2][32]; /* [row g / g + 8][lane]: lane-private, consecutive lanes in consecutive banks */
    uint4 x[TC_BLOCK_UINT4];
};

/* Requests block blk's prepared activations (if it is the warp's) into
 * stage st. */
__device__ __forceinline__ void tc_pipe_issue_x(const tc_lane &L, tc_pipe_stage &st, int blk) {
    if (blk >= L.last) return;
    const uint4 *src = L.prepared + (size_t)blk * TC_BLOCK_UINT4;
    cp_async16(&st.x[L.lane], src + L.lane);
    if (L.lane < TC_BLOCK_UINT4 - 32) cp_async16(&st.x[32 + L.lane], src + 32 + L.lane);
}

/* ... and its weights into the stage, its scales into p */
template <int SD>
__device__ __forceinline__ void tc_pipe_issue_w(const gemv_tc_args &a, const tc_lane &L, tc_pipe_stage &st, int blk,
                                                tc_params_raw<SD> &p) {
    if (blk < L.last) {
        const bool in = tc_block_in(a, L, blk);
        const size_t off = in ? (size_t)blk * 64 : 0; /* nothing is read when zero-filling */
        cp_async16_or_zero(&st.w[0][L.lane], L.w_lo + off, in && L.ok_lo);
        cp_async16_or_zero(&st.w[1][L.lane], L.w_hi + off, in && L.ok_hi);
    }
    p = tc_block_params_raw<SD>(a, L, blk);
}

/* Both for block blk: one commit group, empty past the warp's blocks. */
template <int SD>
__device__ __forceinline__ void tc_pipe_issue(const gemv_tc_args &a, const tc_lane &L, tc_pipe_stage &st, int blk,
                                              tc_params_raw<SD> &p) {
    tc_pipe_issue_x(L, st, blk);
    tc_pipe_issue_w<SD>(a, L, st, blk, p);
    cp_async_commit();
}

/* A lane's pipelined run over its blocks [L.first, L.last) into its sums.
 * early: the first S - 1 blocks' weights and scales go out before pdl_wait
 * (the kernel has not waited yet; no kernel writes weights), their
 * activations after it; the first commit group then holds all those
 * weights, which only makes the first waits stricter. */
template <int SD, int S>
__device__ __forceinline__ void tc_pipe_run(const gemv_tc_args &a, const tc_lane &L, tc_pipe_stage *stages,
                                            float &acc_lo, float &acc_hi, bool early) {
    constexpr bool MX = SD == TC_SCALE_E8M0;
    tc_params_raw<SD> p[S]; /* block first + j's in p[j % S] */
    if (early) {
#pragma unroll
        for (int k = 0; k < S - 1; k++) tc_pipe_issue_w<SD>(a, L, stages[k], L.first + k, p[k]);
        pdl_wait();
#pragma unroll
        for (int k = 0; k < S - 1; k++) {
            tc_pipe_issue_x(L, stages[k], L.first + k);
            cp_async_commit();
        }
    } else {
#pragma unroll
        for (int k = 0; k < S - 1; k++) tc_pipe_issue<SD>(a, L, stages[k], L.first + k, p[k]);
    }
    for (int base = L.first; base < L.last; base += S) {
#pragma unroll
        for (int k = 0; k < S; k++) {
            const int blk = base + k;
            if (blk >= L.last) break;
            /* stage (k - 1) % S was computed last step (and __syncwarp'd) */
            tc_pipe_issue<SD>(a, L, stages[(k + S - 1) % S], blk + S - 1, p[(k + S - 1) % S]);
            cp_async_wait_newest<S - 1>(); /* block blk's group has landed */
            __syncwarp();
            const tc_pipe_stage &st = stages[k];
            tc_block_mma<MX>(L, st.w[0][L.lane], st.w[1][L.lane], st.x, tc_params_of<SD>(p[k]), acc_lo, acc_hi);
            __syncwarp(); /* stage k is refilled next step */
        }
    }
}

template <int SD, int S>
__global__ void __launch_bounds__(TC_WARPS * 32, 5) gemv_tc_pipe_kernel(gemv_tc_args a) {
    const bool early = !a.ids; /* (see tc_pipe_run) */
    if (!early) pdl_wait();
    __shared__ tc_pipe_stage ring[TC_WARPS][S];
    tc_lane L;
    if (!tc_lane_setup(a, L, TC_BLOCK_UINT4)) return;
    float acc_lo = 0.0f, acc_hi = 0.0f;
    tc_pipe_run<SD, S>(a, L, ring[L.warp], acc_lo, acc_hi, early);
    tc_finish(a, L, acc_lo, acc_hi);
}

/* The MoE down projection with the tokens' weighted sums, as
 * gemv_i8_moe_down_kernel (cuda_gemv_i8.cu) but on this file's kernel:
 * MXFP4 and groups of 32. Three stages (eight warps' rings of five would
 * not fit the static shared memory). */
#define TC_MOE_PIPE_STAGES 3

template <int SD>
__global__ void __launch_bounds__(TC_MOE_WARPS * 32) gemv_tc_moe_down_kernel(gemv_tc_args a, const float *weights,
                                                                              int k) {
    pdl_wait();
    __shared__ tc_pipe_stage ring[TC_MOE_WARPS][TC_MOE_PIPE_STAGES];
    const int warp = threadIdx.x >> 5;
    const tc_place t = tc_moe_place(blockIdx.x, blockIdx.y, k, warp);
    tc_lane L;
    float acc_lo = 0.0f, acc_hi = 0.0f;
    if (warp < k && tc_lane_place(a, L, TC_BLOCK_UINT4, t, 0, a.n_blocks))
        tc_pipe_run<SD, TC_MOE_PIPE_STAGES>(a, L, ring[warp], acc_lo, acc_hi, false);
    tc_moe_down_finish(a, weights, k, blockIdx.y, t.row0, acc_lo, acc_hi);
}

/* ---- several tokens (2..8) of dense weights; 8-bit affine weights ----
 *
 * The weights of a block are loaded and decoded once and multiplied with
 * every token's B fragments. The mma's eight output columns are
 * n = 2 (t * slots + p) + h: token t of the mma's 4 / slots tokens, group
 * slot p of the block, part h. Groups covering a whole block thus serve
 * four tokens per mma, half a block two, a quarter one (a group slot per
 * column pair is what keeps the groups' sums apart). Output lane c of a
 * quad gets token c / slots, group slot c % slots.
 *
 * 8-bit codes: a byte q in the low bits of an fp16 half is the subnormal
 * q 2^-24, so a mask takes bytes 0 and 2 of a word as one fp16 pair and a
 * shift and the mask bytes 1 and 3 (decode_word8): one word, four k of an
 * mma. A quad lane's 16 bytes are then 16 columns and a block 64 columns
 * (64 bytes of a row, as for 4 bits); gemv_tc_prepare_kernel<8> writes the
 * activations in that order. Groups of 128 columns span two blocks: each
 * block adds its share with the group's scale and bias. */

/* A word of four 8-bit codes as two fp16 pairs: (code 0, code 2), (code 1,
 * code 3), each code q the subnormal q 2^-24 (the caller multiplies by 2^24). */
__device__ __forceinline__ void decode_word8(uint32_t w, uint32_t *p) {
    p[0] = w & 0x00FF00FFu;
    p[1] = (w >> 8) & 0x00FF00FFu;
}

/* blocks of weights in flight per warp (more made the kernels spill at their launch bounds) */
#define TC_TOKENS_PREFETCH 2

/* NT (2, 4 or 8) tokens at most, n of them, of dense weights. Partial sums
 * and the semaphore reduction as in tc_finish, per token; four blocks per
 * multiprocessor. */
template <int SD, int BITS, int NT>
__global__ void __launch_bounds__(TC_WARPS * 32, 4) gemv_tc_tokens_kernel(gemv_tc_args a, int n) {
    pdl_wait();
    constexpr bool MX = SD == TC_SCALE_E8M0;
    constexpr int PF = TC_TOKENS_PREFETCH;
    constexpr int BC = BITS == 4 ? TC_BLOCK_COLS : TC8_BLOCK_COLS;    /* columns per block */
    constexpr int BU = BITS == 4 ? TC_BLOCK_UINT4 : TC8_BLOCK_UINT4;  /* prepared uint4 per block */
    constexpr int FRAGS = BU - 2;                                      /* of them B fragments */
    __shared__ uint4 ring[TC_WARPS][PF][NT][BU];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int parts = a.parts, part = (int)(blockIdx.x % (unsigned)parts);
    const int64_t tile = blockIdx.x / (unsigned)parts;
    const bool paired = a.pair > 0;
    const int64_t row0 = tile * (paired ? 8 : 16);
    const uint8_t *data = a.data, *scales = a.scales, *biases = a.biases;
    const float *mul = a.gelu_mul;
    float *out = a.out;
    const int slot = 0, xrow = 0; /* dense weights: one grid row */
    const int64_t r_lo = row0 + g, r_hi = paired ? row0 + g + a.pair : row0 + g + 8;
    const bool ok_lo = r_lo < a.rows, ok_hi = paired ? ok_lo : r_hi < a.rows;
    const int gs = a.group_size;
    const int gc = gs < BC ? gs : BC;     /* columns of a group slot */
    const int slots = BC / gc;            /* 4, 2 or 1 */
    const int per_mma = 4 / slots;        /* tokens per mma */
    const int gs_log2 = __ffs(gs) - 1;    /* group sizes are powers of two */
    /* as a B lane: column g / 2 = (token, slot), part g % 2; it supplies its
     * own columns' activations when their slot is that column's */
    const int my_slot = c * (BC / 4) / gc;
    const int b_col = g >> 1, b_tok = b_col / slots;
    const bool b_slot = b_col % slots == my_slot;
    const int b_index = (c * 2 + (g & 1)) * (FRAGS / 8);
    /* as an output lane: columns 2c, 2c + 1 are token c / slots, slot c % slots */
    const int o_slot = c % slots, o_tok = c / slots;
    const uint8_t *w_lo = data + (size_t)(ok_lo ? r_lo : 0) * a.row_bytes + 16 * c;
    const uint8_t *w_hi = data + (size_t)(ok_hi ? r_hi : 0) * a.row_bytes + 16 * c;
    const uint8_t *s_lo = scales + (size_t)(ok_lo ? r_lo : 0) * a.scale_row_bytes;
    const uint8_t *s_hi = scales + (size_t)(ok_hi ? r_hi : 0) * a.scale_row_bytes;
    const uint8_t *b_lo = biases ? biases + (size_t)(ok_lo ? r_lo : 0) * a.scale_row_bytes : NULL;
    const uint8_t *b_hi = biases ? biases + (size_t)(ok_hi ? r_hi : 0) * a.scale_row_bytes : NULL;
    const uint4 *prepared = tc_prepared_copy(a, tile) + (size_t)xrow * a.n_blocks * BU; /* token t: t * n_blocks * BU further */
    const int64_t cols = a.cols;
    const int per_part = (a.n_blocks + parts - 1) / parts;
    const int part_first = part * per_part, part_last = min(a.n_blocks, part_first + per_part);
    const int per = (part_last - part_first + TC_WARPS - 1) / TC_WARPS;
    const int first = part_first + warp * per, last = min(part_last, first + per);
    /* acc[j]: this lane's rows for token j * per_mma + o_tok, slot o_slot */
    float acc_lo[NT], acc_hi[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) acc_lo[j] = acc_hi[j] = 0.0f;
    for (int blk0 = first; blk0 < last; blk0 += PF) {
        uint4 wl[PF], wh[PF];
        uint32_t sl[PF], sh[PF], bl[PF], bh[PF]; /* as loaded (see tc_params_raw) */
#pragma unroll
        for (int k = 0; k < PF; k++) {
            const int blk = blk0 + k;
            if (blk < last)
                for (int t = 0; t < n; t++) {
                    const uint4 *src = prepared + ((size_t)t * a.n_blocks + blk) * BU;
                    if (lane < BU) cp_async16(&ring[warp][k][t][lane], src + lane);
                    if (lane + 32 < BU) cp_async16(&ring[warp][k][t][32 + lane], src + 32 + lane);
                }
            const bool in = blk < last && (int64_t)blk * BC + (BC / 4) * c < cols;
            const size_t off = (size_t)blk * 64; /* 64 bytes of a row per block */
            wl[k] = in && ok_lo ? load_stream16(w_lo + off) : make_uint4(0, 0, 0, 0);
            wh[k] = in && ok_hi ? load_stream16(w_hi + off) : make_uint4(0, 0, 0, 0);
            sl[k] = sh[k] = bl[k] = bh[k] = 0;
            const int64_t slot_col = (int64_t)blk * BC + o_slot * gc;
            if (blk < last && slot_col < cols) {
                const int grp = (int)(slot_col >> gs_log2);
                sl[k] = group_bits<SD>(s_lo, grp);
                sh[k] = group_bits<SD>(s_hi, grp);
                if (!MX && b_lo) {
                    bl[k] = group_bits<SD>(b_lo, grp);
                    bh[k] = group_bits<SD>(b_hi, grp);
                }
            }
        }
        cp_async_wait_all();
        __syncwarp();
#pragma unroll
        for (int k = 0; k < PF; k++) {
            const int blk = blk0 + k;
            if (blk >= last) break;
            /* the block's A fragments, decoded once for all tokens: 4 bits
             * a0 (pairs 0, 2) and a1 (pairs 1, 3) per word; 8 bits a0 per word */
            uint32_t a0[4][4], a1[4][4];
            const uint32_t wlw[4] = {wl[k].x, wl[k].y, wl[k].z, wl[k].w};
            const uint32_t whw[4] = {wh[k].x, wh[k].y, wh[k].z, wh[k].w};
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if constexpr (BITS == 4) {
                    uint32_t pl[4], ph[4];
                    decode_word<MX>(wlw[u], pl);
                    decode_word<MX>(whw[u], ph);
                    a0[u][0] = pl[0], a0[u][1] = ph[0], a0[u][2] = pl[1], a0[u][3] = ph[1];
                    a1[u][0] = pl[2], a1[u][1] = ph[2], a1[u][2] = pl[3], a1[u][3] = ph[3];
                } else {
                    uint32_t pl[2], ph[2];
                    decode_word8(wlw[u], pl);
                    decode_word8(whw[u], ph);
                    a0[u][0] = pl[0], a0[u][1] = ph[0], a0[u][2] = pl[1], a0[u][3] = ph[1];
                }
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j * per_mma >= n) break;
                const int bt = j * per_mma + b_tok;
                const bool b_active = b_slot && bt < n;
                const uint4 *xf = &ring[warp][k][b_active ? bt : 0][b_index];
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if constexpr (BITS == 4) {
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const uint4 xb = b_active ? xf[u] : make_uint4(0, 0, 0, 0);
                        const uint32_t b0[2] = {xb.x, xb.y}, b1[2] = {xb.z, xb.w};
                        mma_f16_16816(d, a0[u], b0);
                        mma_f16_16816(MX ? d : e, a1[u], b1);
                    }
                } else {
#pragma unroll
                    for (int v = 0; v < 2; v++) {
                        const uint4 xb = b_active ? xf[v] : make_uint4(0, 0, 0, 0);
                        const uint32_t b0[2] = {xb.x, xb.y}, b1[2] = {xb.z, xb.w};
                        mma_f16_16816(d, a0[2 * v], b0);
                        mma_f16_16816(d, a0[2 * v + 1], b1);
                    }
                }
                const int ot = j * per_mma + o_tok;
                if (ot < n) {
                    const float *sums = reinterpret_cast<const float *>(&ring[warp][k][ot][FRAGS]);
                    /* the block's power of two, and the codes' own */
                    const float up = sums[4] * (BITS == 8 ? 16777216.0f : MX ? 16384.0f : 1048576.0f);
                    const bool one = MX || BITS == 8; /* all products in one unit */
                    const float vlo = one ? d[0] + d[1] : (d[0] + d[1]) * 16.0f + (e[0] + e[1]);
                    const float vhi = one ? d[2] + d[3] : (d[2] + d[3]) * 16.0f + (e[2] + e[3]);
                    acc_lo[j] = fmaf(group_value<SD>(sl[k]), vlo * up, acc_lo[j]);
                    acc_hi[j] = fmaf(group_value<SD>(sh[k]), vhi * up, acc_hi[j]);
                    if (!MX) {
                        acc_lo[j] = fmaf(group_value<SD>(bl[k]), sums[o_slot], acc_lo[j]);
                        acc_hi[j] = fmaf(group_value<SD>(bh[k]), sums[o_slot], acc_hi[j]);
                    }
                }
            }
        }
        __syncwarp(); /* the ring is refilled next pass */
    }
    /* a token's group slots sit in neighbouring quad lanes: add them, then
     * the warps' column ranges */
    __shared__ float sum_warps[TC_WARPS][NT][16];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        if (j * per_mma >= n) break;
        float lo = acc_lo[j], hi = acc_hi[j];
        if (slots >= 2) {
            lo += __shfl_xor_sync(0xffffffffu, lo, 1);
            hi += __shfl_xor_sync(0xffffffffu, hi, 1);
        }
        if (slots == 4) {
            lo += __shfl_xor_sync(0xffffffffu, lo, 2);
            hi += __shfl_xor_sync(0xffffffffu, hi, 2);
        }
        const int ot = j * per_mma + o_tok;
        if (o_slot == 0 && ot < n) {
            sum_warps[warp][ot][g] = lo;
            sum_warps[warp][ot][g + 8] = hi;
        }
    }
    __syncthreads();
    /* one thread per (token, row of the tile) */
    const int t = threadIdx.x >> 4, r = threadIdx.x & 15;
    const bool mine_ok = t < n;
    float v = 0.0f;
    if (mine_ok)
        for (int w = 0; w < TC_WARPS; w++) v += sum_warps[w][t][r];
    if (parts > 1) {
        /* [slot][token][part][row] (slot 0 here) */
        const size_t first = ((size_t)slot * NT + t) * parts * a.rows_padded + (size_t)tile * 16 + r;
        if (!tc_parts_sum(a.partial + first + (size_t)part * a.rows_padded, a.partial + first, a.rows_padded, parts,
                          a.counters + (size_t)slot * a.n_tiles + tile, mine_ok, v))
            return;
    }
    /* token t's rows of out (and of gelu_mul, laid out like out) */
    out += (size_t)(mine_ok ? t : 0) * a.out_stride;
    if (mul) mul += (size_t)(mine_ok ? t : 0) * a.out_stride;
    if (paired) {
        __shared__ float tile_sums[NT][16];
        if (mine_ok) tile_sums[t][r] = v;
        __syncthreads();
        if (mine_ok && r < 8 && row0 + r < a.rows) out[row0 + r] = __fmul_rn(gelu_tanh(tile_sums[t][r]), tile_sums[t][r + 8]);
        return;
    }
    if (mine_ok && row0 + r < a.rows) out[row0 + r] = mul ? __fmul_rn(gelu_tanh(v), mul[row0 + r]) : v;
}

/* The launches by scale storage (SD) and width (BITS). */
template <int SD>
static void launch_tc_moe_down(cuda_ctx *c, const gemv_tc_args &a, int n_tokens, const float *weights, int k) {
    const dim3 grid((unsigned)a.n_tiles, (unsigned)n_tokens);
    cuda_launch(c, gemv_tc_moe_down_kernel<SD>, grid, TC_MOE_WARPS * 32, 0, a, weights, k);
}

template <int SD> static void launch_tc_pipe(cuda_ctx *c, const gemv_tc_args &a, int n_slots) {
    /* five blocks' shared memory, the rest left to L1 (see TC_PIPE_STAGES) */
    static int carved;
    if (!tc_carve(c, gemv_tc_pipe_kernel<SD, TC_PIPE_STAGES>, 5, &carved)) return;
    const dim3 grid((unsigned)(a.n_tiles * a.parts), (unsigned)n_slots);
    cuda_launch(c, gemv_tc_pipe_kernel<SD, TC_PIPE_STAGES>, grid, TC_WARPS * 32, 0, a);
}

template <int SD, int BITS> static void launch_tc_tokens(cuda_ctx *c, const gemv_tc_args &a, int tokens, int n) {
    const dim3 grid((unsigned)(a.n_tiles * a.parts));
    if (tokens == 2)
        cuda_launch(c, gemv_tc_tokens_kernel<SD, BITS, 2>, grid, TC_WARPS * 32, 0, a, n);
    else if (tokens == 4)
        cuda_launch(c, gemv_tc_tokens_kernel<SD, BITS, 4>, grid, TC_WARPS * 32, 0, a, n);
    else
        cuda_launch(c, gemv_tc_tokens_kernel<SD, BITS, 8>, grid, TC_WARPS * 32, 0, a, n);
}

template <int SD>
static void launch_tc_planned(cuda_ctx *c, const g4_gemv_plan *p, const gemv_tc_args &a, const cuda_gemv_req *r) {
    const int n_slots = r->ids ? r->n_slots : 1;
    switch (p->kernel) {
    case G4_KERNEL_MOE_DOWN_FP16: launch_tc_moe_down<SD>(c, a, n_slots / r->combine_k, r->combine_w, r->combine_k); break;
    case G4_KERNEL_GEMV_FP16: launch_tc_pipe<SD>(c, a, n_slots); break;
    default:
        if constexpr (SD != TC_SCALE_E8M0) {
            if (p->bits == 8) {
                launch_tc_tokens<SD, 8>(c, a, p->tokens, r->n_tokens);
                break;
            }
        }
        launch_tc_tokens<SD, 4>(c, a, p->tokens, r->n_tokens);
        break;
    }
}

void cuda_gemv_tc_launch(cuda_ctx *c, const g4_gemv_plan *p, const cuda_gemv_req *r) {
    const g4_matrix *w = r->w;
    const bool mx = w->format == G4_WEIGHT_MXFP4;
    const bool i8 = p->kernel == G4_KERNEL_GEMV_INT8 || p->kernel == G4_KERNEL_MOE_DOWN_INT8;
    const int bits = p->bits, gs = w->group_size;
    const int n_slots = r->ids ? r->n_slots : 1, n_tokens = r->ids ? 1 : r->n_tokens;
    const int x_div = r->x_div > 0 ? r->x_div : 1;
    const int n_x = r->ids ? (n_slots + x_div - 1) / x_div : n_tokens;
    /* blocks of 64 bytes of a row: 128 columns of 4 bits, 64 of 8 */
    const int block_cols = bits == 8 ? TC8_BLOCK_COLS : TC_BLOCK_COLS;
    const int n_blocks = (int)((w->cols + block_cols - 1) / block_cols);
    const size_t row_uint4 = i8 ? cuda_gemv_i8_prepared_uint4(n_blocks, bits)
                                : (size_t)n_blocks * (bits == 8 ? TC8_BLOCK_UINT4 : TC_BLOCK_UINT4);
    const int64_t tiles = p->tiles;
    const int copies = p->copies; /* (the fp16 kernels' one: more made their pre-pass slower) */
    const size_t copy_uint4 = (size_t)n_x * row_uint4;
    uint4 *prepared = (uint4 *)cuda_scratch(c, SCRATCH_GEMV_FRAGS, copies * copy_uint4 * sizeof(uint4));
    if (!prepared) return; /* failure recorded */
    const int gc = gs < block_cols ? gs : block_cols;
    const int64_t items = (int64_t)n_x * n_blocks;
    /* a MoE routing waiting for the experts' first pre-pass rides on this one (cuda_moe_route_experts) */
    cuda_moe_route_job route = {};
    if (r->ids && c->route_job.n > 0) {
        route = c->route_job;
        c->route_job.n = 0;
    }
    const unsigned prep_grid = cuda_blocks((size_t)(items * copies), TC_WARPS) + (route.n > 0 ? 1 : 0);
    if (i8)
        cuda_gemv_i8_prepare(c, prepared, r->x, r->x_stride, w->cols, n_blocks, n_x, gc, copies, bits, route);
    else if (bits == 8)
        cuda_launch(c, gemv_tc_prepare_kernel<8>, prep_grid, TC_WARPS * 32, 0, prepared, r->x, r->x_stride, w->cols,
                    n_blocks, n_x, gc, copies, copy_uint4, route);
    else
        cuda_launch(c, gemv_tc_prepare_kernel<4>, prep_grid, TC_WARPS * 32, 0, prepared, r->x, r->x_stride, w->cols,
                    n_blocks, n_x, gc, copies, copy_uint4, route);
    if (!cuda_launched(c, "gemv_tc_prepare")) return;

    gemv_tc_args a;
    static_cast<dev_matrix &>(a) = dev_matrix_of(w);
    a.rows = w->rows;
    a.cols = w->cols;
    a.prepared = prepared;
    a.n_blocks = n_blocks;
    a.copies = copies;
    a.copy_uint4 = copy_uint4;
    a.out = r->out;
    a.out_stride = r->out_stride;
    a.ids = r->ids;
    a.expert_stride = r->expert_stride;
    a.row_offset = r->row_offset;
    a.x_div = x_div;
    a.n_experts = r->n_experts;
    a.gelu_mul = r->pair > 0 ? NULL : r->gelu_mul;
    a.pair = r->pair;
    a.parts = p->parts;
    a.n_tiles = tiles;
    a.rows_padded = tiles * 16;
    a.partial = NULL;
    a.counters = c->gemv_counters;
    if (p->parts > 1) {
        /* [slot][part][row], or [token][part][row] for several tokens */
        a.partial = (float *)cuda_scratch(c, SCRATCH_GEMV_PARTIAL,
                                          (size_t)n_slots * n_tokens * p->parts * tiles * 16 * sizeof(float));
        if (!a.partial) return;
    }
    const int sd = mx ? TC_SCALE_E8M0 : dev_matrix_of(w).scale_dtype; /* 0 bf16, 1 f16, 2 f32 */
    if (p->kernel == G4_KERNEL_MOE_DOWN_INT8) {
        cuda_gemv_i8_moe_down_launch(c, a, n_slots / r->combine_k, r->combine_w, r->combine_k, sd);
    } else if (p->kernel == G4_KERNEL_GEMV_INT8) {
        cuda_gemv_i8_launch(c, a, n_slots, sd);
    } else {
        switch (sd) {
        case TC_SCALE_BF16: launch_tc_planned<TC_SCALE_BF16>(c, p, a, r); break;
        case TC_SCALE_F16: launch_tc_planned<TC_SCALE_F16>(c, p, a, r); break;
        case TC_SCALE_F32: launch_tc_planned<TC_SCALE_F32>(c, p, a, r); break;
        default: launch_tc_planned<TC_SCALE_E8M0>(c, p, a, r); break;
        }
    }
    cuda_launched(c, "gemv_tc");
}
