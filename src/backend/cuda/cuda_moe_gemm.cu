/* The MoE experts' prefill products for bf16 expert weights: a grouped
 * GEMM over the slots sorted by expert (cuda_groups), its operands streamed
 * through shared memory by a multi-stage cp.async pipeline.
 *
 * Why: the general grouped kernel (mma_gemm_kernel, cuda_matmul.cu) loads
 * each k tile into registers one step ahead and converts it there, so a
 * block has one tile's bytes in flight and waits a memory round trip per
 * 32 columns; on the 26B-A4B's experts (128 x 704 x 2816, ~32 slots per
 * expert at 512 tokens) it read the weights at ~35% of the bandwidth. Here
 * bf16 weights need no conversion and the activations are split into bf16
 * hi + lo once per call (cuda_split_bf16), so both are copied as they are,
 * MOE_STAGES - 1 k tiles ahead.
 *
 * Tile: 64 slots (one group tile) x 128 weight rows, k tiles of 32 columns;
 * 8 warps as 2 (rows) x 4 (weight rows), each 32 x 32 by mma m16n8k16.
 * Precision as mma_gemm_kernel's: with lo parts, x_lo w + x_hi w (bf16
 * weights are exact in one part), float32 accumulation. */
#include "backend/cuda/cuda_internal.cuh"

#define MOE_BM CUDA_MMA_GROUP_BM /* slots per tile */
#define MOE_BN 128               /* weight rows per tile */
#define MOE_BK 32                /* columns per k tile */
#define MOE_LDS (MOE_BK + 8)     /* bf16 per shared row: 80 bytes, conflict-free fragment loads */
#define MOE_STAGES 4

struct moe_gemm_args {
    const __nv_bfloat16 *x_hi, *x_lo; /* [rows][K] activation parts (x_lo NULL: one product) */
    int x_div;                        /* slot s reads activation row s / x_div */
    const uint8_t *w;                 /* bf16 rows: expert e's row r at e * expert_stride + row_offset + r */
    size_t row_bytes;
    int64_t expert_stride, row_offset;
    int64_t N, K; /* weight rows per expert, columns */
    float *out;   /* out[slot][n], row stride out_stride */
    size_t out_stride;
    cuda_groups g;
};

template <bool SPLIT> __host__ __device__ constexpr size_t moe_stage_halves() {
    return (size_t)((SPLIT ? 2 : 1) * MOE_BM + MOE_BN) * MOE_LDS;
}

