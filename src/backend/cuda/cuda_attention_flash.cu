/* Prefill attention on tensor cores, flash-attention 2 style: the default
 * for head_dim 64..256 in multiples of 16 (cuda_attention_tc.cu decides;
 * its older kernel takes head_dim 512 and GPUs with less shared memory).
 *
 * A block of 8 warps owns 64 query rows of one KV head (row r: token r / G,
 * head kvh * G + r % G, as the other attention kernels number them) and
 * walks the union of their key ranges (per run of one sequence) in tiles of
 * 32 keys, read through the block tables (kv_slot: rings work). Two warps
 * own each 16 rows, each with 16 keys of every tile and its own softmax
 * state and O, merged at the end of a run. Per tile:
 *  1. (issued during the tile before) cp.async copies the tile's K and V
 *     rows as stored (float32, bf16 or fp8 e4m3, whose row scales come
 *     along) into shared memory, zeros where a key has no slot; the steps
 *     below convert each value as they read it;
 *  2. each warp splits whole K rows into fp16 hi + lo, one power-of-two
 *     scale per key (the row's peak), and finds the tile's V peak;
 *  3. V is split with one scale per tile that never increases within a
 *     run, so the running O is only ever rescaled by a power of two <= 1;
 *  4. the next tile's copies are issued;
 *  5. S = Q K^T stays in registers (ldmatrix fragments from shared
 *     memory), the online softmax runs on them in float32 (a row's four
 *     threads exchange by shuffles), P becomes the A fragments of P V
 *     directly, and O accumulates in registers.
 *
 * Accuracy, as cuda_attention_tc.cu's kernel: every operand x is scaled by
 * a power of two (peak in [2^14, 2^15)) and split x = hi + lo, both fp16 (22
 * significant bits); each product is hi*hi + lo*hi + hi*lo, fp16 products
 * are exact in float32; each k-step's (Q K^T) or tile's (P V) three mma go
 * into a fresh accumulator added in float32. Q gets one scale per row, K one
 * per key (both finer than the older kernel's per block and per tile).
 *
 * Shared memory: Q hi/lo [2][64][D+8] halves, K and V hi/lo [2][32][D+8]
 * each, the raw float32 tile [2][32][D]: 197 KB at head_dim 256, one block
 * per SM. The row stride D + 8 halves puts the 8 rows of every ldmatrix in
 * distinct banks. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_attention_tc.cuh"

#define FA_LOG2E 1.4426950408889634f

/* Values 4 c4 .. 4 c4 + 3 of a row of the KV cache's type (`type`: F32
 * also for the query rows), FP8 codes times the row's scale. */
__device__ __forceinline__ float4 fa_load4(const void *src, int type, int c4, float scale) {
    if (type == G4_KV_BF16) {
        const uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const unsigned char *>(src) + 8 * c4);
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                           __uint_as_float(u.y & 0xffff0000u));
    }
    if (type == G4_KV_FP8) {
        const uint32_t u = *reinterpret_cast<const uint32_t *>(static_cast<const unsigned char *>(src) + 4 * c4);
        const float2 a = kv_e4m3x2(u), b = kv_e4m3x2(u >> 16);
        return make_float4(a.x * scale, a.y * scale, b.x * scale, b.y * scale);
    }
    return *reinterpret_cast<const float4 *>(static_cast<const float *>(src) + 4 * c4);
}

/* A warp's row of D values (of `type`, see fa_load4; from global or shared
 * memory; zeros when !live) scaled by 2^e, its peak into [2^14, 2^15),
 * stored as fp16 hi and lo halves. Returns 2^-e. */
template <int DMAX>
__device__ __forceinline__ float fa_split_row(const void *src, int type, float scale, bool live, int D4, __half *hi,
                                              __half *lo, int lane) {
    float4 v[DMAX / 128];
    float peak = 0.0f;
#pragma unroll
    for (int i = 0; i < DMAX / 128; i++) {
        const int c4 = lane + 32 * i;
        v[i] = live && c4 < D4 ? fa_load4(src, type, c4, scale) : make_float4(0, 0, 0, 0);
        peak = fmaxf(peak, tca_absmax4(v[i]));
    }
    const int e = tca_exponent(warp_max(peak), 0, 126);
    const float up = tca_pow2(e);
#pragma unroll
    for (int i = 0; i < DMAX / 128; i++) {
        const int c4 = lane + 32 * i;
        if (c4 < D4) {
            uint32_t h0, l0, h1, l1;
            tca_split(v[i].x * up, v[i].y * up, h0, l0);
            tca_split(v[i].z * up, v[i].w * up, h1, l1);
            *reinterpret_cast<uint2 *>(hi + 4 * c4) = make_uint2(h0, h1);
            *reinterpret_cast<uint2 *>(lo + 4 * c4) = make_uint2(l0, l1);
        }
    }
    return tca_pow2(-e);
}

