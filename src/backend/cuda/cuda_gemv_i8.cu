/* One token of affine weights (MLX: 4 bits in groups of 64 or 128 columns,
 * 8 bits in groups of 32 or 64) on integer tensor cores: a GEMV for decode,
 * also per MoE slot and for gated pairs (the same arguments and tile
 * reduction as cuda_gemv_tc.cu). The description below is the 4-bit one;
 * 8-bit codes need no decoding at all: a lane's 16 bytes of a row are 16
 * columns, words 0 and 1 the A registers of a 64-column block's first mma,
 * words 2 and 3 of its second (i8_geom).
 *
 * Why: the fp16 kernel there spends ~207 instructions per warp on a 16-row x
 * 128-column block (1 KB of weights): two masks per fp16 pair of codes, eight
 * mma, and hi + lo halves of the activations through the tensor core. It is
 * issue-bound at about half the copy rate (RESULTS, eighth run). Here the
 * codes stay integers: a word of eight 4-bit codes is two words of four bytes
 * (a mask; a shift and a mask), and one mma.m16n8k32 (u8 codes x s8
 * activations, int32 sums) takes 32 columns of 16 rows, four per block:
 * ~96 instructions per block, so its warps wait on memory more than on
 * issue (the speeds: bench/RESULTS.md).
 *
 * Exactness: per 128-column block the activations are scaled by a power of
 * two 2^-e (the largest magnitude into [2^21, 2^22)) and rounded to integers
 * X of 23 bits, X = 65536 P0 + 256 P1 + P2 with P1, P2 in [-128, 127] and
 * |P0| <= 64: three signed bytes, "planes", each a column of the mma's B.
 * Code x plane sums are exact in int32 (at most 64 x 15 x 128 per group);
 * per group q . X = 65536 S0 + 256 S1 + S2 in float32 (one rounding), then
 * sum = s 2^e (q . X) + b sum(x), as in cuda_gemv_tc.cu. The rounding of x
 * to X is at most 2^-23 of the block's largest |x|.
 *
 * Layout (mma.m16n8k32, A = 16 rows x 32 k of u8, B = 32 k x 8 n of s8):
 * lane (g, c) = (lane / 4, lane % 4) loads 16 bytes (columns 32c .. 32c + 31
 * of the block) of rows g and g + 8, as in the fp16 kernel. Mma u takes code
 * word u of each: its even codes (mask) as A registers 0 and 1 (k 4c .. 4c +
 * 3 of rows g, g + 8), its odd codes (shift, mask) as registers 2 and 3 (k
 * 16 + 4c ..). The k order inside an mma is free as long as B agrees, and
 * every lane's k slots are its own columns, so a pre-pass writes each B lane
 * the planes of exactly the columns its quad lane c holds codes for.
 * B's eight columns are n = 4 s + p: plane p (0..2) of group slot s of the
 * block (one slot for groups of 128, two for 64; a lane's 32 columns lie in
 * one slot), column 4 s + 3 zero. Output lane c then holds columns 2c and
 * 2c + 1: slot c / 2, planes 0 and 1 (c even) or plane 2 (c odd); it weights
 * them 65536, 256 or 1 and applies its slot's scale (c even: the bias too);
 * tc_finish adds the quad's lanes.
 *
 * 4-bit groups of 32 columns would need 12 B columns, and MXFP4 codes are
 * not integers: those stay on the fp16 kernel, as do several tokens; 8-bit
 * groups of 128 (one group over two blocks) on the float32 GEMV
 * (g4_plan_gemv, cuda_plan.h). */
#include "backend/cuda/cuda_gemv_i8.cuh"
#include "backend/cuda/cuda_moe_route.cuh"

/* The block geometry per weight width. 4 bits: 128 columns (a lane's 16
 * bytes of a row are 32 columns); per activation row and block FRAGS = 24
 * uint4 of B fragments, index (c * 3 + p) * 2 + h: quad lane c, plane p,
 * half h (code words 2h and 2h + 1: even codes' bytes, odd codes', for
 * each). 8 bits: 64 columns (a lane's 16 bytes are 16 columns, the code
 * bytes themselves the A operand: words 0, 1 of rows g, g + 8 for the
 * block's first mma, words 2, 3 for its second); FRAGS = 12 uint4, index
 * c * 3 + p: word j the plane's bytes of the lane's columns 4j .. 4j + 3.
 * Then the same 8 floats as the fp16 layout's (group slot sums, 2^e,
 * unused), and in a stage of the ring two zero uint4 for idle B lanes. */
