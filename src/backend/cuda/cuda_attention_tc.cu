/* Prefill attention on tensor cores, the older kernel: for head_dim
 * 257..512 and where the flash kernel (cuda_attention_flash.cu, head_dim
 * 64..256) does not fit the GPU's shared memory (or tune.attn = tc asks for
 * it, a test hook).
 * Flash-attention style with S and P through shared memory.
 *
 * A block of 8 warps owns BM query rows of one KV head (row r: token r / G,
 * head kvh * G + r % G, as attention_kernel numbers them) and walks the
 * union of their key ranges (per run of one sequence) in tiles of 32 keys,
 * read through the block tables (kv_slot: rings work). Per tile:
 *  1. the tile's slots; 2. the peaks of |K| and |V| over the tile (one read
 *  of the pool, converted from its type as read: kv_load4); 3. K as fp16 hi + lo in shared memory;
 *  4. S = Q K^T (mma m16n8k16, warps over 16-row x 8-key pieces) into shared
 *  memory as float32; 5. the online softmax in float32, TPR threads per row,
 *  each row masked to its own [lo, hi] (windows, causality, image blocks
 *  reaching forward), P written as fp16 hi + lo, and V transposed into
 *  shared memory (the buffer K used) as fp16 hi + lo; 6. O += P V (warps
 *  over 16 rows x a share of the channels, accumulators in registers).
 *
 * Accuracy (float32-like, tests/tools/attention_tc_layout.py emulates it):
 * every operand x is scaled by a power of two and split x = hi + lo, both
 * fp16 (22 significant bits; scaled peaks in [2^14, 2^15) so neither part
 * overflows and lo underflows only below peak * 2^-38). Q has one scale per
 * block, K one per tile, P is p * 2^14 (p <= 1) and V one scale per tile
 * that only ever decreases within a run, so the running O is rescaled by a
 * power of two <= 1 together with the softmax's alpha and never overflows.
 * Each product is hi*hi + lo*hi + hi*lo (lo*lo is below float32 rounding);
 * fp16 products are exact in float32. Each k-step's (Q K^T) or tile's (P V)
 * three mma go into a fresh accumulator that is added in float32: the tensor
 * core's accumulation truncates, and truncating against the small partial
 * sum instead of the running total keeps that error at float32 size
 * (emulated: ~1e-7 relative against float64, the float32 kernel ~1e-7 too).
 * bf16 hi + lo (16 bits) would leave ~1e-5 relative error on the scores.
 *
 * Blocks run the tiles of the latest tokens first (they see the most keys:
 * a causal prompt's work per tile grows along it, and the longest tiles
 * started last would leave the GPU waiting on them). Where there are too few tiles
 * to fill the GPU (E2B's one KV head), each tile's keys are also split into
 * pieces, one block each, merged by cuda_attention_merge (tca_split_len).
 *
 * Shared memory: Q hi/lo, one K-or-V^T buffer, S, P: 155 KB at head_dim 512
 * (32 rows), 126 KB at 256 with 64 rows, 83 KB with 32. K=V and KV-shared
 * layers need nothing here: the caller passes the cache to read. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_attention_tc.cuh"

#define TCA_THREADS 256
#define TCA_WARPS 8
#define TCA_BN 32          /* keys per tile */
#define TCA_U 4            /* loads in flight per thread in the staging loops (two blocks per SM) */
#define TCA_U_WIDE 8       /* the same with one block per SM (more registers) */
#define TCA_MAX_PIECES 8   /* key pieces per tile when split (at most ATTN_MAX_SPLITS) */

__device__ __forceinline__ uint32_t tca_ld32(const __half *p) { return *reinterpret_cast<const uint32_t *>(p); }

/* (row, column) of i = start, start + TCA_THREADS, ... over rows of `cols`
 * columns: i / cols and i % cols without a division per step. */
struct tca_walk {
    int r, c, dr, dc, cols;
    __device__ __forceinline__ tca_walk(int start, int cols_)
        : r(start / cols_), c(start % cols_), dr(TCA_THREADS / cols_), dc(TCA_THREADS % cols_), cols(cols_) {}
    __device__ __forceinline__ void next() {
        r += dr;
        c += dc;
        if (c >= cols) {
            c -= cols;
            r++;
        }
    }
};

