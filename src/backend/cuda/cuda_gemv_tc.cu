/* One-token GEMV for 4-bit weights (MLX affine, MXFP4) on tensor cores.
 *
 * Why: the float32 GEMV in cuda_matmul.cu spends ~4 instructions per 4-bit
 * weight (extract, convert, fma, plus its share of activation loads) and
 * reaches about a quarter of the memory bandwidth: it is issue-bound, not
 * memory-bound. Here 4-bit codes become fp16 pairs with three integer
 * instructions per two weights and an mma.sync multiplies 16 rows x 16
 * columns at once.
 *
 * Exactness: codes (0..15, or twice the E2M1 magnitude 0..12) are exact in
 * fp16. The activations of each 128-column block are scaled by a power of
 * two (largest magnitude into [2^14, 2^15): no overflow, no loss) and split
 * into fp16 hi + lo (about 22 significant bits); both parts go through the
 * tensor core as two of the mma's eight output columns. Products of fp16 are
 * exact in float32 and the tensor core accumulates in float32. (bf16 hi + lo
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
 * applies group p's scale.
 *
 * G4_CUDA_GEMV_TC=0 turns this path off (the float32 GEMV runs instead). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

#define TC_WARPS 4
#define TC_BLOCK_COLS 128

/* Pre-pass: per activation row and 128-column block, 32 uint4 of B
 * fragments (index (c * 2 + h) * 4 + u: quad lane c, part h, code word u),
 * and 8 floats: the sum of x over each group slot of the block (4) and the
 * power of two the fragments were divided by. One warp per block of
 * columns. */
