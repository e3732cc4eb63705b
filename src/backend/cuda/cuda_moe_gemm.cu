/* The MoE experts' prefill products: a grouped GEMM over the slots sorted
 * by expert (cuda_groups), its operands streamed through shared memory by a
 * multi-stage cp.async pipeline.
 *
 * Why: the general grouped kernel (mma_gemm_kernel, cuda_matmul.cu) loads
 * each k tile into registers one step ahead and converts it there, so a
 * block has one tile's bytes in flight and waits a memory round trip per
 * 32 columns, far from the bandwidth on the 26B-A4B's experts (128 x 704 x
 * 2816, ~32 slots per expert at 512 tokens). Here the activations are split into bf16 hi + lo once
 * per call (cuda_split_bf16) and copied as they are, and so are the weights'
 * stored bytes, MOE_STAGES - 1 k tiles ahead. bf16 weights go to the
 * tensor cores as stored; quantised ones (MLX affine 4/8-bit, MXFP4) are
 * decoded per k tile from their staged codes into one bf16 hi + lo tile,
 * their group's scale (and bias) loaded one stage ahead into registers and
 * kept in shared memory until used.
 *
 * Tile: 64 slots (one group tile) x 128 weight rows, k tiles of 32 columns
 * (inside one quantisation group: groups are multiples of 32 columns);
 * 8 warps as 2 (rows) x 4 (weight rows), each 32 x 32 by mma m16n8k16.
 * Precision as mma_gemm_kernel's: with lo parts, x_lo w_hi + x_hi w_lo +
 * x_hi w_hi (bf16 and MXFP4 weights are exact in one part: two products), float32
 * accumulation. Affine weights (scale s and bias b per group) with split
 * activations instead multiply their codes q, which are exact in bf16:
 * x_lo q + x_hi q and the row sums of x_lo + x_hi per group, then
 * s sum(x q) + b sum(x) in float32 (two products, no lo part of the weights,
 * and a cheaper decode than s q + b split into hi + lo). */
#include "backend/cuda/cuda_formats.cuh"
#include "backend/cuda/cuda_internal.cuh"

#define MOE_BM CUDA_MMA_GROUP_BM /* slots per tile */
#define MOE_BN 128               /* weight rows per tile */
#define MOE_BK 32                /* columns per k tile */
#define MOE_LDS (MOE_BK + 8)     /* bf16 per shared row: 80 bytes, conflict-free fragment loads */
#define MOE_STAGES 4

struct moe_gemm_args {
    const __nv_bfloat16 *x_hi, *x_lo; /* [rows][K] activation parts (x_lo NULL: one product) */
    int x_div;                        /* slot s reads activation row s / x_div */
    dev_matrix w;                     /* expert e's row r is row e * expert_stride + row_offset + r */
    int64_t expert_stride, row_offset;
    int64_t N, K; /* weight rows per expert, columns */
    float *out;   /* out[slot][n], row stride out_stride */
    size_t out_stride;
    cuda_groups g;
};

/* bytes of a weight row's k tile as stored */
template <int F> __host__ __device__ constexpr int moe_raw_bytes() { return 2 * mma_raw_bytes<F>(); }

/* One pipeline stage in halves: the activation parts, then the weights'
 * bytes as stored (bf16: the tile itself; quantised: codes, then each row's
 * scale and bias as floats). */
template <int F, bool SPLIT> __host__ __device__ constexpr size_t moe_a_halves() {
    return (size_t)(SPLIT ? 2 : 1) * MOE_BM * MOE_LDS;
}
template <int F> __host__ __device__ constexpr size_t moe_b_halves() {
    return F == FF_BF16 ? (size_t)MOE_BN * MOE_LDS : (size_t)MOE_BN * moe_raw_bytes<F>() / 2 + 2 * MOE_BN * 2;
}
template <int F, bool SPLIT> __host__ __device__ constexpr size_t moe_stage_halves() {
    return moe_a_halves<F, SPLIT>() + moe_b_halves<F>();
}
/* quantised weights: the decoded tile, hi (and lo) parts, after the stages */
/* Affine experts with split activations multiply their codes, exact in bf16,
 * and apply each group's scale and bias to the group's sums (see the kernel). */
template <int F, bool SPLIT> __host__ __device__ constexpr bool moe_exact_codes() { return SPLIT && is_affine<F>(); }