/* The warp's peak of |x| over its share of a row of D values in shared memory */
template <int DMAX>
__device__ __forceinline__ float fa_row_peak(const void *src, int type, float scale, int D4, int lane) {
    float peak = 0.0f;
#pragma unroll
    for (int i = 0; i < DMAX / 128; i++) {
        const int c4 = lane + 32 * i;
        if (c4 < D4) peak = fmaxf(peak, tca_absmax4(fa_load4(src, type, c4, scale)));
    }
    return peak;
}

/* Copies of the keys in `slots` (K and, unless K = V, V rows of KV head
 * kvh, as stored: RB = D * value bytes each) into raw [2][BN][RB]; zeros
 * for slot -1; FP8: their scales into scales [2][BN] (plain loads, seen
 * after the barrier that follows the copies' wait). One group. */
template <int BN, int THREADS>
__device__ __forceinline__ void fa_copy_tile(const attn_tc_params &p, int D, int kvh, const int64_t *slots,
                                             unsigned char *raw, float *scales, int tid) {
    const int RB = D * kv_value_bytes(p.kv_type), C16 = RB >> 4; /* 16-byte pieces of a row */
    const int parts = p.vp == p.kp ? 1 : 2;
    if (p.kv_type == G4_KV_FP8 && tid < BN) {
        const int64_t slot = slots[tid];
        scales[tid] = slot >= 0 ? p.ks[slot * p.n_kv + kvh] : 0.0f;
        scales[BN + tid] = slot >= 0 ? (parts == 1 ? p.ks : p.vs)[slot * p.n_kv + kvh] : 0.0f;
    }
    for (int part = 0; part < parts; part++) {
        const unsigned char *pool = static_cast<const unsigned char *>(part ? p.vp : p.kp);
        /* (key j, piece c) of tid, tid + THREADS, ... stepped without a division */
        const int dj = THREADS / C16, dc = THREADS - dj * C16;
        for (int j = tid / C16, c4 = tid - tid / C16 * C16; j < BN;) {
            const int64_t slot = slots[j];
            const unsigned char *src = pool + (slot >= 0 ? (size_t)(slot * p.n_kv + kvh) * RB + 16 * c4 : 0);
            cp_async16_or_zero(raw + ((size_t)part * BN + j) * RB + 16 * c4, src, slot >= 0);
            j += dj;
            c4 += dc;
            if (c4 >= C16) c4 -= C16, j++;
        }
    }
    cp_async_commit();
}

/* d += a b (fp16, float32 accumulators) without `volatile`: the compiler
 * may interleave independent products, which hides the tensor core's
 * latency with few warps per SM */