template <int BITS> struct i8_geom {
    static constexpr int BC = BITS == 4 ? 128 : 64; /* columns per block */
    static constexpr int LC = BC / 4;               /* a quad lane's columns of a row per block */
    static constexpr int FRAGS = BITS == 4 ? 24 : 12;
    static constexpr int BU = FRAGS + 2;            /* prepared uint4 per row and block */
    static constexpr int STAGE = BU + 2;            /* a ring stage: BU, then a zero pair */
    static constexpr int B_UINT4 = BITS == 4 ? 2 : 1; /* uint4 a B lane reads per block */
};

/* plane p (0: x 65536, 1: x 256, 2: x 1) of a 23-bit integer, as a byte */
__device__ __forceinline__ uint32_t i8_plane(int X, int p) {
    const int p2 = ((X + 128) & 255) - 128;
    const int r1 = (X - p2) >> 8; /* exact: X - p2 is a multiple of 256 */
    const int p1 = ((r1 + 128) & 255) - 128;
    const int p0 = (r1 - p1) >> 8;
    return (uint32_t)(p == 0 ? p0 : p == 1 ? p1 : p2) & 255u;
}

/* One warp per (copy, activation row, block). */
template <int BITS>
__global__ void gemv_i8_prepare_kernel(uint4 *prepared, const float *x, size_t x_stride, int64_t cols, int n_blocks,
                                       int n_rows, int group_cols, int copies, size_t copy_uint4,
                                       cuda_moe_route_job route) {
    using G = i8_geom<BITS>;
    constexpr int PER = G::BC / 32; /* columns per lane */
    /* The GEMV after this pre-pass may be scheduled before the pre-pass
     * itself waits: its blocks then send their first weight loads while the
     * kernel before the pre-pass (a norm, the attention merge) still runs.
     * Safe: the GEMV waits for this grid to complete, which waits for that
     * one; and the GEMV lets nothing after it start early, so no more than
     * these three are ever resident at once. */
    pdl_launch_next();
    pdl_wait();
    if (route.n > 0 && blockIdx.x == gridDim.x - 1) { /* the MoE routing's block (cuda_moe_route_experts) */
        moe_route_job_run(route);
        return;
    }
    __shared__ float xs[TC_WARPS][G::BC];
    __shared__ __align__(16) float srow[TC_WARPS][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* one warp per (copy, activation row, block): each copy written by warps of its own */
    const int items = n_blocks * n_rows, all = (int)blockIdx.x * TC_WARPS + warp; /* (32-bit: cheap remainders) */
    if (all >= items * copies) return;
    const int item = all % items;
    const int row = item / n_blocks, blk = item % n_blocks;
    uint4 *frags = prepared + (size_t)(all / items) * copy_uint4 + (size_t)item * G::BU;
    const float down = tc_stage_block<PER, 22>(xs[warp], x + (size_t)row * x_stride, (int64_t)blk * G::BC, cols,
                                               lane, group_cols / PER, srow[warp]);
    __syncwarp();
    if (lane < 2) frags[G::FRAGS + lane] = reinterpret_cast<const uint4 *>(srow[warp])[lane];
    if (lane >= G::FRAGS) return;
    uint32_t out[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int c, p, col0, step;
        if constexpr (BITS == 4) {
            /* word u's even (odd = 0) or odd (odd = 1) codes: columns 8u + odd + 2b */
            c = lane / 6, p = (lane >> 1) % 3;
            const int u = 2 * (lane & 1) + (j >> 1), odd = j & 1;
            col0 = 32 * c + 8 * u + odd, step = 2;
        } else {
            /* the lane's columns 4j .. 4j + 3 */
            c = lane / 3, p = lane % 3;
            col0 = 16 * c + 4 * j, step = 1;
        }
        uint32_t word = 0;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int X = __float2int_rn(xs[warp][col0 + step * b] * down);
            word |= i8_plane(X, p) << (8 * b);
        }
        out[j] = word;
    }
    frags[lane] = make_uint4(out[0], out[1], out[2], out[3]);
}

/* d += a b: A 16 x 32 u8 (row-major fragment), B 32 x 8 s8 (column-major),
 * int32 sums (PTX mma m16n8k32) */