/* with split activations, whether the decoded weights need a lo part too */
template <int F, bool SPLIT> __host__ __device__ constexpr bool moe_w_lo() {
    return SPLIT && !exact_in_bf16<F>() && !moe_exact_codes<F, SPLIT>();
}

template <int F, bool SPLIT> __host__ __device__ constexpr size_t moe_smem_bytes() {
    return (MOE_STAGES * moe_stage_halves<F, SPLIT>() +
            (F == FF_BF16 ? 0 : (size_t)(moe_w_lo<F, SPLIT>() ? 2 : 1) * MOE_BN * MOE_LDS)) * sizeof(uint16_t);
}

/* blocks per multiprocessor the kernel is compiled for: three fit MXFP4's
 * shared memory (63 KB) if its registers stay at 85 (two blocks were
 * slower); the others are held to two by their shared memory (bf16)
 * or their registers (affine: ~126; held to 80 for three they spill 420 bytes) */
template <int F> __host__ __device__ constexpr int moe_min_blocks() { return F == FF_MXFP4 ? 3 : 2; }

template <int F, bool SPLIT>
__global__ void __launch_bounds__(256, moe_min_blocks<F>()) moe_gemm_kernel(moe_gemm_args a) {
    constexpr int PARTS = SPLIT ? 2 : 1;
    constexpr bool QUANT = F != FF_BF16;
    constexpr bool W_LO = moe_w_lo<F, SPLIT>();
    constexpr bool CODES = moe_exact_codes<F, SPLIT>();
    constexpr int RB = moe_raw_bytes<F>(), PR = RB / 16; /* bytes, 16-byte pieces per row and k tile */
    extern __shared__ __align__(16) uint16_t moe_smem[];
    __shared__ float lut[16];
    const int tile = blockIdx.x;
    if (tile >= *a.g.n_tiles) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    if constexpr (F == FF_MXFP4) {
        if (tid < 16) lut[tid] = e2m1_value(tid);
    }
    const int e = a.g.tile_expert[tile];
    const int32_t *rowlist = a.g.sorted + a.g.tile_start[tile];
    const int m_len = a.g.tile_len[tile];
    const int64_t n0 = (int64_t)blockIdx.y * MOE_BN;
    const int64_t first_row = (int64_t)e * a.expert_stride + a.row_offset + n0;

    /* what this thread copies per k tile: one 16-byte piece of an
     * activation row per part (row tid / 4, piece tid % 4); of the weights,
     * bf16: two pieces of row tid / 2; quantised: piece tid % PR of row
     * tid / PR (threads below 128 PR), and threads below 128 row tid's scale
     * and bias */
    const int am = tid >> 2, apiece = tid & 3;
    const bool a_ok = am < m_len;
    const size_t a_row = a_ok ? (size_t)(rowlist[am] / a.x_div) * (size_t)a.K : 0;
    const int bn = QUANT ? tid / PR : tid >> 1, bpiece = QUANT ? tid % PR : (tid & 1) * 2;
    const bool b_copies = !QUANT || tid < MOE_BN * PR;
    const bool b_ok = b_copies && n0 + bn < a.N;
    const uint8_t *b_row = a.w.data + (size_t)(first_row + (b_ok ? bn : 0)) * a.w.row_bytes;
    const bool s_ok = QUANT && tid < MOE_BN && n0 + tid < a.N;
    const uint8_t *s_row = s_ok ? a.w.scales + (size_t)(first_row + tid) * a.w.scale_row_bytes : NULL;
    const uint8_t *z_row = s_ok && a.w.biases ? a.w.biases + (size_t)(first_row + tid) * a.w.scale_row_bytes : NULL;

    auto stage_a = [&](int s, int p) { return moe_smem + (size_t)s * moe_stage_halves<F, SPLIT>() + (size_t)p * MOE_BM * MOE_LDS; };
    auto stage_b = [&](int s) { return moe_smem + (size_t)s * moe_stage_halves<F, SPLIT>() + moe_a_halves<F, SPLIT>(); };
    /* quantised: row r's scale and bias of stage s, after its codes */
    auto stage_sb = [&](int s) { return reinterpret_cast<float *>(stage_b(s) + MOE_BN * RB / 2); };
    uint16_t *decoded = moe_smem + MOE_STAGES * moe_stage_halves<F, SPLIT>(); /* [W parts][BN][LDS] */

    auto issue = [&](int kt, int s) {
        const int64_t k0 = (int64_t)kt * MOE_BK;
        cp_async16_or_zero(stage_a(s, 0) + am * MOE_LDS + apiece * 8, a.x_hi + a_row + k0 + apiece * 8, a_ok);
        if constexpr (SPLIT)
            cp_async16_or_zero(stage_a(s, 1) + am * MOE_LDS + apiece * 8, a.x_lo + a_row + k0 + apiece * 8, a_ok);
        if constexpr (!QUANT) {
#pragma unroll
            for (int i = 0; i < 2; i++)
                cp_async16_or_zero(stage_b(s) + bn * MOE_LDS + (bpiece + i) * 8,
                                   b_row + (size_t)(k0 + (bpiece + i) * 8) * 2, b_ok);
        } else if (b_copies) {
            cp_async16_or_zero(stage_b(s) + (bn * RB + bpiece * 16) / 2, b_row + (size_t)k0 * RB / MOE_BK + bpiece * 16,
                               b_ok);
        }
    };
    /* a k tile's scale and bias bits of row tid (one group: groups are whole k tiles) */
    auto load_sb = [&](int kt, uint32_t &sbits, uint32_t &zbits) {
        sbits = zbits = 0;
        if (!s_ok) return;
        const int64_t grp = (int64_t)kt * MOE_BK / a.w.group_size;
        if constexpr (F == FF_MXFP4) {
            sbits = s_row[grp];
        } else {
            sbits = load_group_bits(s_row, a.w.scale_dtype, grp);
            if (z_row) zbits = load_group_bits(z_row, a.w.scale_dtype, grp);
        }
    };
    auto store_sb = [&](int s, uint32_t sbits, uint32_t zbits) {
        if (tid >= MOE_BN) return;
        float sv = 0.0f, zv = 0.0f;
        if (s_ok) {
            if constexpr (F == FF_MXFP4) {
                sv = e8m0_value(sbits);
            } else {
                sv = group_bits_value(sbits, a.w.scale_dtype);
                zv = z_row ? group_bits_value(zbits, a.w.scale_dtype) : 0.0f;
            }
        }
        stage_sb(s)[tid] = sv;
        stage_sb(s)[MOE_BN + tid] = zv;
    };

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.0f;
    /* CODES: the current group's sums of x times the codes, and of x alone
     * (row sums by a product with a B fragment of ones: every column of
     * xsum[i] holds them), folded into acc at the group's last k tile as
     * acc += scale * qsum + bias * xsum */
    float qsum[CODES ? 2 : 1][4][4], xsum[CODES ? 2 : 1][4];
    if constexpr (CODES) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) qsum[i][j][k] = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) xsum[i][k] = 0.0f;
        }
    }
    const uint32_t ones[2] = {0x3F803F80u, 0x3F803F80u}; /* bf16 pairs of 1.0 */
    const int tiles_per_group = CODES ? a.w.group_size / MOE_BK : 1;
    /* this warp's 16-row fragments that hold slots (an expert's last tile is
     * often short: at 512 tokens the 26B-A4B's experts get ~32 slots each):
     * the others' products are skipped (the same for the whole warp) */
    const int live_i = m_len > wm * 32 + 16 ? 2 : m_len > wm * 32 ? 1 : 0;

    const int KT = (int)(a.K / MOE_BK);
    uint32_t s_pend = 0, z_pend = 0; /* quantised: the scale bits of the k tile issued last, stored one step later */
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; s++) {
        if (s < KT) {
            issue(s, s);
            if constexpr (QUANT) {
                uint32_t sb, zb;
                load_sb(s, sb, zb);
                store_sb(s, sb, zb);
            }
        }
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait_newest<MOE_STAGES - 2>(); /* k tile kt has landed (this thread's copies) */
        __syncthreads();                        /* everyone's; k tile kt - 1's stage and the decoded tile are free */
        const int s = kt % MOE_STAGES;
        if constexpr (QUANT) {
            /* the scales loaded last step (k tile kt + STAGES - 2, consumed two barriers from now at the earliest) */
            if (kt > 0 && kt + MOE_STAGES - 2 < KT) store_sb((kt + MOE_STAGES - 2) % MOE_STAGES, s_pend, z_pend);
        }
        if (kt + MOE_STAGES - 1 < KT) {
            issue(kt + MOE_STAGES - 1, (kt + MOE_STAGES - 1) % MOE_STAGES);
            if constexpr (QUANT) load_sb(kt + MOE_STAGES - 1, s_pend, z_pend);
        }
        cp_async_commit();
        const uint16_t *wtile = stage_b(s);
        if constexpr (QUANT) {
            /* decode this k tile: thread (row tid / 2, 16 columns (tid % 2) 16) */
            const int r = tid >> 1, half = tid & 1;
            uint32_t w[4];
            const uint32_t *src = reinterpret_cast<const uint32_t *>(stage_b(s) + (r * RB + half * RB / 2) / 2);
#pragma unroll
            for (int i = 0; i < RB / 8; i++) w[i] = src[i];
            uint32_t hi[8], lo[8];
            if constexpr (CODES) {
                codes16_bf16<F>(w, hi);
            } else {
                float v[16];
                dequant16<F>(w, stage_sb(s)[r], stage_sb(s)[MOE_BN + r], v, lut);
#pragma unroll
                for (int i = 0; i < 8; i++) split_pack(v[2 * i], v[2 * i + 1], hi[i], lo[i]);
            }
            uint4 *dh = reinterpret_cast<uint4 *>(decoded + r * MOE_LDS + half * 16);
            dh[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            dh[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
            if constexpr (W_LO) {
                uint4 *dl = reinterpret_cast<uint4 *>(decoded + (MOE_BN + r) * MOE_LDS + half * 16);
                dl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
                dl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
            }
            __syncthreads();
            wtile = decoded;
        }
#pragma unroll
        for (int kk = 0; kk < MOE_BK && live_i > 0; kk += 16) {
            uint32_t af[PARTS][2][4], bf[W_LO ? 2 : 1][4][2];
            /* ldmatrix: A rows lane % 16, columns +8 for lanes 16..31; B (two 8-row
             * fragments at once) rows lane % 8, +8 for lanes 16..31, columns +8 for
             * lanes 8..15 and 24..31 */
#pragma unroll
            for (int p = 0; p < PARTS; p++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (i >= live_i) continue;
                    ldmatrix_x4(af[p][i], stage_a(s, p) + (wm * 32 + i * 16 + (lane & 15)) * MOE_LDS + kk + 8 * (lane >> 4));
                }
#pragma unroll
            for (int p = 0; p < (W_LO ? 2 : 1); p++)
#pragma unroll
                for (int j = 0; j < 4; j += 2) {
                    uint32_t r[4];
                    ldmatrix_x4(r, wtile + (p * MOE_BN + wn * 32 + j * 8 + (lane & 7) + 8 * (lane >> 4)) * MOE_LDS + kk +
                                       8 * ((lane >> 3) & 1));
                    bf[p][j][0] = r[0], bf[p][j][1] = r[1], bf[p][j + 1][0] = r[2], bf[p][j + 1][1] = r[3];
                }
            if constexpr (CODES) {
#pragma unroll
                /* x_lo q, then x_hi q: a product's accumulator is not the one before's */
#pragma unroll
                for (int p = PARTS - 1; p >= 0; p--)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        if (i >= live_i) continue;
                        mma_bf16(xsum[i], af[p][i], ones);
#pragma unroll
                        for (int j = 0; j < 4; j++) mma_bf16(qsum[i][j], af[p][i], bf[0][j]);
                    }
            } else {
                /* x_lo w_hi, x_hi w_lo, x_hi w_hi, each over all fragments in turn */
#pragma unroll
                for (int term = 0; term < 3; term++) {
                    if (term == 0 && !SPLIT) continue;
                    if (term == 1 && !W_LO) continue;
#pragma unroll
                    for (int i = 0; i < 2; i++)
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            if (i >= live_i) continue;
                            if (term == 0) mma_bf16(acc[i][j], af[PARTS - 1][i], bf[0][j]);
                            else if (term == 1) mma_bf16(acc[i][j], af[0][i], bf[W_LO ? 1 : 0][j]);
                            else mma_bf16(acc[i][j], af[0][i], bf[0][j]);
                        }
                }
            }
        }
        if constexpr (CODES) {
            if ((kt + 1) % tiles_per_group == 0) {
                /* the group's scale and bias of this thread's weight rows (stage s holds this k tile's) */
                const float *sb = stage_sb(s);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int n = wn * 32 + j * 8 + tig * 2;
                    const float s0 = sb[n], s1 = sb[n + 1], b0 = sb[MOE_BN + n], b1 = sb[MOE_BN + n + 1];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        acc[i][j][0] = fmaf(s0, qsum[i][j][0], fmaf(b0, xsum[i][0], acc[i][j][0]));
                        acc[i][j][1] = fmaf(s1, qsum[i][j][1], fmaf(b1, xsum[i][0], acc[i][j][1]));
                        acc[i][j][2] = fmaf(s0, qsum[i][j][2], fmaf(b0, xsum[i][2], acc[i][j][2]));
                        acc[i][j][3] = fmaf(s1, qsum[i][j][3], fmaf(b1, xsum[i][2], acc[i][j][3]));
#pragma unroll
                        for (int k = 0; k < 4; k++) qsum[i][j][k] = 0.0f;
                    }
                }
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int k = 0; k < 4; k++) xsum[i][k] = 0.0f;
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