__device__ __forceinline__ void fa_mma(float *d, const uint32_t *a, const uint32_t *b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* d = a b: the first product of a fresh accumulator, with a zero C (no
 * zeroing of d beforehand) */
__device__ __forceinline__ void fa_mma_first(float *d, const uint32_t *a, const uint32_t *b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
}

/* DMAX: head_dim bound (loops run to the actual D; EXACT: D is DMAX, known
 * at compile time); BN: keys per tile; RG: groups of 16 rows per block; KW:
 * warps sharing 16 rows by splitting each tile's keys (each its own
 * softmax and O, merged at the end of a run). */
template <int DMAX, bool EXACT, int BN, int RG, int KW>
__global__ void __launch_bounds__(32 * RG * KW, 1) attention_flash_kernel(attn_tc_params p) {
    constexpr int WARPS = RG * KW, THREADS = 32 * WARPS;
    constexpr int BM = 16 * RG;         /* query rows per block */
    constexpr int WK = BN / KW;         /* keys of a tile per warp */
    constexpr int NQ = WK / 8;          /* key n-tiles of S per warp */
    constexpr int KC = WK / 16;         /* key chunks of P V per warp */
    constexpr int NP = DMAX / 16;       /* 16-channel pairs of O (at most) */
    static_assert(WK % 16 == 0 && KW <= 2, "tile shape");
    pdl_wait();
    extern __shared__ __align__(16) unsigned char fa_smem[];
    const int D = EXACT ? DMAX : p.D, ld = D + 8, D4 = D >> 2;
    __half *Qs = reinterpret_cast<__half *>(fa_smem); /* [2][BM][ld]: hi, lo */
    __half *Ks = Qs + 2 * BM * ld;                    /* [2][BN][ld] */
    __half *Vs = Ks + 2 * BN * ld;                    /* [2][BN][ld] */
    float *raw = reinterpret_cast<float *>(Vs + 2 * BN * ld); /* [2][BN][D]: K, V; at a run's end the KW merge */
    unsigned char *raw_b = reinterpret_cast<unsigned char *>(raw); /* the tile as stored: [2][BN][RB] */
    const int type = p.kv_type, RB = D * kv_value_bytes(type);
    float *key_f = raw + 2 * BN * D;                  /* [BN]: 2^-e of each key's K scale */
    float *row_f = key_f + BN;                        /* [BM]: scale * 2^-e of each row's Q scale */
    float *row_ml = row_f + BM;                       /* [BM][2]: the KW merge's m and l */
    float *red = row_ml + 2 * BM;                     /* [WARPS] */
    int64_t *slots = reinterpret_cast<int64_t *>(red + WARPS); /* [BN] */
    float *kv_scales = reinterpret_cast<float *>(slots + BN);  /* [2][BN]: FP8 scales of K, V */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int kw = warp % KW, rg = warp / KW;
    const int wk0 = kw * WK; /* this warp's first key of a tile */
    int split, kvh, tile; /* (the latest tokens' tiles first) */
    tca_block(p, &split, &kvh, &tile);
    const int first_row = tile * BM;
    const int last_row = min(first_row + BM, p.n_tokens * p.G) - 1;
    if (last_row < first_row) return; /* the whole block */
    const unsigned char *vraw = p.vp == p.kp ? raw_b : raw_b + (size_t)BN * RB;
    const float *v_scales = kv_scales + BN; /* (K's when K = V: fa_copy_tile put them there too) */

    /* the block's query rows as hi + lo, one scale per row */
    for (int r = warp; r < BM; r += WARPS) {
        const bool live = first_row + r <= last_row;
        const float f = fa_split_row<DMAX>(live ? tca_q_row(p, kvh, first_row + r) : p.q, G4_KV_F32, 1.0f, live, D4,
                                           Qs + r * ld, Qs + (BM + r) * ld, lane);
        if (lane == 0) row_f[r] = p.scale * f;
    }
    __syncthreads();

    /* this thread's two rows (the accumulator rows g and g + 8 of its warp) */
    int row_t[2], row_lo[2], row_hi[2];
    float row_scale[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = rg * 16 + g + 8 * h;
        row_scale[h] = row_f[r];
        row_t[h] = -1, row_lo[h] = 1, row_hi[h] = 0;
        if (first_row + r <= last_row) {
            row_t[h] = (first_row + r) / p.G;
            row_lo[h] = p.kv_range[4 * row_t[h] + p.range_off];
            row_hi[h] = p.kv_range[4 * row_t[h] + p.range_off + 1];
        }
    }

    const int t_first = first_row / p.G, t_last = last_row / p.G;
    for (int run_start = t_first; run_start <= t_last;) {
        /* a run: consecutive tokens of one sequence */
        const int s = p.seq[run_start];
        int lo_u, hi_u;
        const int run_end = attn_run(p.seq, p.kv_range, p.range_off, run_start, t_last, &lo_u, &hi_u);
        tca_piece(p, split, &lo_u, &hi_u);
        bool active[2];
        float m[2], l[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            active[h] = row_t[h] >= run_start && row_t[h] < run_end;
            m[h] = -INFINITY;
            l[h] = 0.0f;
        }
        int ev = TCA_V_EXP_START; /* V's scale exponent (block-uniform, never increases) */
        float acc[NP][2][4];
#pragma unroll
        for (int i = 0; i < NP; i++)
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int k = 0; k < 4; k++) acc[i][n][k] = 0.0f;
        const bool any_keys = lo_u <= hi_u;
        __syncthreads(); /* (an earlier run's slots and merge buffers are read) */
        if (any_keys) { /* the first tile's copies */
            if (tid < BN) slots[tid] = lo_u + tid <= hi_u ? kv_slot(p.tb, s, lo_u + tid) : -1;
            __syncthreads();
            fa_copy_tile<BN, THREADS>(p, D, kvh, slots, raw_b, kv_scales, tid);
        }
        for (int tile_lo = lo_u; any_keys && tile_lo <= hi_u; tile_lo += BN) {
            cp_async_wait_newest<0>();
            __syncthreads(); /* the raw tile is in; every warp is done with the last tile's K and V */
            /* 2. K rows as hi + lo (a warp per key), the warps' V peaks */
            float vpeak = 0.0f;
            for (int j = warp; j < BN; j += WARPS) {
                const float f = fa_split_row<DMAX>(raw_b + (size_t)j * RB, type, kv_scales[j], true, D4, Ks + j * ld,
                                                   Ks + (BN + j) * ld, lane);
                if (lane == 0) key_f[j] = f;
                vpeak = fmaxf(vpeak, fa_row_peak<DMAX>(vraw + (size_t)j * RB, type, v_scales[j], D4, lane));
            }
            vpeak = warp_max(vpeak);
            if (lane == 0) red[warp] = vpeak;
            /* the next tile's slots (this tile's copies were issued before the barrier above) */
            if (tid < BN) {
                const int pos = tile_lo + BN + tid;
                slots[tid] = pos <= hi_u ? kv_slot(p.tb, s, pos) : -1;
            }
            __syncthreads();
            /* 3. V with the tile's scale */
            vpeak = red[0];
#pragma unroll
            for (int w = 1; w < WARPS; w++) vpeak = fmaxf(vpeak, red[w]);
            const int ev_new = min(ev, tca_exponent(vpeak, TCA_V_EXP_START, TCA_V_EXP_START));
            const float v_change = ev_new - ev < -126 ? 0.0f : tca_pow2(ev_new - ev);
            ev = ev_new;
            {
                const float v_up = tca_pow2(ev);
                for (int j = warp; j < BN; j += WARPS) {
#pragma unroll
                    for (int i = 0; i < DMAX / 128; i++) {
                        const int c4 = lane + 32 * i;
                        if (c4 < D4) {
                            const float4 v = fa_load4(vraw + (size_t)j * RB, type, c4, v_scales[j]);
                            uint32_t h0, l0, h1, l1;
                            tca_split(v.x * v_up, v.y * v_up, h0, l0);
                            tca_split(v.z * v_up, v.w * v_up, h1, l1);
                            *reinterpret_cast<uint2 *>(Vs + j * ld + 4 * c4) = make_uint2(h0, h1);
                            *reinterpret_cast<uint2 *>(Vs + (BN + j) * ld + 4 * c4) = make_uint2(l0, l1);
                        }
                    }
                }
            }
            __syncthreads(); /* K and V ready, the raw tile free */
            /* 4. the next tile's copies run behind this tile's products */
            if (tile_lo + BN <= hi_u) fa_copy_tile<BN, THREADS>(p, D, kvh, slots, raw_b, kv_scales, tid);

            /* 5. S = Q K^T for the warp's 16 rows and its WK keys; each
             * k-step's three products into fresh accumulators, two k-steps
             * at a time (independent products back to back) */
            float sacc[NQ][4];
#pragma unroll
            for (int n = 0; n < NQ; n++)
#pragma unroll
                for (int k = 0; k < 4; k++) sacc[n][k] = 0.0f;
            {
                /* A: rows lane % 16, channels +8 for lanes 16..31; B: keys
                 * lane % 8 (+8 for lanes 16..31), channels +8 for lanes 8..15, 24..31 */
                const __half *qa = Qs + (rg * 16 + (lane & 15)) * ld + 8 * (lane >> 4);
                const __half *kb = Ks + (wk0 + (lane & 7) + 8 * (lane >> 4)) * ld + 8 * ((lane >> 3) & 1);
#pragma unroll 1 /* (unrolled, an exact width's loads spill) */
                for (int k0 = 0; k0 < D; k0 += 32) {
                    const int steps = k0 + 16 < D ? 2 : 1;
                    uint32_t a_hi[2][4], a_lo[2][4], b_hi[2][NQ / 2][4], b_lo[2][NQ / 2][4];
                    float t4[2][NQ][4];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        if (u < steps) {
                            ldmatrix_x4(a_hi[u], qa + k0 + 16 * u);
                            ldmatrix_x4(a_lo[u], qa + BM * ld + k0 + 16 * u);
#pragma unroll
                            for (int np = 0; np < NQ / 2; np++) {
                                ldmatrix_x4(b_hi[u][np], kb + np * 16 * ld + k0 + 16 * u);
                                ldmatrix_x4(b_lo[u][np], kb + (BN + np * 16) * ld + k0 + 16 * u);
                            }
                        }
                    }
                    /* products q_lo k_hi, q_hi k_lo, q_hi k_hi, each over all accumulators */
#pragma unroll
                    for (int prod = 0; prod < 3; prod++)
#pragma unroll
                        for (int u = 0; u < 2; u++)
#pragma unroll
                            for (int n = 0; n < NQ; n++)
                                if (u < steps) {
                                    const uint32_t *b = (prod == 1 ? b_lo[u][n / 2] : b_hi[u][n / 2]) + 2 * (n & 1);
                                    if (prod == 0)
                                        fa_mma_first(t4[u][n], a_lo[u], b);
                                    else
                                        fa_mma(t4[u][n], a_hi[u], b);
                                }
#pragma unroll
                    for (int u = 0; u < 2; u++)
                        if (u < steps)
#pragma unroll
                            for (int n = 0; n < NQ; n++)
#pragma unroll
                                for (int k = 0; k < 4; k++) sacc[n][k] += t4[u][n][k];
                }
            }
            /* the online softmax of rows g (sacc[.][0..1]) and g + 8 ([2..3]):
             * keys wk0 + 8 n + 2 tig (+1) */
            float alpha[2];
            {
                float mx[2] = {-INFINITY, -INFINITY};
                int j_lo[2], j_hi[2]; /* each row's keys in this tile, relative to tile_lo */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    j_lo[h] = active[h] ? row_lo[h] - tile_lo : 1;
                    j_hi[h] = active[h] ? min(row_hi[h], hi_u) - tile_lo : 0;
                }
#pragma unroll
                for (int n = 0; n < NQ; n++)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int h = k >> 1, j = wk0 + 8 * n + 2 * tig + (k & 1);
                        sacc[n][k] = j >= j_lo[h] && j <= j_hi[h] ? sacc[n][k] * row_scale[h] * key_f[j] : -INFINITY;
                        mx[h] = fmaxf(mx[h], sacc[n][k]);
                    }
                float sum[2] = {0.0f, 0.0f}, m_new[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                    m_new[h] = fmaxf(m[h], mx[h]);
                }
#pragma unroll
                for (int n = 0; n < NQ; n++)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int h = k >> 1;
                        /* (exp2f of the difference times log2 e: one multiply-add on the special
                         * function unit's exponential instead of expf's longer sequence) */
                        sacc[n][k] = m_new[h] == -INFINITY ? 0.0f : exp2f((sacc[n][k] - m_new[h]) * FA_LOG2E);
                        sum[h] += sacc[n][k];
                    }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
                    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
                    alpha[h] = 1.0f; /* rows outside this run keep their (zero) accumulators */
                    if (active[h]) {
                        alpha[h] = m[h] == -INFINITY ? 0.0f : exp2f((m[h] - m_new[h]) * FA_LOG2E);
                        l[h] = l[h] * alpha[h] + sum[h];
                        m[h] = m_new[h];
                    }
                }
            }
            /* P as the A fragments of P V (key chunk c: n-tiles 2c, 2c + 1), scaled by 2^14 */
            uint32_t p_hi[KC][4], p_lo[KC][4];
            {
                const float p_up = tca_pow2(TCA_P_EXP);
#pragma unroll
                for (int c = 0; c < KC; c++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int n = 2 * c + (q >> 1), k = 2 * (q & 1); /* q: row g / g+8, keys +0 / +8 */
                        tca_split(sacc[n][k] * p_up, sacc[n][k + 1] * p_up, p_hi[c][q], p_lo[c][q]);
                    }
            }
            /* O = O alpha 2^(ev change) + P V, two channel pairs at a time;
             * each pair's products over the warp's keys into fresh
             * accumulators. (Its channel guards, and the merge's and the
             * output's below, read p.D even at an exact width: as constants
             * they let the compiler hoist more loads than registers hold.) */
            {
                const float f0 = alpha[0] * v_change, f1 = alpha[1] * v_change;
                /* B (transposed): keys lane % 16, channels +8 for lanes 16..31 */
                const __half *vb = Vs + (wk0 + (lane & 15)) * ld + 8 * (lane >> 4);
#pragma unroll
                for (int i0 = 0; i0 < NP; i0 += 2) {
                    float t4[2][2][4];
#pragma unroll
                    for (int c = 0; c < KC; c++) {
                        uint32_t b_hi[2][4], b_lo[2][4];
#pragma unroll
                        for (int u = 0; u < 2; u++) {
                            const int cp = i0 + u;
                            if (cp < NP && cp * 16 < p.D) {
                                ldmatrix_x4_trans(b_hi[u], vb + c * 16 * ld + cp * 16);
                                ldmatrix_x4_trans(b_lo[u], vb + (BN + c * 16) * ld + cp * 16);
                            }
                        }
                        /* products p_lo v_hi, p_hi v_lo, p_hi v_hi, each over all four accumulators */
#pragma unroll
                        for (int prod = 0; prod < 3; prod++)
#pragma unroll
                            for (int u = 0; u < 2; u++)
#pragma unroll
                                for (int h = 0; h < 2; h++)
                                    if (i0 + u < NP && (i0 + u) * 16 < p.D) {
                                        const uint32_t *b = (prod == 1 ? b_lo[u] : b_hi[u]) + 2 * h;
                                        if (c == 0 && prod == 0)
                                            fa_mma_first(t4[u][h], p_lo[c], b);
                                        else
                                            fa_mma(t4[u][h], prod == 0 ? p_lo[c] : p_hi[c], b);
                                    }
                    }
#pragma unroll
                    for (int u = 0; u < 2; u++)
                        if (i0 + u < NP && (i0 + u) * 16 < p.D)
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                acc[i0 + u][h][0] = fmaf(acc[i0 + u][h][0], f0, t4[u][h][0]);
                                acc[i0 + u][h][1] = fmaf(acc[i0 + u][h][1], f0, t4[u][h][1]);
                                acc[i0 + u][h][2] = fmaf(acc[i0 + u][h][2], f1, t4[u][h][2]);
                                acc[i0 + u][h][3] = fmaf(acc[i0 + u][h][3], f1, t4[u][h][3]);
                            }
                }
            }
        }
        /* KW = 2: the key halves' (m, l, O) merged into the kw = 0 warp,
         * through the raw buffer (free after the last tile) */
        if (KW > 1) {
            __syncthreads(); /* every warp past the last tile */
            float *o_share = raw + (size_t)rg * 16 * D;
            if (kw == 1) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = g + 8 * h;
                    if (tig == 0) {
                        row_ml[2 * (rg * 16 + r)] = m[h];
                        row_ml[2 * (rg * 16 + r) + 1] = l[h];
                    }
#pragma unroll
                    for (int i = 0; i < NP; i++)
                        if (i * 16 < p.D)
#pragma unroll
                            for (int n = 0; n < 2; n++)
                                *reinterpret_cast<float2 *>(o_share + r * D + i * 16 + n * 8 + 2 * tig) =
                                    make_float2(acc[i][n][2 * h], acc[i][n][2 * h + 1]);
                }
            }
            __syncthreads();
            if (kw == 0) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = g + 8 * h;
                    const float m1 = row_ml[2 * (rg * 16 + r)], l1 = row_ml[2 * (rg * 16 + r) + 1];
                    const float mm = fmaxf(m[h], m1);
                    const float a0 = mm == -INFINITY ? 0.0f : expf(m[h] - mm);
                    const float a1 = mm == -INFINITY ? 0.0f : expf(m1 - mm);
                    l[h] = l[h] * a0 + l1 * a1;
                    m[h] = mm;