__device__ __forceinline__ void mma_u8s8_16832(int *d, const uint32_t *a, const uint32_t *b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A lane's roles in a block (see the layout above). */
struct i8_roles {
    int b_index;          /* as a B lane: its uint4 in a stage (the zero pair if idle) */
    bool o_active, o_bias; /* as an output lane: columns 2c, 2c + 1 hold planes; c even: bias too */
    int o_slot;
    float w0, w1; /* the planes' weights in those columns */
};

/* gc: the group's columns within a block (at most the block) */
template <int BITS> __device__ __forceinline__ i8_roles i8_roles_of(int g, int c, int gc, bool has_bias) {
    using G = i8_geom<BITS>;
    i8_roles r;
    const int my_slot = c * G::LC / gc, plane = g & 3, slots = G::BC / gc;
    const bool b_active = (g >> 2) == my_slot && plane < 3;
    r.b_index = b_active ? (c * 3 + plane) * G::B_UINT4 : G::BU;
    r.o_slot = c >> 1;
    r.o_active = r.o_slot < slots;
    r.o_bias = r.o_active && (c & 1) == 0 && has_bias;
    r.w0 = (c & 1) ? 1.0f : 65536.0f;
    r.w1 = (c & 1) ? 0.0f : 256.0f;
    return r;
}

/* Scales and biases of a lane's two rows for one block, as loaded (kept
 * untouched until the block's turn: see tc_params_raw). */
struct i8_params {
    uint32_t s_lo, s_hi, b_lo, b_hi;
};

template <int ES> __device__ __forceinline__ uint32_t i8_scale_bits(const uint8_t *p) {
    if constexpr (ES == 2) return *reinterpret_cast<const uint16_t *>(p);
    return *reinterpret_cast<const uint32_t *>(p);
}

/* One block: four mma (4 bits: even and odd codes by masks) or two (8
 * bits: the codes as loaded), then the lane's planes weighted, scaled and
 * added. */
template <int SD, int BITS>
__device__ __forceinline__ void i8_block(const i8_roles &r, uint4 wl, uint4 wh, const uint4 *stage,
                                         const i8_params &p, float &acc_lo, float &acc_hi) {
    using G = i8_geom<BITS>;
    int d[4] = {0, 0, 0, 0};
    if constexpr (BITS == 4) {
        const uint4 x0 = stage[r.b_index], x1 = stage[r.b_index + 1];
        const uint32_t b[4][2] = {{x0.x, x0.y}, {x0.z, x0.w}, {x1.x, x1.y}, {x1.z, x1.w}};
        const uint32_t lo[4] = {wl.x, wl.y, wl.z, wl.w}, hi[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t a[4] = {lo[u] & 0x0F0F0F0Fu, hi[u] & 0x0F0F0F0Fu, (lo[u] >> 4) & 0x0F0F0F0Fu,
                                   (hi[u] >> 4) & 0x0F0F0F0Fu};
            mma_u8s8_16832(d, a, b[u]);
        }
    } else {
        const uint4 xb = stage[r.b_index];
        const uint32_t a0[4] = {wl.x, wh.x, wl.y, wh.y}, b0[2] = {xb.x, xb.y};
        const uint32_t a1[4] = {wl.z, wh.z, wl.w, wh.w}, b1[2] = {xb.z, xb.w};
        mma_u8s8_16832(d, a0, b0);
        mma_u8s8_16832(d, a1, b1);
    }
    if (!r.o_active) return;
    const float *sums = reinterpret_cast<const float *>(stage + G::FRAGS);
    const float up = sums[4];
    const float v_lo = fmaf((float)d[0], r.w0, (float)d[1] * r.w1);
    const float v_hi = fmaf((float)d[2], r.w0, (float)d[3] * r.w1);
    acc_lo = fmaf(group_value<SD>(p.s_lo), v_lo * up, acc_lo);
    acc_hi = fmaf(group_value<SD>(p.s_hi), v_hi * up, acc_hi);
    if (r.o_bias) {
        const float xsum = sums[r.o_slot];
        acc_lo = fmaf(group_value<SD>(p.b_lo), xsum, acc_lo);
        acc_hi = fmaf(group_value<SD>(p.b_hi), xsum, acc_hi);
    }
}

/* ---- the kernel ----
 * A block of 4 warps per 16-row tile and column part, as gemv_tc_pipe_kernel
 * (tc_lane_setup, tc_finish). (A streamed grid, each warp an equal run of
 * (tile, block) units across tile boundaries, was slower.)
 * Each lane streams its warp's blocks of the tile: pointers at the warp's
 * first block, advanced once per S blocks (within those the offsets are
 * constants), and how many of them it loads weights, scales and
 * activations for. Requests past those counts are skipped and leave stale
 * registers, which multiply zeros: a block's columns past the row have zero
 * activations (and zero sums); a lane's rows past the matrix point at row 0
 * and are never stored. SLOTS: groups per block (1 or 2). */
template <int SLOTS, int ES> struct i8_tile_lane {
    const uint8_t *w_lo, *w_hi;               /* the lane's 16 bytes of rows g, g + 8 */
    const uint8_t *s_lo, *s_hi, *b_lo, *b_hi; /* its output slot's scale, bias */
    const uint4 *x;                           /* its uint4 of the prepared activations */
    int n, n_w, n_s, n_x;                     /* blocks: the warp's; with weights, scales, activations to load */
    i8_roles r;
};

template <int BITS, int SLOTS, int ES>
__device__ __forceinline__ i8_tile_lane<SLOTS, ES> i8_tile_lane_of(const gemv_tc_args &a, const tc_lane &L) {
    using G = i8_geom<BITS>;
    i8_tile_lane<SLOTS, ES> s;
    const int gc = G::BC / SLOTS;
    s.r = i8_roles_of<BITS>(L.g, L.c, gc, L.b_lo != NULL);
    const int first = L.first, n = max(0, L.last - L.first);
    s.n = n;
    /* blocks whose columns of this lane are in the row */
    const int w_blocks = (int)((a.cols - G::LC * L.c + G::BC - 1) / G::BC);
    s.n_w = max(0, min(L.last, w_blocks) - first);
    s.w_lo = L.w_lo + (size_t)first * 64;
    s.w_hi = L.w_hi + (size_t)first * 64;
    const int s_blocks = (int)((a.cols - s.r.o_slot * gc + G::BC - 1) / G::BC);
    s.n_s = s.r.o_active ? max(0, min(L.last, s_blocks) - first) : 0;
    const size_t s_off = ((size_t)first * SLOTS + (s.r.o_active ? s.r.o_slot : 0)) * ES;
    s.s_lo = L.s_lo + s_off;
    s.s_hi = L.s_hi + s_off;
    s.b_lo = s.r.o_bias ? L.b_lo + s_off : NULL;
    s.b_hi = s.r.o_bias ? L.b_hi + s_off : NULL;
    s.x = L.prepared + (size_t)first * G::BU + (L.lane < G::BU ? L.lane : 0);
    s.n_x = L.lane < G::BU ? n : 0;
    return s;
}

/* Requests block j of the lane's stream (j < 2 S: a constant under the
 * unrolled loop): the activations into stage x (one cp.async group, empty
 * when not this lane's), weights and scales into registers. */
template <int BITS, int SLOTS, int ES>
__device__ __forceinline__ void i8_tile_issue_x(const i8_tile_lane<SLOTS, ES> &s, uint4 *x, int j) {
    if (j < s.n_x) cp_async16(x, s.x + j * i8_geom<BITS>::BU);
    cp_async_commit();
}

template <int SLOTS, int ES>
__device__ __forceinline__ void i8_tile_issue_w(const i8_tile_lane<SLOTS, ES> &s, int j, uint4 &wl, uint4 &wh,
                                                i8_params &p) {
    if (j < s.n_w) {
        wl = load_stream16(s.w_lo + j * 64);
        wh = load_stream16(s.w_hi + j * 64);
    }
    if (j < s.n_s) {
        p.s_lo = i8_scale_bits<ES>(s.s_lo + j * SLOTS * ES);
        p.s_hi = i8_scale_bits<ES>(s.s_hi + j * SLOTS * ES);
        if (s.r.o_bias) {
            p.b_lo = i8_scale_bits<ES>(s.b_lo + j * SLOTS * ES);
            p.b_hi = i8_scale_bits<ES>(s.b_hi + j * SLOTS * ES);
        }
    }
}

template <int BITS, int SLOTS, int ES>
__device__ __forceinline__ void i8_tile_issue(const i8_tile_lane<SLOTS, ES> &s, uint4 *x, int j, uint4 &wl,
                                              uint4 &wh, i8_params &p) {
    i8_tile_issue_x<BITS>(s, x, j);
    i8_tile_issue_w(s, j, wl, wh, p);
}

/* A lane's run over its stream of blocks, software-pipelined over S
 * stages: while block i is computed, blocks i + 1 .. i + S - 1 are in
 * flight (weights and scales in registers, the prepared activations
 * through the warp's ring of stages in shared memory). The loop is unrolled
 * by S so that the register ring's indices and the blocks' offsets are
 * constants. early: the first S - 1 blocks' weights and scales go out
 * before pdl_wait (the kernel's caller has not waited yet; the weights are
 * never written by a kernel), their activations after it. */
template <int SD, int BITS, int SLOTS, int S>
__device__ __forceinline__ void i8_run(const gemv_tc_args &a, const tc_lane &L, uint4 *stages, float &acc_lo,
                                       float &acc_hi, bool early) {
    using G = i8_geom<BITS>;
    constexpr int ES = SD == TC_SCALE_F32 ? 4 : 2;
    if (L.lane < 2 * S) stages[(L.lane >> 1) * G::STAGE + G::BU + (L.lane & 1)] = make_uint4(0, 0, 0, 0);
    i8_tile_lane<SLOTS, ES> s = i8_tile_lane_of<BITS, SLOTS, ES>(a, L);
    uint4 *my_x = stages + (L.lane < G::BU ? L.lane : 0);
    uint4 wl[S] = {}, wh[S] = {};
    i8_params p[S] = {};
#pragma unroll
    for (int k = 0; k < S - 1; k++) i8_tile_issue_w(s, k, wl[k], wh[k], p[k]);
    if (early) pdl_wait();
#pragma unroll
    for (int k = 0; k < S - 1; k++) i8_tile_issue_x<BITS>(s, my_x + k * G::STAGE, k);
    /* S blocks per pass; the stream's pointers and counts then move on by S */
    while (s.n > 0) {
#pragma unroll
        for (int k = 0; k < S; k++) {
            if (k >= s.n) break;
            const int next = (k + S - 1) % S; /* computed last step (and __syncwarp'd) */
            i8_tile_issue<BITS>(s, my_x + next * G::STAGE, k + S - 1, wl[next], wh[next], p[next]);
            cp_async_wait_newest<S - 1>(); /* this block's group has landed */
            __syncwarp();
            i8_block<SD, BITS>(s.r, wl[k], wh[k], stages + k * G::STAGE, p[k], acc_lo, acc_hi);
            __syncwarp(); /* stage k is refilled next step */
        }
        s.w_lo += S * 64, s.w_hi += S * 64;
        s.s_lo += S * SLOTS * ES, s.s_hi += S * SLOTS * ES;
        if (s.r.o_bias) s.b_lo += S * SLOTS * ES, s.b_hi += S * SLOTS * ES;
        s.x += S * G::BU;
        s.n -= S, s.n_w -= S, s.n_s -= S, s.n_x -= S;
    }
}

template <int SD, int BITS, int SLOTS, int S>
__global__ void __launch_bounds__(TC_WARPS * 32, 5) gemv_i8_kernel(gemv_tc_args a) {
    using G = i8_geom<BITS>;
    const bool early = !a.ids; /* (see i8_run) */
    if (!early) pdl_wait();
    __shared__ uint4 ring[TC_WARPS][S][G::STAGE];
    tc_lane L;
    if (!tc_lane_setup(a, L, G::BU)) return;
    float acc_lo = 0.0f, acc_hi = 0.0f;
    i8_run<SD, BITS, SLOTS, S>(a, L, ring[L.warp][0], acc_lo, acc_hi, early);
    tc_finish(a, L, acc_lo, acc_hi);
}

/* The MoE down projection with the tokens' weighted sums (see
 * tc_moe_down_finish in cuda_gemv_tc.cuh). */
template <int SD, int BITS, int SLOTS, int S>
__global__ void __launch_bounds__(TC_MOE_WARPS * 32) gemv_i8_moe_down_kernel(gemv_tc_args a, const float *weights,
                                                                             int k) {
    using G = i8_geom<BITS>;
    pdl_wait();
    __shared__ uint4 ring[TC_MOE_WARPS][S][G::STAGE];
    const int warp = threadIdx.x >> 5;
    const tc_place t = tc_moe_place(blockIdx.x, blockIdx.y, k, warp);
    tc_lane L;
    float acc_lo = 0.0f, acc_hi = 0.0f;
    if (warp < k && tc_lane_place(a, L, G::BU, t, 0, a.n_blocks))
        i8_run<SD, BITS, SLOTS, S>(a, L, ring[warp][0], acc_lo, acc_hi, false);
    tc_moe_down_finish(a, weights, k, blockIdx.y, t.row0, acc_lo, acc_hi);
}

size_t cuda_gemv_i8_prepared_uint4(int n_blocks, int bits) {
    return (size_t)n_blocks * (bits == 8 ? i8_geom<8>::BU : i8_geom<4>::BU);
}

void cuda_gemv_i8_prepare(cuda_ctx *c, uint4 *prepared, const float *x, size_t x_stride, int64_t cols, int n_blocks,
                          int n_x, int group_cols, int copies, int bits, const cuda_moe_route_job &route) {
    const int64_t items = (int64_t)n_x * n_blocks;
    const dim3 grid(cuda_blocks((size_t)(items * copies), TC_WARPS) + (route.n > 0 ? 1 : 0));
    const size_t copy_uint4 = (size_t)items * (bits == 8 ? i8_geom<8>::BU : i8_geom<4>::BU);
    if (bits == 8)
        cuda_launch(c, gemv_i8_prepare_kernel<8>, grid, TC_WARPS * 32, 0, prepared, x, x_stride, cols, n_blocks, n_x,
                    group_cols, copies, copy_uint4, route);
    else
        cuda_launch(c, gemv_i8_prepare_kernel<4>, grid, TC_WARPS * 32, 0, prepared, x, x_stride, cols, n_blocks, n_x,
                    group_cols, copies, copy_uint4, route);
}

/* The launches: scale storage (SD), width (BITS), groups per block (SLOTS). */
template <int SD, int BITS, int SLOTS>
static void launch_i8_moe_down(cuda_ctx *c, const gemv_tc_args &a, int n_tokens, const float *weights, int k) {
    const dim3 grid((unsigned)a.n_tiles, (unsigned)n_tokens);
    cuda_launch(c, gemv_i8_moe_down_kernel<SD, BITS, SLOTS, 3>, grid, TC_MOE_WARPS * 32, 0, a, weights, k);
}

template <int SD, int BITS, int SLOTS> static void launch_i8_tiles(cuda_ctx *c, const gemv_tc_args &a, int n_slots) {
    const dim3 grid((unsigned)(a.n_tiles * a.parts), (unsigned)n_slots);
    cuda_launch(c, gemv_i8_kernel<SD, BITS, SLOTS, 3>, grid, TC_WARPS * 32, 0, a);
}

/* n_tokens > 0: the MoE down projection with the sums (weights, k); else the GEMV over n_slots slots */
template <int SD, int BITS, int SLOTS>
static void launch_i8_one(cuda_ctx *c, const gemv_tc_args &a, int n_slots, int n_tokens, const float *weights, int k) {
    if (n_tokens > 0)
        launch_i8_moe_down<SD, BITS, SLOTS>(c, a, n_tokens, weights, k);
    else
        launch_i8_tiles<SD, BITS, SLOTS>(c, a, n_slots);
}

template <int SD>
static void launch_i8_shape(cuda_ctx *c, const gemv_tc_args &a, int n_slots, int n_tokens, const float *weights,
                            int k) {
    /* groups per block: 4 bits 128 / group (64, 128), 8 bits 64 / group (32, 64) */
    if (a.bits == 8) {
        if (a.group_size == 32)
            launch_i8_one<SD, 8, 2>(c, a, n_slots, n_tokens, weights, k);
        else
            launch_i8_one<SD, 8, 1>(c, a, n_slots, n_tokens, weights, k);
    } else if (a.group_size == 64) {
        launch_i8_one<SD, 4, 2>(c, a, n_slots, n_tokens, weights, k);
    } else {
        launch_i8_one<SD, 4, 1>(c, a, n_slots, n_tokens, weights, k);
    }
}

static void launch_i8(cuda_ctx *c, const gemv_tc_args &a, int n_slots, int n_tokens, const float *weights, int k,
                      int scale_dtype) {
    switch (scale_dtype) {
    case TC_SCALE_BF16: launch_i8_shape<TC_SCALE_BF16>(c, a, n_slots, n_tokens, weights, k); break;
    case TC_SCALE_F16: launch_i8_shape<TC_SCALE_F16>(c, a, n_slots, n_tokens, weights, k); break;
    default: launch_i8_shape<TC_SCALE_F32>(c, a, n_slots, n_tokens, weights, k); break;
    }
}

void cuda_gemv_i8_moe_down_launch(cuda_ctx *c, const gemv_tc_args &a, int n_tokens, const float *weights, int k,
                                  int scale_dtype) {
    launch_i8(c, a, 0, n_tokens, weights, k, scale_dtype);
}

void cuda_gemv_i8_launch(cuda_ctx *c, const gemv_tc_args &a, int n_slots, int scale_dtype) {
    launch_i8(c, a, n_slots, 0, NULL, 0, scale_dtype);
}