/* Shared memory of one block, in bytes (the kernel carves it the same way). */
static size_t tca_smem_bytes(int D, int BM) {
    const size_t ldq = (size_t)D + 8, ldp = TCA_BN + 8;
    const size_t kv = 2 * (size_t)TCA_BN * ldq > 2 * (size_t)D * ldp ? 2 * (size_t)TCA_BN * ldq : 2 * (size_t)D * ldp;
    return 2 * BM * ldq * 2 + kv * 2 + (size_t)BM * (TCA_BN + 4) * 4 + 2 * BM * ldp * 2 + 2 * (size_t)BM * 4 +
           2 * TCA_WARPS * 4 + TCA_BN * 8;
}

/* DMAX: head_dim bound (channel loops run to the actual D); BM: query rows
 * per block (16 per warp along the rows, the other warps split keys in
 * Q K^T and channels in P V). */
template <int DMAX, int BM>
__global__ void __launch_bounds__(TCA_THREADS, DMAX <= 256 && BM == 32 ? 2 : 1) attention_tc_kernel(attn_tc_params p) {
    pdl_wait();
    constexpr int BN = TCA_BN;
    constexpr int MW = BM / 16;            /* warps along the rows */
    constexpr int DW = TCA_WARPS / MW;     /* warps along keys (Q K^T) or channels (P V) */
    constexpr int QN = BN / 8 / DW;        /* key n-tiles per warp in Q K^T */
    constexpr int NT = DMAX / 8 / DW;      /* channel n-tiles per warp in P V */
    constexpr int TPR = TCA_THREADS / BM;  /* softmax threads per row */
    constexpr int KPT = BN / TPR;          /* keys per softmax thread */
    constexpr int LDP = BN + 8;            /* halves per P row and per V^T row: conflict-free fragment loads */
    constexpr int LDS = BN + 4;            /* floats per score row */
    constexpr int U = DMAX <= 256 && BM == 32 ? TCA_U : TCA_U_WIDE; /* loads in flight per thread */
    static_assert(MW * DW == TCA_WARPS && QN >= 1 && KPT >= 2 && KPT % 2 == 0 && TPR <= 32, "tile shape");
    extern __shared__ __align__(16) unsigned char tca_smem[];
    const int D = p.D, ldq = D + 8; /* halves per Q and K row: (D + 8) / 2 words, an odd multiple of 4 */
    const int D4 = D >> 2, dn = D >> 3;
    __half *Qs = reinterpret_cast<__half *>(tca_smem); /* [2][BM][ldq]: hi, lo */
    __half *KV = Qs + 2 * BM * ldq;                    /* K [2][BN][ldq], then V^T [2][D][LDP] */
    const int kv_halves = max(2 * BN * ldq, 2 * D * LDP);
    float *Ss = reinterpret_cast<float *>(KV + kv_halves); /* [BM][LDS] */
    __half *Ps = reinterpret_cast<__half *>(Ss + BM * LDS); /* [2][BM][LDP] */
    float *row_alpha = reinterpret_cast<float *>(Ps + 2 * BM * LDP); /* [BM] */
    float *row_l = row_alpha + BM;                                   /* [BM] */
    float *red = row_l + BM;                                         /* [2][TCA_WARPS] */
    int64_t *slots = reinterpret_cast<int64_t *>(red + 2 * TCA_WARPS); /* [BN] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int mt = warp % MW, wd = warp / MW;
    int split, kvh, tile; /* (the latest tokens' tiles first) */
    tca_block(p, &split, &kvh, &tile);
    const int first_row = tile * BM;
    const int total_rows = p.n_tokens * p.G;
    const int last_row = min(first_row + BM, total_rows) - 1;
    if (last_row < first_row) return; /* the whole block */

    /* the block's query rows as hi + lo, scaled by one power of two */
    /* (every staging loop below issues U loads before it uses any: in
     * a plain loop each load would wait for the one before) */
    float peak = 0.0f;
    for (tca_walk w(tid, D4); w.r < BM;) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++, w.next())
            v[u] = w.r < BM && first_row + w.r <= last_row
                       ? *reinterpret_cast<const float4 *>(tca_q_row(p, kvh, first_row + w.r) + w.c * 4)
                       : make_float4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) peak = fmaxf(peak, tca_absmax4(v[u]));
    }
    peak = warp_max(peak);
    if (lane == 0) red[warp] = peak;
    __syncthreads();
    peak = red[0];
    for (int w = 1; w < TCA_WARPS; w++) peak = fmaxf(peak, red[w]);
    const int eq = tca_exponent(peak, 0, 126);
    const float q_up = tca_pow2(eq), q_down = tca_pow2(-eq);
    for (tca_walk w(tid, D4); w.r < BM;) {
        float4 v[U];
        int rr[U], dd[U];
#pragma unroll
        for (int u = 0; u < U; u++, w.next()) {
            rr[u] = w.r;
            dd[u] = w.c * 4;
            v[u] = w.r < BM && first_row + w.r <= last_row
                       ? *reinterpret_cast<const float4 *>(tca_q_row(p, kvh, first_row + w.r) + w.c * 4)
                       : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (rr[u] >= BM) break;
            uint32_t h0, l0, h1, l1;
            tca_split(v[u].x * q_up, v[u].y * q_up, h0, l0);
            tca_split(v[u].z * q_up, v[u].w * q_up, h1, l1);
            *reinterpret_cast<uint2 *>(Qs + rr[u] * ldq + dd[u]) = make_uint2(h0, h1);
            *reinterpret_cast<uint2 *>(Qs + (BM + rr[u]) * ldq + dd[u]) = make_uint2(l0, l1);
        }
    }
    /* (the first tile's barriers order these stores before any fragment load) */

    /* the row this thread's softmax share belongs to */
    const int srow = tid / TPR, spart = tid % TPR;
    int s_t = -1, s_lo = 1, s_hi = 0;
    if (first_row + srow <= last_row) {
        s_t = (first_row + srow) / p.G;
        s_lo = p.kv_range[4 * s_t + p.range_off];
        s_hi = p.kv_range[4 * s_t + p.range_off + 1];
    }

    const int t_first = first_row / p.G, t_last = last_row / p.G;
    for (int run_start = t_first; run_start <= t_last;) {
        /* a run: consecutive tokens of one sequence */
        const int s = p.seq[run_start];
        int lo_u, hi_u;
        const int run_end = attn_run(p.seq, p.kv_range, p.range_off, run_start, t_last, &lo_u, &hi_u);
        tca_piece(p, split, &lo_u, &hi_u);
        const bool s_active = s_t >= run_start && s_t < run_end;
        float m = -INFINITY, l = 0.0f; /* this thread's row */
        int ev = TCA_V_EXP_START;      /* V's scale exponent (block-uniform, never increases) */
        float acc[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][k] = 0.0f;
        const bool any_keys = lo_u <= hi_u;
        for (int tile_lo = lo_u; any_keys && tile_lo <= hi_u; tile_lo += BN) {
            /* 1. slots (after the previous tile's P V: the K/V buffer is free) */
            if (tid < BN) slots[tid] = tile_lo + tid <= hi_u ? kv_slot(p.tb, s, tile_lo + tid) : -1;
            __syncthreads();
            /* 2. the tile's peaks */
            float pk = 0.0f, pv = 0.0f;
            for (tca_walk w(tid, D4); w.r < BN;) {
                float4 kv4[U], vv4[U];
#pragma unroll
                for (int u = 0; u < U; u++, w.next()) {
                    kv4[u] = vv4[u] = make_float4(0, 0, 0, 0);
                    if (w.r < BN && slots[w.r] >= 0) {
                        const int64_t row = slots[w.r] * p.n_kv + kvh;
                        kv4[u] = kv_load4(p.kp, p.ks, p.kv_type, row, D, w.c * 4);
                        vv4[u] = kv_load4(p.vp, p.vs, p.kv_type, row, D, w.c * 4);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    pk = fmaxf(pk, tca_absmax4(kv4[u]));
                    pv = fmaxf(pv, tca_absmax4(vv4[u]));
                }
            }
            pk = warp_max(pk);
            pv = warp_max(pv);
            if (lane == 0) {
                red[warp] = pk;
                red[TCA_WARPS + warp] = pv;
            }
            __syncthreads();
            pk = red[0];
            pv = red[TCA_WARPS];
            for (int w = 1; w < TCA_WARPS; w++) {
                pk = fmaxf(pk, red[w]);
                pv = fmaxf(pv, red[TCA_WARPS + w]);
            }
            /* 3. K as hi + lo, [part][key][channel] */
            const int ek = tca_exponent(pk, 0, 126);
            const float k_up = tca_pow2(ek);
            for (tca_walk w(tid, D4); w.r < BN;) {
                float4 v[U];
                int jj[U], dd[U];
#pragma unroll
                for (int u = 0; u < U; u++, w.next()) {
                    jj[u] = w.r;
                    dd[u] = w.c * 4;
                    v[u] = make_float4(0, 0, 0, 0);
                    if (w.r < BN && slots[w.r] >= 0)
                        v[u] = kv_load4(p.kp, p.ks, p.kv_type, slots[w.r] * p.n_kv + kvh, D, w.c * 4);
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (jj[u] >= BN) break;
                    uint32_t h0, l0, h1, l1;
                    tca_split(v[u].x * k_up, v[u].y * k_up, h0, l0);
                    tca_split(v[u].z * k_up, v[u].w * k_up, h1, l1);
                    *reinterpret_cast<uint2 *>(KV + jj[u] * ldq + dd[u]) = make_uint2(h0, h1);
                    *reinterpret_cast<uint2 *>(KV + (BN + jj[u]) * ldq + dd[u]) = make_uint2(l0, l1);
                }
            }
            __syncthreads();
            /* 4. S = Q K^T: this warp's 16 rows (m-tile mt) x key n-tiles wd + DW i */
            {
                float sacc[QN][4];
#pragma unroll
                for (int i = 0; i < QN; i++)
#pragma unroll
                    for (int k = 0; k < 4; k++) sacc[i][k] = 0.0f;
                const __half *qa = Qs + (mt * 16 + g) * ldq + 2 * tig;
                for (int k0 = 0; k0 < D; k0 += 16) {
                    uint32_t a[2][4];
#pragma unroll
                    for (int part = 0; part < 2; part++) {
                        const __half *pa = qa + part * BM * ldq + k0;
                        a[part][0] = tca_ld32(pa);
                        a[part][1] = tca_ld32(pa + 8 * ldq);
                        a[part][2] = tca_ld32(pa + 8);
                        a[part][3] = tca_ld32(pa + 8 * ldq + 8);
                    }
#pragma unroll
                    for (int i = 0; i < QN; i++) {
                        const int n = (wd + DW * i) * 8 + g;
                        uint32_t b[2][2];
#pragma unroll
                        for (int part = 0; part < 2; part++) {
                            const __half *pb = KV + (part * BN + n) * ldq + k0 + 2 * tig;
                            b[part][0] = tca_ld32(pb);
                            b[part][1] = tca_ld32(pb + 8);
                        }
                        float t4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_f16_16816(t4, a[1], b[0]); /* q_lo k_hi */
                        mma_f16_16816(t4, a[0], b[1]); /* q_hi k_lo */
                        mma_f16_16816(t4, a[0], b[0]); /* q_hi k_hi */
#pragma unroll
                        for (int k = 0; k < 4; k++) sacc[i][k] += t4[k];
                    }
                }
#pragma unroll
                for (int i = 0; i < QN; i++) {
                    const int col = (wd + DW * i) * 8 + 2 * tig, row = mt * 16 + g;
                    *reinterpret_cast<float2 *>(Ss + row * LDS + col) = make_float2(sacc[i][0], sacc[i][1]);
                    *reinterpret_cast<float2 *>(Ss + (row + 8) * LDS + col) = make_float2(sacc[i][2], sacc[i][3]);
                }
            }
            __syncthreads();
            /* 5a. the online softmax of this thread's KPT keys of row srow */
            {
                const float sf = p.scale * q_down * tca_pow2(-ek);
                float sv[KPT];
                float tmax = -INFINITY;
#pragma unroll
                for (int i = 0; i < KPT; i++) {
                    const int j = spart * KPT + i, pos = tile_lo + j;
                    const bool valid = s_active && pos <= hi_u && pos >= s_lo && pos <= s_hi;
                    sv[i] = valid ? Ss[srow * LDS + j] * sf : -INFINITY;
                    tmax = fmaxf(tmax, sv[i]);
                }
#pragma unroll
                for (int o = 1; o < TPR; o <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
                const float m_new = fmaxf(m, tmax);
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < KPT; i++) {
                    sv[i] = m_new == -INFINITY ? 0.0f : expf(sv[i] - m_new);
                    sum += sv[i];
                }
#pragma unroll
                for (int o = 1; o < TPR; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                float alpha = 1.0f; /* rows outside this run keep their (zero) accumulators */
                if (s_active) {
                    alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
                    l = l * alpha + sum;
                    m = m_new;
                }
                const float p_up = tca_pow2(TCA_P_EXP);
#pragma unroll
                for (int i = 0; i < KPT; i += 2) {
                    const int j = spart * KPT + i;
                    uint32_t hi, lo;
                    tca_split(sv[i] * p_up, sv[i + 1] * p_up, hi, lo);
                    *reinterpret_cast<uint32_t *>(Ps + srow * LDP + j) = hi;
                    *reinterpret_cast<uint32_t *>(Ps + (BM + srow) * LDP + j) = lo;
                }
                if (spart == 0) {
                    row_alpha[srow] = alpha;
                    row_l[srow] = l;
                }
            }
            /* 5b. V transposed, [part][channel][key], scaled by 2^ev (ev only decreases) */
            const int ev_new = min(ev, tca_exponent(pv, TCA_V_EXP_START, TCA_V_EXP_START));
            const float v_change = ev_new - ev < -126 ? 0.0f : tca_pow2(ev_new - ev);
            ev = ev_new;
            {
                const float v_up = tca_pow2(ev);
                for (int i0 = tid; i0 < (BN / 2) * D4; i0 += U * TCA_THREADS) {
                    float4 v0[U], v1[U];
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int i = i0 + u * TCA_THREADS;
                        const int j = 2 * (i % (BN / 2)), d = (i / (BN / 2)) * 4;
                        v0[u] = v1[u] = make_float4(0, 0, 0, 0);
                        if (i < (BN / 2) * D4) {
                            if (slots[j] >= 0)
                                v0[u] = kv_load4(p.vp, p.vs, p.kv_type, slots[j] * p.n_kv + kvh, D, d);
                            if (slots[j + 1] >= 0)
                                v1[u] = kv_load4(p.vp, p.vs, p.kv_type, slots[j + 1] * p.n_kv + kvh, D, d);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int i = i0 + u * TCA_THREADS;
                        if (i >= (BN / 2) * D4) break;
                        const int j = 2 * (i % (BN / 2)), d = (i / (BN / 2)) * 4;
                        const float a[4] = {v0[u].x, v0[u].y, v0[u].z, v0[u].w};
                        const float b[4] = {v1[u].x, v1[u].y, v1[u].z, v1[u].w};
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            uint32_t hi, lo;
                            tca_split(a[c] * v_up, b[c] * v_up, hi, lo);
                            *reinterpret_cast<uint32_t *>(KV + (d + c) * LDP + j) = hi;
                            *reinterpret_cast<uint32_t *>(KV + (D + d + c) * LDP + j) = lo;
                        }
                    }
                }
            }
            __syncthreads();
            /* 6. O = O alpha 2^(ev change) + P V: rows of m-tile mt, channel n-tiles wd + DW i */
            {
                const int r0 = mt * 16 + g;
                const float f0 = row_alpha[r0] * v_change, f1 = row_alpha[r0 + 8] * v_change;
                uint32_t a[BN / 16][2][4];
#pragma unroll
                for (int ks = 0; ks < BN / 16; ks++)
#pragma unroll
                    for (int part = 0; part < 2; part++) {
                        const __half *pa = Ps + (part * BM + r0) * LDP + ks * 16 + 2 * tig;
                        a[ks][part][0] = tca_ld32(pa);
                        a[ks][part][1] = tca_ld32(pa + 8 * LDP);
                        a[ks][part][2] = tca_ld32(pa + 8);
                        a[ks][part][3] = tca_ld32(pa + 8 * LDP + 8);
                    }
#pragma unroll
                for (int i = 0; i < NT; i++) {
                    const int nt = wd + DW * i;
                    if (nt < dn) {
                        float t4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int ks = 0; ks < BN / 16; ks++) {
                            uint32_t b[2][2];
#pragma unroll
                            for (int part = 0; part < 2; part++) {
                                const __half *pb = KV + (part * D + nt * 8 + g) * LDP + ks * 16 + 2 * tig;
                                b[part][0] = tca_ld32(pb);
                                b[part][1] = tca_ld32(pb + 8);
                            }
                            mma_f16_16816(t4, a[ks][1], b[0]); /* p_lo v_hi */
                            mma_f16_16816(t4, a[ks][0], b[1]); /* p_hi v_lo */
                            mma_f16_16816(t4, a[ks][0], b[0]); /* p_hi v_hi */
                        }
                        acc[i][0] = fmaf(acc[i][0], f0, t4[0]);
                        acc[i][1] = fmaf(acc[i][1], f0, t4[1]);
                        acc[i][2] = fmaf(acc[i][2], f1, t4[2]);
                        acc[i][3] = fmaf(acc[i][3], f1, t4[3]);
                    }
                }
            }
        }
        __syncthreads(); /* row_l of the last tile */
        /* results of this run's rows: O 2^-(ev + 14) / l, or as a piece's
         * partial (O 2^-(ev + 14), m, l) */
        const float out_f = tca_pow2(-(ev + TCA_P_EXP));
        if (p.splits > 1 && spart == 0 && s_active) {
            const size_t ps = ((size_t)s_t * p.n_heads + kvh * p.G + (first_row + srow) % p.G) * p.splits + split;
            p.part_ml[2 * ps] = any_keys ? m : -INFINITY;
            p.part_ml[2 * ps + 1] = any_keys ? l : 0.0f;
        }
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = mt * 16 + g + 8 * half, gr = first_row + r;
            if (gr > last_row) continue;
            const int t = gr / p.G;
            if (t < run_start || t >= run_end) continue;
            const float lr = any_keys ? row_l[r] : 0.0f;
            const size_t th = (size_t)t * p.n_heads + kvh * p.G + gr % p.G;
            float *o = p.splits > 1 ? p.part_acc + (th * p.splits + split) * D : p.out + th * D;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                const int nt = wd + DW * i;
                if (nt < dn) {
                    float2 v = make_float2(0.0f, 0.0f);
                    if (p.splits > 1) {
                        if (!(lr > 0.0f)) continue; /* a piece without keys: the merge skips it */
                        v.x = acc[i][2 * half] * out_f;
                        v.y = acc[i][2 * half + 1] * out_f;
                    } else if (lr > 0.0f) {
                        v.x = acc[i][2 * half] * out_f / lr;
                        v.y = acc[i][2 * half + 1] * out_f / lr;
                    }
                    *reinterpret_cast<float2 *>(o + nt * 8 + 2 * tig) = v;
                }
            }
        }
        run_start = run_end;
    }
}