#pragma unroll
                    for (int i = 0; i < NP; i++)
                        if (i * 16 < p.D)
#pragma unroll
                            for (int n = 0; n < 2; n++) {
                                const float2 o1 =
                                    *reinterpret_cast<const float2 *>(o_share + r * D + i * 16 + n * 8 + 2 * tig);
                                acc[i][n][2 * h] = acc[i][n][2 * h] * a0 + o1.x * a1;
                                acc[i][n][2 * h + 1] = acc[i][n][2 * h + 1] * a0 + o1.y * a1;
                            }
                }
            }
        }
        /* results of this run's rows: O 2^-(ev + 14) / l, or as a piece's
         * partial (O 2^-(ev + 14), m, l) */
        const float out_f = tca_pow2(-(ev + TCA_P_EXP));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (!active[h] || kw != 0) continue;
            const int gr = first_row + rg * 16 + g + 8 * h, t = row_t[h];
            const size_t th = (size_t)t * p.n_heads + kvh * p.G + gr % p.G;
            const float lr = any_keys ? l[h] : 0.0f;
            if (p.splits > 1) {
                if (tig == 0) {
                    p.part_ml[2 * (th * p.splits + split)] = any_keys ? m[h] : -INFINITY;
                    p.part_ml[2 * (th * p.splits + split) + 1] = lr;
                }
                if (!(lr > 0.0f)) continue; /* a piece without keys: the merge skips it */
            }
            float *o = p.splits > 1 ? p.part_acc + (th * p.splits + split) * D : p.out + th * D;
            const float f = p.splits > 1 ? out_f : lr > 0.0f ? out_f / lr : 0.0f;