__global__ void gemv_tc_prepare_kernel(uint4 *frags, float *sums, const float *x, size_t x_stride, int64_t cols,
                                       int n_blocks, int n_rows, int group_cols) {
    __shared__ float xs[TC_WARPS][TC_BLOCK_COLS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * TC_WARPS + warp;
    if (item >= (int64_t)n_blocks * n_rows) return;
    const int row = (int)(item / n_blocks), blk = (int)(item % n_blocks);
    const float *xr = x + (size_t)row * x_stride;
    const int64_t col0 = (int64_t)blk * TC_BLOCK_COLS;
    float sum = 0.0f, peak = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t col = col0 + 4 * lane + i;
        const float v = col < cols ? xr[col] : 0.0f;
        xs[warp][4 * lane + i] = v;
        sum += v;
        peak = fmaxf(peak, fabsf(v));
    }
    /* group slot sums: lanes of one slot hold consecutive columns */
    const int seg = group_cols / 4; /* lanes per group slot: 8, 16 or 32 */
    for (int o = 1; o < seg; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    peak = warp_max(peak);
    /* 2^e with peak / 2^e in [2^14, 2^15): fp16 holds every scaled value */
    int e = 0;
    if (peak > 0.0f && peak <= 3.4e38f) {
        frexpf(peak, &e); /* peak = m 2^e, m in [0.5, 1) */
        e -= 15;
    }
    const float down = ldexpf(1.0f, -e);
    float *srow = sums + item * 8;
    if (lane < 8) srow[lane] = lane == 4 ? ldexpf(1.0f, e) : 0.0f;
    __syncwarp();
    if (lane % seg == 0) srow[lane / seg] = sum;
    /* this lane's uint4: quad lane c, part h, word u */
    const int c = lane >> 3, h = (lane >> 2) & 1, u = lane & 3;
    uint32_t out[4];
#pragma unroll
    for (int half = 0; half < 2; half++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int k = 32 * c + 8 * u + 2 * half + r;
            const float a = xs[warp][k] * down, b = xs[warp][k + 4] * down;
            __half2 v = __floats2half2_rn(a, b);
            if (h == 1) {
                const float2 hf = __half22float2(v);
                v = __floats2half2_rn(a - hf.x, b - hf.y);
            }
            out[half * 2 + r] = *reinterpret_cast<uint32_t *>(&v);
        }
    frags[item * 32 + lane] = make_uint4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ void mma_16816(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t f16x2_sub(uint32_t a, uint32_t b) {
    __half2 r = __hsub2(*reinterpret_cast<__half2 *>(&a), *reinterpret_cast<__half2 *>(&b));
    return *reinterpret_cast<uint32_t *>(&r);
}

/* The four fp16 pairs of a word of 4-bit codes: pair i = (code i, code i + 4).
 * Affine: the code itself (0..15). MXFP4: twice the E2M1 value (0, +-1, +-2,
 * +-3, +-4, +-6, +-8, +-12); the caller halves the scale. */
template <bool MX>
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t *p) {
    const uint32_t magic = 0x64006400u; /* fp16 1024.0 in both halves: 1024 + v exact for v < 1024 */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t s = w >> (4 * i);
        if constexpr (!MX) {
            p[i] = f16x2_sub((s & 0x000F000Fu) | magic, magic);
        } else {
            /* magnitude index of codes i and i + 4 into nibbles 0 and 2 of a selector */
            const uint32_t sel = __byte_perm(s & 0x00070007u, 0u, 0x4420u);
            /* bytes {0,1,2,3} and {4,6,8,12}: twice the E2M1 magnitudes */
            const uint32_t mag = __byte_perm(0x03020100u, 0x0C080604u, sel);
            const uint32_t v = f16x2_sub(mag | magic, magic);
            p[i] = v | ((w << (12 - 4 * i)) & 0x80008000u); /* code bit 3 -> fp16 sign */
        }
    }
}

struct gemv_tc_args {
    const uint8_t *data, *scales, *biases;
    size_t row_bytes, scale_row_bytes;
    int scale_dtype, group_size;
    int64_t rows, cols;
    const uint4 *frags;
    const float *sums;
    int n_blocks;
    float *out;
    size_t out_stride;
    const int32_t *ids;
    int64_t expert_stride, row_offset;
    int x_div, n_experts;
    const float *gelu_mul;
};

/* scale of row `row_scales` for group g (MXFP4: E8M0, halved for the
 * doubled codes) */
template <bool MX>
__device__ __forceinline__ float group_scale(const uint8_t *row_scales, int dtype, int64_t g) {
    if constexpr (MX) return 0.5f * e8m0_value(row_scales[g]);
    return load_group_param(row_scales, dtype, g);
}

/* Weight loads in flight per lane: this many 128-column blocks of both rows. */
#define TC_PREFETCH 4

/* KS warps of a block split one 16-row tile's columns into contiguous
 * ranges (more warps, more loads in flight); KS = 1: a warp owns a tile. */
template <bool MX, int KS>
__global__ void __launch_bounds__(TC_WARPS * 32, 5) gemv_tc_kernel(gemv_tc_args a) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int tile = warp / KS, kslice = warp % KS;
    const int64_t row0 = ((int64_t)blockIdx.x * (TC_WARPS / KS) + tile) * 16;
    const uint8_t *data = a.data, *scales = a.scales, *biases = a.biases;
    const float *mul = a.gelu_mul;
    float *out = a.out;
    int xrow = 0;
    if (a.ids) {
        const int slot = blockIdx.y;
        const int e = a.ids[slot];
        if (e < 0 || e >= a.n_experts) return;
        const int64_t base = (int64_t)e * a.expert_stride + a.row_offset;
        if (mul) mul += (size_t)slot * a.out_stride;
        data += (size_t)base * a.row_bytes;
        scales += (size_t)base * a.scale_row_bytes;
        if (biases) biases += (size_t)base * a.scale_row_bytes;
        xrow = slot / a.x_div;
        out += (size_t)slot * a.out_stride;
    }
    const int64_t r_lo = row0 + g, r_hi = row0 + g + 8;
    const bool ok_lo = r_lo < a.rows, ok_hi = r_hi < a.rows;
    /* group slots per 128-column block and this lane's roles */
    const int gc = a.group_size < TC_BLOCK_COLS ? a.group_size : TC_BLOCK_COLS;
    const int slots = TC_BLOCK_COLS / gc;
    const int my_slot = c * 32 / gc;    /* slot of the columns this lane's codes cover */
    const int b_part = g - 2 * my_slot; /* as a B lane: which part (hi 0, lo 1), if 0 or 1 */
    const bool b_active = b_part == 0 || b_part == 1;
    const bool scale_lane = c < slots; /* output columns 2c, 2c + 1 are group slot c */
    const uint8_t *w_lo = data + (size_t)(ok_lo ? r_lo : 0) * a.row_bytes + 16 * c;
    const uint8_t *w_hi = data + (size_t)(ok_hi ? r_hi : 0) * a.row_bytes + 16 * c;
    const uint8_t *s_lo = scales + (size_t)(ok_lo ? r_lo : 0) * a.scale_row_bytes;
    const uint8_t *s_hi = scales + (size_t)(ok_hi ? r_hi : 0) * a.scale_row_bytes;
    const uint8_t *b_lo = biases ? biases + (size_t)(ok_lo ? r_lo : 0) * a.scale_row_bytes : NULL;
    const uint8_t *b_hi = biases ? biases + (size_t)(ok_hi ? r_hi : 0) * a.scale_row_bytes : NULL;
    const uint4 *frags = a.frags + (size_t)xrow * a.n_blocks * 32 + (size_t)(c * 2 + (b_active ? b_part : 0)) * 4;
    const float *sums = a.sums + (size_t)xrow * a.n_blocks * 8;
    const int64_t cols = a.cols;
    /* this warp's blocks: a contiguous share of the row */
    const int per = (a.n_blocks + KS - 1) / KS;
    const int first = kslice * per, last = min(a.n_blocks, first + per);
    float acc_lo = 0.0f, acc_hi = 0.0f;
    for (int blk0 = first; blk0 < last; blk0 += TC_PREFETCH) {
        uint4 wl[TC_PREFETCH], wh[TC_PREFETCH];
#pragma unroll
        for (int k = 0; k < TC_PREFETCH; k++) {
            const int blk = blk0 + k;
            const bool in = blk < last && (int64_t)blk * TC_BLOCK_COLS + 32 * c < cols;
            const size_t off = (size_t)blk * 64;
            wl[k] = in && ok_lo ? load_stream16(w_lo + off) : make_uint4(0, 0, 0, 0);
            wh[k] = in && ok_hi ? load_stream16(w_hi + off) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < TC_PREFETCH; k++) {
            const int blk = blk0 + k;
            if (blk >= last) break;
            uint4 xb[4];
#pragma unroll
            for (int u = 0; u < 4; u++) xb[u] = b_active ? __ldg(frags + (size_t)blk * 32 + u) : make_uint4(0, 0, 0, 0);
            const uint32_t wlw[4] = {wl[k].x, wl[k].y, wl[k].z, wl[k].w};
            const uint32_t whw[4] = {wh[k].x, wh[k].y, wh[k].z, wh[k].w};
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int u = 0; u < 4; u++) {
                uint32_t pl[4], ph[4];
                decode_word<MX>(wlw[u], pl);
                decode_word<MX>(whw[u], ph);
                const uint32_t b0[2] = {xb[u].x, xb[u].y}, b1[2] = {xb[u].z, xb[u].w};
                const uint32_t a0[4] = {pl[0], ph[0], pl[1], ph[1]}, a1[4] = {pl[2], ph[2], pl[3], ph[3]};
                mma_16816(d, a0, b0);
                mma_16816(d, a1, b1);
            }
            const int64_t gcol = (int64_t)blk * TC_BLOCK_COLS + (int64_t)c * gc; /* first column of slot c */
            if (scale_lane && gcol < cols) {
                const int64_t grp = gcol / a.group_size;
                const float up = sums[(size_t)blk * 8 + 4]; /* the block's power of two */
                const float sl = group_scale<MX>(s_lo, a.scale_dtype, grp);
                const float sh = group_scale<MX>(s_hi, a.scale_dtype, grp);
                acc_lo = fmaf(sl, (d[0] + d[1]) * up, acc_lo);
                acc_hi = fmaf(sh, (d[2] + d[3]) * up, acc_hi);
                if (!MX && b_lo) {
                    const float xsum = sums[(size_t)blk * 8 + c];
                    acc_lo = fmaf(load_group_param(b_lo, a.scale_dtype, grp), xsum, acc_lo);
                    acc_hi = fmaf(load_group_param(b_hi, a.scale_dtype, grp), xsum, acc_hi);
                }
            }
        }
    }
    /* the quad's group slots, then the block's column slices */
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
    if constexpr (KS > 1) {
        __shared__ float part[TC_WARPS][16];
        if (c == 0) {
            part[warp][g] = acc_lo;
            part[warp][g + 8] = acc_hi;
        }
        __syncthreads();
        if (kslice != 0 || c != 0) return;
        for (int k = 1; k < KS; k++) {
            acc_lo += part[warp + k][g];
            acc_hi += part[warp + k][g + 8];
        }
    }
    if (c != 0) return;
    if (ok_lo) out[r_lo] = mul ? __fmul_rn(gelu_tanh(acc_lo), mul[r_lo]) : acc_lo;
    if (ok_hi) out[r_hi] = mul ? __fmul_rn(gelu_tanh(acc_hi), mul[r_hi]) : acc_hi;
}