int cuda_moe_gemm_supported(const g4_matrix *w) {
    const int f = fast_format_of(w);
    if (w->cols % MOE_BK || w->row_bytes % 16 || ((uintptr_t)w->data & 15)) return 0;
    switch (f) {
    case FF_BF16: return w->row_bytes == (size_t)w->cols * 2;
    case FF_AFF4:
    case FF_AFF8:
        /* (whole groups: each group's sums are scaled at its last k tile) */
        return w->row_bytes == (size_t)w->cols * (size_t)w->bits / 8 && w->group_size > 0 &&
               w->group_size % MOE_BK == 0 && w->cols % w->group_size == 0 && w->scales != NULL;
    case FF_MXFP4: return w->row_bytes == (size_t)w->cols / 2 && w->group_size == 32 && w->scales != NULL;
    }
    return 0;
}

template <int F, bool SPLIT> static void launch_moe_gemm(cuda_ctx *c, const moe_gemm_args &a) {
    constexpr size_t smem = moe_smem_bytes<F, SPLIT>();
    static unsigned configured; /* the opt-in above 48 KB, once per kernel and device */
    if (!cuda_done_on_device(&configured, c)) {
        if (!cuda_check(c, cudaFuncSetAttribute(moe_gemm_kernel<F, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                        "cudaFuncSetAttribute"))
            return;
        cuda_mark_device(&configured, c);
    }
    dim3 grid((unsigned)a.g.max_tiles, cuda_blocks((size_t)a.N, MOE_BN));
    moe_gemm_kernel<F, SPLIT><<<grid, 256, smem, c->stream>>>(a);
    cuda_launched(c, "moe_gemm");
}

template <bool SPLIT> static void launch_moe_gemm_format(cuda_ctx *c, int f, const moe_gemm_args &a) {
    switch (f) {
    case FF_BF16: launch_moe_gemm<FF_BF16, SPLIT>(c, a); break;
    case FF_AFF4: launch_moe_gemm<FF_AFF4, SPLIT>(c, a); break;
    case FF_AFF8: launch_moe_gemm<FF_AFF8, SPLIT>(c, a); break;
    case FF_MXFP4: launch_moe_gemm<FF_MXFP4, SPLIT>(c, a); break;
    default: cuda_fail_op(c, "moe_gemm: unsupported weight format"); break;
    }
}

void cuda_moe_gemm(cuda_ctx *c, float *out, size_t out_stride, const __nv_bfloat16 *x_hi, const __nv_bfloat16 *x_lo,
                   int x_div, const g4_matrix *w, int64_t rows, int64_t expert_stride, int64_t row_offset,
                   const cuda_groups *g) {
    if (rows <= 0) return;
    moe_gemm_args a;
    a.x_hi = x_hi;
    a.x_lo = x_lo;
    a.x_div = x_div > 0 ? x_div : 1;
    a.w = dev_matrix_of(w);
    a.expert_stride = expert_stride;
    a.row_offset = row_offset;
    a.N = rows;
    a.K = w->cols;
    a.out = out;
    a.out_stride = out_stride;
    a.g = *g;
    if (x_lo)
        launch_moe_gemm_format<true>(c, fast_format_of(w), a);
    else
        launch_moe_gemm_format<false>(c, fast_format_of(w), a);
}