#pragma unroll
            for (int i = 0; i < NP; i++) {
                if (i * 16 < p.D) {
#pragma unroll
                    for (int n = 0; n < 2; n++)
                        *reinterpret_cast<float2 *>(o + i * 16 + n * 8 + 2 * tig) =
                            make_float2(acc[i][n][2 * h] * f, acc[i][n][2 * h + 1] * f);
                }
            }
        }
        run_start = run_end;
    }
}

/* The tiling (head_dim 64..256): 64 rows, 32 keys a tile, 8 warps, two per
 * 16 rows, each with 16 of every tile's keys. Head_dim 512 stays on the
 * older kernel: this one's O for 16 rows would take 256 registers a thread,
 * and splitting its channels over warps was slower. */
#define FA_ROWS 64
#define FA_KEYS 32
#define FA_KW 2

static size_t fa_smem_bytes(int D) {
    const size_t ld = (size_t)D + 8, warps = FA_ROWS / 16 * FA_KW;
    return (2 * (size_t)FA_ROWS * ld + 4 * (size_t)FA_KEYS * ld) * 2 + 2 * (size_t)FA_KEYS * D * 4 +
           (size_t)FA_KEYS * 4 + (size_t)FA_ROWS * 12 + warps * 4 + (size_t)FA_KEYS * 8 + 2 * (size_t)FA_KEYS * 4;
}

int cuda_attention_flash_rows(const cuda_ctx *c, int D) {
    if (D < 64 || D > 256 || D % 16) return 0;
    return fa_smem_bytes(D) <= c->caps.smem_optin ? FA_ROWS : 0;
}

template <int DMAX, bool EXACT> static void launch_flash(cuda_ctx *c, const attn_tc_params &p, size_t smem) {
    static unsigned configured; /* per device */
    tca_launch(c, attention_flash_kernel<DMAX, EXACT, FA_KEYS, FA_ROWS / 16, FA_KW>, &configured, p,
               32 * FA_ROWS / 16 * FA_KW, smem, "attention_flash");
}

/* head_dim 128 and 256 (the models' sliding layers) by kernels compiled for
 * exactly that width, other widths by the bound above them */
void cuda_attention_flash(cuda_ctx *c, const attn_tc_params &p) {
    const size_t smem = fa_smem_bytes(p.D);
    if (p.D == 256)
        launch_flash<256, true>(c, p, smem);
    else if (p.D == 128)
        launch_flash<128, true>(c, p, smem);
    else if (p.D < 128)
        launch_flash<128, false>(c, p, smem);
    else
        launch_flash<256, false>(c, p, smem);
}