/* Handles the product when the shape and format allow (returns 1), else
 * returns 0 and the caller runs the float32 GEMV. */
int cuda_gemv_tc(cuda_ctx *c, float *out, size_t out_stride, const float *x, size_t x_stride, int n_tokens,
                 const g4_matrix *w, const int32_t *ids, int n_slots, int x_div, int64_t expert_stride,
                 int64_t row_offset, int n_experts, const float *gelu_mul) {
    if (!c->gemv_tc || (!ids && n_tokens != 1)) return 0;
    const bool mx = w->format == G4_WEIGHT_MXFP4;
    if (!(w->format == G4_WEIGHT_AFFINE || mx) || w->bits != 4) return 0;
    const int gs = w->group_size;
    if (mx ? gs != 32 : !(gs == 32 || gs == 64 || (gs >= 128 && gs % 128 == 0))) return 0;
    if (w->cols % 32 != 0 || w->cols % gs != 0 || w->row_bytes != (size_t)w->cols / 2 || ((uintptr_t)w->data & 15u) != 0 ||
        w->row_bytes % 16 != 0)
        return 0;
    if (!ids) n_slots = 1;
    if (x_div <= 0) x_div = 1;
    const int n_x = ids ? (n_slots + x_div - 1) / x_div : 1;
    const int n_blocks = (int)((w->cols + TC_BLOCK_COLS - 1) / TC_BLOCK_COLS);
    const size_t frag_bytes = (size_t)n_x * n_blocks * 32 * sizeof(uint4);
    uint8_t *scratch = (uint8_t *)cuda_scratch(c, SCRATCH_GEMV_FRAGS, frag_bytes + (size_t)n_x * n_blocks * 32);
    if (!scratch) return 1; /* failure recorded */
    uint4 *frags = (uint4 *)scratch;
    float *sums = (float *)(scratch + frag_bytes);
    const int gc = gs < TC_BLOCK_COLS ? gs : TC_BLOCK_COLS;
    const int64_t items = (int64_t)n_x * n_blocks;
    gemv_tc_prepare_kernel<<<cuda_blocks((size_t)items, TC_WARPS), TC_WARPS * 32, 0, c->stream>>>(
        frags, sums, x, x_stride, w->cols, n_blocks, n_x, gc);
    if (!cuda_launched(c, "gemv_tc_prepare")) return 1;

    gemv_tc_args a;
    a.data = (const uint8_t *)w->data;
    a.scales = (const uint8_t *)w->scales;
    a.biases = (const uint8_t *)w->biases;
    a.row_bytes = w->row_bytes;
    a.scale_row_bytes = w->scale_row_bytes;
    a.scale_dtype = dev_matrix_of(w).scale_dtype;
    a.group_size = gs;
    a.rows = w->rows;
    a.cols = w->cols;
    a.frags = frags;
    a.sums = sums;
    a.n_blocks = n_blocks;
    a.out = out;
    a.out_stride = out_stride;
    a.ids = ids;
    a.expert_stride = expert_stride;
    a.row_offset = row_offset;
    a.x_div = x_div;
    a.n_experts = n_experts;
    a.gelu_mul = gelu_mul;
    const int64_t tiles = (w->rows + 15) / 16;
    /* a warp per tile and whole rows only when that alone gives 16 warps per
     * multiprocessor (e.g. a 262144-row LM head); else four warps per tile */
    const bool split = tiles * n_slots < 16 * (int64_t)c->sm_count;
    if (split) {
        dim3 grid((unsigned)tiles, (unsigned)n_slots);
        if (mx)
            gemv_tc_kernel<true, TC_WARPS><<<grid, TC_WARPS * 32, 0, c->stream>>>(a);
        else
            gemv_tc_kernel<false, TC_WARPS><<<grid, TC_WARPS * 32, 0, c->stream>>>(a);
    } else {
        dim3 grid((unsigned)((tiles + TC_WARPS - 1) / TC_WARPS), (unsigned)n_slots);
        if (mx)
            gemv_tc_kernel<true, 1><<<grid, TC_WARPS * 32, 0, c->stream>>>(a);
        else
            gemv_tc_kernel<false, 1><<<grid, TC_WARPS * 32, 0, c->stream>>>(a);
    }
    cuda_launched(c, "gemv_tc");
    return 1;
}