template <bool SPLIT>
__global__ void __launch_bounds__(256) moe_gemm_bf16_kernel(moe_gemm_args a) {
    constexpr int PARTS = SPLIT ? 2 : 1;
    extern __shared__ __align__(16) uint16_t moe_smem[];
    const int tile = blockIdx.x;
    if (tile >= *a.g.n_tiles) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const int e = a.g.tile_expert[tile];
    const int32_t *rowlist = a.g.sorted + a.g.tile_start[tile];
    const int m_len = a.g.tile_len[tile];
    const int64_t n0 = (int64_t)blockIdx.y * MOE_BN;

    /* what this thread copies per k tile: one 16-byte piece of an
     * activation row per part (row tid / 4, piece tid % 4) and two of a
     * weight row (row tid / 2, pieces 2 (tid % 2) and the next) */
    const int am = tid >> 2, apiece = tid & 3;
    const bool a_ok = am < m_len;
    const size_t a_row = a_ok ? (size_t)(rowlist[am] / a.x_div) * (size_t)a.K : 0;
    const int bn = tid >> 1, bpiece = (tid & 1) * 2;
    const bool b_ok = n0 + bn < a.N;
    const uint8_t *b_row = a.w + (size_t)((int64_t)e * a.expert_stride + a.row_offset + (b_ok ? n0 + bn : 0)) * a.row_bytes;

    auto stage_a = [&](int s, int p) { return moe_smem + (size_t)s * moe_stage_halves<SPLIT>() + (size_t)p * MOE_BM * MOE_LDS; };
    auto stage_b = [&](int s) { return moe_smem + (size_t)s * moe_stage_halves<SPLIT>() + (size_t)PARTS * MOE_BM * MOE_LDS; };
    auto issue = [&](int kt, int s) {
        const int64_t k0 = (int64_t)kt * MOE_BK;
        cp_async16_or_zero(stage_a(s, 0) + am * MOE_LDS + apiece * 8, a.x_hi + a_row + k0 + apiece * 8, a_ok);
        if constexpr (SPLIT)
            cp_async16_or_zero(stage_a(s, 1) + am * MOE_LDS + apiece * 8, a.x_lo + a_row + k0 + apiece * 8, a_ok);
#pragma unroll
        for (int i = 0; i < 2; i++)
            cp_async16_or_zero(stage_b(s) + bn * MOE_LDS + (bpiece + i) * 8, b_row + (size_t)(k0 + (bpiece + i) * 8) * 2,
                               b_ok);
    };

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.0f;

    const int KT = (int)(a.K / MOE_BK);
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; s++) {
        if (s < KT) issue(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait_newest<MOE_STAGES - 2>(); /* k tile kt has landed (this thread's copies) */
        __syncthreads();                        /* everyone's, and k tile kt - 1's stage is free */
        if (kt + MOE_STAGES - 1 < KT) issue(kt + MOE_STAGES - 1, (kt + MOE_STAGES - 1) % MOE_STAGES);
        cp_async_commit();
        const int s = kt % MOE_STAGES;
#pragma unroll
        for (int kk = 0; kk < MOE_BK; kk += 16) {
            uint32_t af[PARTS][2][4], bf[4][2];
#pragma unroll
            for (int p = 0; p < PARTS; p++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const uint16_t *r = stage_a(s, p) + (wm * 32 + i * 16 + g) * MOE_LDS + kk + tig * 2;
                    af[p][i][0] = *reinterpret_cast<const uint32_t *>(r);
                    af[p][i][1] = *reinterpret_cast<const uint32_t *>(r + 8 * MOE_LDS);
                    af[p][i][2] = *reinterpret_cast<const uint32_t *>(r + 8);
                    af[p][i][3] = *reinterpret_cast<const uint32_t *>(r + 8 * MOE_LDS + 8);
                }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint16_t *r = stage_b(s) + (wn * 32 + j * 8 + g) * MOE_LDS + kk + tig * 2;
                bf[j][0] = *reinterpret_cast<const uint32_t *>(r);
                bf[j][1] = *reinterpret_cast<const uint32_t *>(r + 8);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if constexpr (SPLIT) mma_bf16(acc[i][j], af[1][i], bf[j]); /* x_lo w */
                    mma_bf16(acc[i][j], af[0][i], bf[j]);
                }
        }
    }
    cp_async_wait_newest<0>();
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int m = wm * 32 + i * 16 + g + half * 8;
            if (m >= m_len) continue;
            float *o = a.out + (size_t)rowlist[m] * a.out_stride;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t n = n0 + wn * 32 + j * 8 + tig * 2;
                if (n < a.N) o[n] = acc[i][j][2 * half];
                if (n + 1 < a.N) o[n + 1] = acc[i][j][2 * half + 1];
            }
        }
}

int cuda_moe_gemm_bf16_supported(const g4_matrix *w) {
    return w->format == G4_WEIGHT_BF16 && w->cols % MOE_BK == 0 && w->row_bytes % 16 == 0 &&
           ((uintptr_t)w->data & 15) == 0;
}

template <bool SPLIT> static void launch_moe_gemm(cuda_ctx *c, const moe_gemm_args &a) {
    constexpr size_t smem = MOE_STAGES * moe_stage_halves<SPLIT>() * sizeof(uint16_t);
    static int configured; /* the opt-in above 48 KB, once per kernel */
    if (!configured) {
        if (!cuda_check(c,
                        cudaFuncSetAttribute(moe_gemm_bf16_kernel<SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        "cudaFuncSetAttribute"))
            return;
        configured = 1;
    }
    dim3 grid((unsigned)a.g.max_tiles, cuda_blocks((size_t)a.N, MOE_BN));
    moe_gemm_bf16_kernel<SPLIT><<<grid, 256, smem, c->stream>>>(a);
    cuda_launched(c, "moe_gemm_bf16");
}

void cuda_moe_gemm_bf16(cuda_ctx *c, float *out, size_t out_stride, const __nv_bfloat16 *x_hi,
                        const __nv_bfloat16 *x_lo, int x_div, const g4_matrix *w, int64_t rows, int64_t expert_stride,
                        int64_t row_offset, const cuda_groups *g) {
    if (rows <= 0) return;
    moe_gemm_args a;
    a.x_hi = x_hi;
    a.x_lo = x_lo;
    a.x_div = x_div > 0 ? x_div : 1;
    a.w = (const uint8_t *)w->data;
    a.row_bytes = w->row_bytes;
    a.expert_stride = expert_stride;
    a.row_offset = row_offset;
    a.N = rows;
    a.K = w->cols;
    a.out = out;
    a.out_stride = out_stride;
    a.g = *g;
    if (x_lo)
        launch_moe_gemm<true>(c, a);
    else
        launch_moe_gemm<false>(c, a);
}