template <int DMAX, int BM> static void launch_attention_tc(cuda_ctx *c, const attn_tc_params &p, size_t smem) {
    static unsigned configured; /* per device */
    tca_launch(c, attention_tc_kernel<DMAX, BM>, &configured, p, TCA_THREADS, smem, "attention_tc");
}

/* Keys per piece when each tile's keys are split over several blocks (0:
 * not split). A causal prompt gives its last tiles the most keys: with no
 * more tiles than multiprocessors the longest tile alone sets the time.
 * With many tiles the pieces' partials and their merge cost more than the
 * balance gains. So: pieces where one or two KV heads leave the
 * multiprocessors short of tiles (tune.attn_tc_split >= 0 forces a length;
 * 0: never). */
static int tca_split_len(const cuda_ctx *c, int tiles, int n_kv) {
    if (c->tune.attn_tc_split >= 0) return c->tune.attn_tc_split;
    return n_kv <= 2 && (int64_t)tiles * n_kv <= c->caps.sm_count ? 256 : 0;
}

int cuda_attention_tc(cuda_ctx *c, float *out, const float *q, const cuda_kv *kv, const g4_attn_batch *b, int sliding,
                      int n_heads, float scale) {
    const int D = kv->head_dim, Hkv = kv->n_kv_heads;
    if (D < 64 || D > 512 || D % 16 || ((uintptr_t)q & 15) || ((uintptr_t)out & 7)) return 0;
    const int dmax = D <= 128 ? 128 : D <= 256 ? 256 : 512;
    const int G = n_heads / Hkv;
    /* Rows per block: 32 at head_dim 512 (registers and shared memory);
     * below, 64: K/V staged once for twice the rows, one block per
     * multiprocessor (faster than 32 and two blocks). */
    const int flash_rows = c->tune.attn != G4_CUDA_ATTN_TC ? cuda_attention_flash_rows(c, D) : 0;
    int BM = flash_rows ? flash_rows : dmax > 256 ? 32 : 64;
    if (!flash_rows && BM == 64 && tca_smem_bytes(D, 64) > c->caps.smem_optin) BM = 32; /* less shared memory */
    const size_t smem = tca_smem_bytes(D, BM);
    if (!flash_rows && smem > c->caps.smem_optin) return 0; /* (512 needs ~155 KB: fits an A100's 163 KB) */
    attn_tc_params p;
    static_cast<attn_common &>(p) = attn_common_of(out, q, kv, b, sliding, n_heads, scale);
    p.tiles = (int)(((int64_t)b->n_tokens * G + BM - 1) / BM);
    p.splits = 1;
    p.split_len = INT32_MAX / 2;
    p.part_acc = p.part_ml = NULL;
    const int split_len = tca_split_len(c, p.tiles, Hkv);
    if (split_len > 0) {
        /* pieces of split_len keys from each run's first key, as many as
         * the longest possible run needs (the cache's capacity), at most
         * TCA_MAX_PIECES (their partials take rows x pieces x head_dim
         * floats: a long context gets longer pieces instead) */
        const int64_t span = (int64_t)(sliding ? b->ring_blocks : b->full_table_stride) * b->block_size + 2 * BM;
        int64_t len = split_len;
        if ((span + len - 1) / len > TCA_MAX_PIECES) len = (span + TCA_MAX_PIECES - 1) / TCA_MAX_PIECES;
        len = (len + TCA_BN - 1) / TCA_BN * TCA_BN;
        p.split_len = (int)len;
        p.splits = (int)((span + len - 1) / len);
        if (p.splits > 1 &&
            !cuda_attention_parts(c, (int64_t)b->n_tokens * n_heads, p.splits, D, &p.part_acc, &p.part_ml))
            return 1;
        if (p.splits <= 1) p.splits = 1, p.split_len = INT32_MAX / 2;
    }
    if (flash_rows)
        cuda_attention_flash(c, p);
    else if (dmax == 128 && BM == 64)
        launch_attention_tc<128, 64>(c, p, smem);
    else if (dmax == 128)
        launch_attention_tc<128, 32>(c, p, smem);
    else if (dmax == 256 && BM == 64)
        launch_attention_tc<256, 64>(c, p, smem);
    else if (dmax == 256)
        launch_attention_tc<256, 32>(c, p, smem);
    else
        launch_attention_tc<512, 32>(c, p, smem);
    if (p.splits > 1) cuda_attention_merge(c, out, p.part_acc, p.part_ml, (int64_t)b->n_tokens * n_heads, p.splits, D);
    return 1;
}
