/* The paged KV cache and attention over it.
 *
 * The pool holds K and V, [slot][kv head][head_dim] (the CPU layout), as
 * float32, bf16 or fp8 e4m3 with a scale per row (cuda_kv.cuh): the loads
 * below (kv_load4) convert each value as it is staged, no conversion pass. One kernel serves decode and prefill: a block takes a tile of query
 * rows (the heads of one KV head for one or more consecutive tokens) and a
 * share of their key range; K and V for 16 or 32 positions at a time are
 * staged in shared memory and used by every row of the tile (GQA), with an
 * online softmax in float32. Consecutive tokens of one sequence (a prefill
 * chunk) share one pass over the union of their ranges, each row masked to
 * its own range. When there are too few tiles to fill the GPU (decode), the
 * key range is split over several blocks and a second kernel merges their
 * partial softmaxes (flash decoding). Prefill-like batches run on tensor
 * cores where that kernel takes the shape (cuda_attention_tc.cu). */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv.cuh"

void *cuda_kv_alloc(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim, g4_kv_type type) {
    cuda_ctx *c = cuda_of(be);
    if (type != G4_KV_F32 && type != G4_KV_BF16 && type != G4_KV_FP8) return NULL;
    cuda_kv *kv = (cuda_kv *)calloc(1, sizeof *kv);
    if (!kv) return NULL;
    const size_t rows = (size_t)n_blocks * block_size * n_kv_heads, n = rows * head_dim;
    const size_t bytes = (n ? n : 1) * kv_value_bytes(type), scale_bytes = (rows ? rows : 1) * sizeof(float);
    bool ok = cudaMalloc(&kv->k, bytes) == cudaSuccess && cudaMalloc(&kv->v, bytes) == cudaSuccess;
    if (ok && type == G4_KV_FP8)
        ok = cudaMalloc(&kv->ks, scale_bytes) == cudaSuccess && cudaMalloc(&kv->vs, scale_bytes) == cudaSuccess;
    if (!ok) {
        cudaGetLastError();
        if (kv->k) cudaFree(kv->k);
        if (kv->v) cudaFree(kv->v);
        if (kv->ks) cudaFree(kv->ks);
        if (kv->vs) cudaFree(kv->vs);
        free(kv);
        return NULL;
    }
    /* zeros, as the CPU pool: never-written slots must not hold NaN bits */
    cuda_check(c, cudaMemsetAsync(kv->k, 0, bytes, c->stream), "memset");
    cuda_check(c, cudaMemsetAsync(kv->v, 0, bytes, c->stream), "memset");
    if (kv->ks) cuda_check(c, cudaMemsetAsync(kv->ks, 0, scale_bytes, c->stream), "memset");
    if (kv->vs) cuda_check(c, cudaMemsetAsync(kv->vs, 0, scale_bytes, c->stream), "memset");
    kv->type = type;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    return kv;
}

void cuda_kv_free(g4_backend *be, void *p) {
    cuda_ctx *c = cuda_of(be);
    cuda_kv *kv = (cuda_kv *)p;
    if (!kv) return;
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    cudaFree(kv->k);
    cudaFree(kv->v);
    if (kv->ks) cudaFree(kv->ks);
    if (kv->vs) cudaFree(kv->vs);
    free(kv);
}

/* One block per (token, kv head): its K and V rows in the pool's type. */
__global__ void kv_store_kernel(cuda_kv kv, const float *k, const float *v, const int32_t *seq, const int32_t *pos,
                                kv_tables tb) {
    pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y, D = kv.head_dim;
    const int64_t row = kv_slot(tb, seq[t], pos[t]) * kv.n_kv_heads + h;
    const size_t src = ((size_t)t * kv.n_kv_heads + h) * D;
    kv_put_row(kv.k, kv.ks, kv.type, row, D, k + src);
    kv_put_row(kv.v, kv.vs, kv.type, row, D, v + src);
}

void cuda_kv_store(g4_backend *be, void *p, const float *k, const float *v, const g4_attn_batch *b, int sliding) {
    cuda_ctx *c = cuda_of(be);
    cuda_kv *kv = (cuda_kv *)p;
    if (b->n_tokens <= 0) return;
    dim3 grid((unsigned)b->n_tokens, (unsigned)kv->n_kv_heads);
    cuda_launch(c, kv_store_kernel, grid, kv->head_dim >= 512 ? 256 : 128, 0, *kv, k, v, b->seq, b->pos,
                cuda_kv_tables(b, sliding));
    cuda_launched(c, "kv_store");
}

/* kv_store backwards: the stored values as floats */
__global__ void kv_read_kernel(float *k, float *v, cuda_kv kv, const int32_t *seq, const int32_t *pos, kv_tables tb) {
    const int t = blockIdx.x, D = kv.head_dim;
    const int64_t slot = kv_slot(tb, seq[t], pos[t]);
    const int row = kv.n_kv_heads * D;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const int64_t r = slot * kv.n_kv_heads + i / D;
        k[(size_t)t * row + i] = kv_load1(kv.k, kv.ks, kv.type, r, D, i % D);
        v[(size_t)t * row + i] = kv_load1(kv.v, kv.vs, kv.type, r, D, i % D);
    }
}

void cuda_kv_read(g4_backend *be, const void *p, float *k, float *v, const g4_attn_batch *b, int sliding) {
    cuda_ctx *c = cuda_of(be);
    const cuda_kv *kv = (const cuda_kv *)p;
    if (b->n_tokens <= 0) return;
    kv_read_kernel<<<b->n_tokens, 256, 0, c->stream>>>(k, v, *kv, b->seq, b->pos, cuda_kv_tables(b, sliding));
    cuda_launched(c, "kv_read");
}

/* Runs of blocks consecutive on both sides are one device-to-device copy
 * each (a snapshot's blocks and a ring's mostly are). */
void cuda_kv_copy_blocks(g4_backend *be, void *p, const int32_t *src, const int32_t *dst, int n) {
    cuda_ctx *c = cuda_of(be);
    cuda_kv *kv = (cuda_kv *)p;
    const size_t rows = (size_t)kv->block_size * kv->n_kv_heads; /* rows of one block */
    const size_t block = rows * kv->head_dim * kv_value_bytes(kv->type);
    const size_t scales = kv->type == G4_KV_FP8 ? rows * sizeof(float) : 0; /* the rows' fp8 scales */
    for (int i = 0; i < n;) {
        int run = 1;
        while (i + run < n && src[i + run] == src[i] + run && dst[i + run] == dst[i] + run) run++;
        char *halves[4] = {(char *)kv->k, (char *)kv->v, (char *)kv->ks, (char *)kv->vs};
        const size_t unit[4] = {block, block, scales, scales};
        for (int h = 0; h < 4; h++)
            if (unit[h])
                cuda_check(c, cudaMemcpyAsync(halves[h] + dst[i] * unit[h], halves[h] + src[i] * unit[h], run * unit[h],
                                              cudaMemcpyDeviceToDevice, c->stream),
                           "kv_copy_blocks");
        i += run;
    }
}

/* One block's four parts (K, V, K scales, V scales) in device memory and their sizes. */
static void kv_block_parts(const cuda_kv *kv, int32_t block, char *part[4], size_t size[4]) {
    const size_t rows = (size_t)kv->block_size * kv->n_kv_heads;
    const size_t values = rows * kv->head_dim * kv_value_bytes(kv->type);
    const size_t scales = kv->type == G4_KV_FP8 ? rows * sizeof(float) : 0;
    part[0] = (char *)kv->k + block * values;
    part[1] = (char *)kv->v + block * values;
    part[2] = scales ? (char *)(kv->ks + block * rows) : NULL;
    part[3] = scales ? (char *)(kv->vs + block * rows) : NULL;
    size[0] = size[1] = values;
    size[2] = size[3] = scales;
}

/* Copies on the stream, then waits: host memory is pageable, and the
 * caller reads (save) or frees (load) it as soon as this returns. */
static void kv_blocks_host_copy(g4_backend *be, const cuda_kv *kv, const int32_t *blocks, int n, char *host,
                                int to_host) {
    cuda_ctx *c = cuda_of(be);
    for (int i = 0; i < n; i++) {
        char *part[4];
        size_t size[4];
        kv_block_parts(kv, blocks[i], part, size);
        for (int h = 0; h < 4; h++) {
            if (size[h])
                cuda_check(c, cudaMemcpyAsync(to_host ? host : part[h], to_host ? part[h] : host, size[h],
                                              to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, c->stream),
                           to_host ? "kv_save_blocks" : "kv_load_blocks");
            host += size[h];
        }
    }
    cuda_check(c, cudaStreamSynchronize(c->stream), "kv blocks to or from host");
}

void cuda_kv_save_blocks(g4_backend *be, const void *kv, const int32_t *blocks, int n, void *host) {
    kv_blocks_host_copy(be, (const cuda_kv *)kv, blocks, n, (char *)host, 1);
}

void cuda_kv_load_blocks(g4_backend *be, void *kv, const int32_t *blocks, int n, const void *host) {
    kv_blocks_host_copy(be, (const cuda_kv *)kv, blocks, n, (char *)host, 0);
}

struct attn_params : attn_common {
    int rows_per_tile, splits;
    int split_len; /* positions per split, counted from the run's first key */
    /* pieces > 0: split_len is instead the run's own span over `pieces`
     * (rounded up to a key tile), at least min_len */
    int pieces, min_len;
    float *part_acc, *part_ml;
};

/* Merges the split partial softmaxes of one (token, head) (at most
 * ATTN_MAX_SPLITS splits), one block per (token, head).
 * (Merging inside the attention kernel's last split was slower: one block
 * then does all the tile's rows.) */
__global__ void attention_merge_kernel(float *out, const float *part_acc, const float *part_ml, int splits, int D) {
    pdl_wait();
    pdl_launch_next();
    __shared__ float e[ATTN_MAX_SPLITS]; /* factor of the k-th live split */
    __shared__ int live_split[ATTN_MAX_SPLITS];
    __shared__ int n_live;
    __shared__ float sum_l;
    const size_t th = blockIdx.x;
    /* The first warp reads every split's (max, sum) at once, up to eight per
     * lane (a loop over splits would wait for each load in turn), and lists
     * the splits that saw keys, in order (a decode's capacity has many empty
     * ones: E2B's 600 keys fill 19 of 64). */
    if (threadIdx.x < 32) {
        constexpr int PER_LANE = ATTN_MAX_SPLITS / 32;
        const float *ml = part_ml + th * splits * 2;
        const int lane = threadIdx.x;
        float m[PER_LANE], l[PER_LANE], w[PER_LANE];
        unsigned live[PER_LANE];
#pragma unroll
        for (int k = 0; k < PER_LANE; k++) {
            const int sp = lane + 32 * k;
            m[k] = -INFINITY;
            l[k] = 0.0f;
            if (sp < splits) {
                m[k] = ml[2 * sp];
                l[k] = ml[2 * sp + 1];
            }
            if (!(l[k] > 0.0f)) m[k] = -INFINITY;
        }
        float mx = m[0];
#pragma unroll
        for (int k = 1; k < PER_LANE; k++) mx = fmaxf(mx, m[k]);
        const float M = warp_max(mx);
        float lw = 0.0f;
#pragma unroll
        for (int k = 0; k < PER_LANE; k++) {
            w[k] = l[k] > 0.0f ? expf(m[k] - M) : 0.0f;
            live[k] = __ballot_sync(0xffffffffu, l[k] > 0.0f);
            lw += l[k] * w[k];
        }
        const float L = warp_sum(lw);
        const unsigned below = (1u << lane) - 1u;
        int before = 0; /* live splits in the groups of 32 before group k */
#pragma unroll
        for (int k = 0; k < PER_LANE; k++) {
            if (l[k] > 0.0f) {
                const int at = before + __popc(live[k] & below);
                live_split[at] = lane + 32 * k;
                e[at] = w[k];
            }
            before += __popc(live[k]);
        }
        if (lane == 0) {
            n_live = before;
            sum_l = L;
        }
    }
    __syncthreads();
    const int nl = n_live;
    const float L = sum_l;
    const float *acc = part_acc + th * splits * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.0f;
        if (L > 0.0f) {
#pragma unroll 8
            for (int k = 0; k < nl; k++) v += acc[(size_t)live_split[k] * D + d] * e[k];
            v /= L;
        }
        out[th * D + d] = v;
    }
}

#define ATTN_THREADS 256
#define ATTN_WARPS 8

/* Floats per staged K row: D + 4 when D is a multiple of 4 (16-byte rows
 * for float4 reads; lanes on consecutive positions then start 4 banks
 * apart, so each quarter-warp's 16-byte reads meet no conflict), else odd
 * (scalar reads, lanes on different positions in different banks). */
__host__ __device__ __forceinline__ int attn_k_stride(int D) { return (D & 3) == 0 ? D + 4 : (D | 1); }

/* The channel of accumulator k of a lane: with vec (D a multiple of 128)
 * each lane owns float4 runs 128 apart, else single channels 32 apart. */
__device__ __forceinline__ int attn_acc_channel(int k, int lane, bool vec) {
    return vec ? 128 * (k >> 2) + 4 * lane + (k & 3) : lane + 32 * k;
}

/* DMAX: head_dim bound (loops run to the actual D); RPT: query rows per warp;
 * T: positions per staged tile; with T = 16 each position's dot product is
 * split over two lanes (halves of every 32 channels: head_dim a multiple of
 * 32). */
template <int DMAX, int RPT, int T>
__global__ void __launch_bounds__(ATTN_THREADS, RPT == 1 ? 2 : 1) attention_kernel(attn_params p) {
    pdl_wait();
    constexpr int LPP = 32 / T; /* lanes per position */
    constexpr int DK = (DMAX + 31) / 32;
    constexpr int CV = (DMAX + 127) / 128; /* float4 runs of a row per lane */
    extern __shared__ float smem[];
    const int D = p.D, ks = attn_k_stride(D);
    const bool vec = (D & 127) == 0; /* float4 reads of V rows in P V */
    const int RT = ATTN_WARPS * RPT;
    float *Qs = smem;                  /* [RT][D] */
    float *Ks = Qs + (size_t)RT * D;   /* [T][ks] */
    float *Vs = Ks + (size_t)T * ks;   /* [T][D] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int first_row = tile * p.rows_per_tile;
    const int total_rows = p.n_tokens * p.G;

    /* this warp's rows */
    int row_t[RPT], row_h[RPT], row_lo[RPT], row_hi[RPT];
    const float *qrow[RPT];
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        const int lr = warp * RPT + i, gr = first_row + lr;
        row_t[i] = -1;
        row_h[i] = 0;
        row_lo[i] = 1;
        row_hi[i] = 0;
        qrow[i] = NULL;
        if (lr < p.rows_per_tile && gr < total_rows) {
            row_t[i] = gr / p.G;
            row_h[i] = kvh * p.G + gr % p.G;
            row_lo[i] = p.kv_range[4 * row_t[i] + p.range_off];
            row_hi[i] = p.kv_range[4 * row_t[i] + p.range_off + 1];
            qrow[i] = p.q + ((size_t)row_t[i] * p.n_heads + row_h[i]) * D;
        }
    }
    /* its query rows go into its own part of shared memory (no other warp
     * reads them), lanes along the channels: loaded here, stored once the
     * first run's key range has been read (both in flight at once) */
    float4 qv[RPT][CV];
    if ((D & 3) == 0) {
#pragma unroll
        for (int i = 0; i < RPT; i++)
#pragma unroll
            for (int c = 0; c < CV; c++) {
                const int d = 128 * c + 4 * lane;
                qv[i][c] = qrow[i] && d < D ? *reinterpret_cast<const float4 *>(qrow[i] + d) : make_float4(0, 0, 0, 0);
            }
    }
    const int last_row = min(first_row + p.rows_per_tile, total_rows) - 1;
    if (last_row < first_row) return;
    const int t_first = first_row / p.G, t_last = last_row / p.G;
    /* the first run: consecutive tokens of one sequence */
    int run_start = t_first, lo_u, hi_u;
    int run_end = attn_run(p.seq, p.kv_range, p.range_off, run_start, t_last, &lo_u, &hi_u);
    {
        float *qs = Qs + (size_t)warp * RPT * D;
        if ((D & 3) == 0) {
#pragma unroll
            for (int i = 0; i < RPT; i++)
#pragma unroll
                for (int c = 0; c < CV; c++) {
                    const int d = 128 * c + 4 * lane;
                    if (d < D) *reinterpret_cast<float4 *>(qs + (size_t)i * D + d) = qv[i][c];
                }
        } else {
#pragma unroll
            for (int i = 0; i < RPT; i++)
                for (int d = lane; d < D; d += 32) qs[(size_t)i * D + d] = qrow[i] ? qrow[i][d] : 0.0f;
        }
        __syncwarp();
    }

    const int part = lane / T, jl = lane % T;
    while (run_start <= t_last) {
        const int s = p.seq[run_start];
        int split_len = p.split_len;
        if (p.pieces > 0 && lo_u <= hi_u) {
            const int per = (hi_u - lo_u + p.pieces) / p.pieces; /* ceil(span / pieces) */
            split_len = max(p.min_len, (per + T - 1) / T * T);
        }
        int s_lo = 0, s_hi = -1;
        if (lo_u <= hi_u && (int64_t)split * split_len <= (int64_t)(hi_u - lo_u)) {
            s_lo = lo_u + split * split_len;
            s_hi = (int)min((int64_t)hi_u, (int64_t)s_lo + split_len - 1);
        }
        bool active[RPT];
        float m[RPT], l[RPT], acc[RPT][DK];
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            active[i] = row_t[i] >= run_start && row_t[i] < run_end;
            m[i] = -INFINITY;
            l[i] = 0.0f;
#pragma unroll
            for (int k = 0; k < DK; k++) acc[i][k] = 0.0f;
        }
        /* The tile's K and V rows: warp w stages rows w, w + 8, ..., each
         * looking up its own slot (one broadcast load), lanes along the
         * channels. With float4 rows the next tile's rows are loaded into
         * registers while this tile is computed (its stores wait for the
         * compute's closing barrier), so the loads of a long span overlap
         * the work instead of alternating with it. */
        constexpr int RPW = T / ATTN_WARPS;
        float4 k4[RPW][CV], v4[RPW][CV];
        auto fetch_tile = [&](int tlo) {
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const int pos = tlo + warp + r * ATTN_WARPS;
                const int64_t krow = pos <= s_hi ? kv_slot(p.tb, s, pos) * p.n_kv + kvh : -1;
#pragma unroll
                for (int c = 0; c < CV; c++) {
                    const int d = 128 * c + 4 * lane;
                    k4[r][c] = v4[r][c] = make_float4(0, 0, 0, 0);
                    if (krow >= 0 && d < D) {
                        k4[r][c] = kv_load4(p.kp, p.ks, p.kv_type, krow, D, d);
                        v4[r][c] = kv_load4(p.vp, p.vs, p.kv_type, krow, D, d);
                    }
                }
            }
        };
        if ((D & 3) == 0 && s_lo <= s_hi) fetch_tile(s_lo);
        for (int tile_lo = s_lo; tile_lo <= s_hi; tile_lo += T) {
            if ((D & 3) == 0) {
#pragma unroll
                for (int r = 0; r < RPW; r++)
#pragma unroll
                    for (int c = 0; c < CV; c++) {
                        const int j = warp + r * ATTN_WARPS, d = 128 * c + 4 * lane;
                        if (d >= D) continue;
                        *reinterpret_cast<float4 *>(Ks + (size_t)j * ks + d) = k4[r][c];
                        *reinterpret_cast<float4 *>(Vs + (size_t)j * D + d) = v4[r][c];
                    }
            } else {
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const int j = warp + r * ATTN_WARPS, pos = tile_lo + j;
                    const int64_t krow = pos <= s_hi ? kv_slot(p.tb, s, pos) * p.n_kv + kvh : -1;
                    for (int d = lane; d < D; d += 32) {
                        Ks[(size_t)j * ks + d] = krow >= 0 ? kv_load1(p.kp, p.ks, p.kv_type, krow, D, d) : 0.0f;
                        Vs[(size_t)j * D + d] = krow >= 0 ? kv_load1(p.vp, p.vs, p.kv_type, krow, D, d) : 0.0f;
                    }
                }
            }
            __syncthreads();
            if ((D & 3) == 0 && tile_lo + T <= s_hi) fetch_tile(tile_lo + T);
            bool any = false;
#pragma unroll
            for (int i = 0; i < RPT; i++) any |= active[i];
            if (any) { /* warp-uniform */
                float sc[RPT], pr[RPT];
#pragma unroll
                for (int i = 0; i < RPT; i++) sc[i] = 0.0f;
                const float *qw = Qs + (size_t)warp * RPT * D;
                const float *kr = Ks + (size_t)jl * ks;
                if ((D & 3) == 0) {
                    /* float4 reads, two partial sums per row (a chain of
                     * one FMA per channel made this loop the kernel's time) */
                    float sb[RPT];
#pragma unroll
                    for (int i = 0; i < RPT; i++) sb[i] = 0.0f;
                    const int d_first = LPP == 1 ? 0 : 16 * part, d_step = LPP == 1 ? 4 : 32;
#pragma unroll 4
                    for (int b0 = d_first; b0 < D; b0 += d_step)
#pragma unroll
                        for (int d = b0; d < b0 + (LPP == 1 ? 4 : 16); d += 4) {
                            const float4 k4 = *reinterpret_cast<const float4 *>(kr + d);
#pragma unroll
                            for (int i = 0; i < RPT; i++) {
                                const float4 q4 = *reinterpret_cast<const float4 *>(qw + (size_t)i * D + d);
                                sc[i] = fmaf(q4.x, k4.x, sc[i]);
                                sb[i] = fmaf(q4.y, k4.y, sb[i]);
                                sc[i] = fmaf(q4.z, k4.z, sc[i]);
                                sb[i] = fmaf(q4.w, k4.w, sb[i]);
                            }
                        }
#pragma unroll
                    for (int i = 0; i < RPT; i++) sc[i] += sb[i];
                    if constexpr (LPP == 2) {
#pragma unroll
                        for (int i = 0; i < RPT; i++) sc[i] += __shfl_xor_sync(0xffffffffu, sc[i], 16);
                    }
                } else if constexpr (LPP == 1) {
                    for (int d = 0; d < D; d++) {
                        const float kd = kr[d];
#pragma unroll
                        for (int i = 0; i < RPT; i++) sc[i] = fmaf(qw[(size_t)i * D + d], kd, sc[i]);
                    }
                } else {
                    for (int b0 = 16 * part; b0 < D; b0 += 32)
#pragma unroll 4
                        for (int d = b0; d < b0 + 16; d++) {
                            const float kd = kr[d];
#pragma unroll
                            for (int i = 0; i < RPT; i++) sc[i] = fmaf(qw[(size_t)i * D + d], kd, sc[i]);
                        }
#pragma unroll
                    for (int i = 0; i < RPT; i++) sc[i] += __shfl_xor_sync(0xffffffffu, sc[i], 16);
                }
                const int pos = tile_lo + jl;
#pragma unroll
                for (int i = 0; i < RPT; i++) {
                    pr[i] = 0.0f;
                    if (!active[i]) continue; /* warp-uniform */
                    const bool valid = pos <= s_hi && pos >= row_lo[i] && pos <= row_hi[i];
                    const float sv = valid ? sc[i] * p.scale : -INFINITY;
                    const float m_new = fmaxf(m[i], warp_max(sv));
                    const float pv = m_new == -INFINITY ? 0.0f : expf(sv - m_new);
                    const float alpha = m[i] == -INFINITY ? 0.0f : expf(m[i] - m_new);
                    l[i] = l[i] * alpha + warp_sum(lane < T ? pv : 0.0f);
                    m[i] = m_new;
#pragma unroll
                    for (int k = 0; k < DK; k++) acc[i][k] *= alpha;
                    pr[i] = pv;
                }
                for (int j = 0; j < T; j++) {
                    float pj[RPT];
#pragma unroll
                    for (int i = 0; i < RPT; i++) pj[i] = __shfl_sync(0xffffffffu, pr[i], j);
                    const float *vr = Vs + (size_t)j * D;
                    if (vec) {
#pragma unroll
                        for (int c = 0; c < DK / 4; c++) {
                            if (128 * c >= D) break;
                            const float4 v4 = *reinterpret_cast<const float4 *>(vr + 128 * c + 4 * lane);
#pragma unroll
                            for (int i = 0; i < RPT; i++) {
                                acc[i][4 * c] = fmaf(pj[i], v4.x, acc[i][4 * c]);
                                acc[i][4 * c + 1] = fmaf(pj[i], v4.y, acc[i][4 * c + 1]);
                                acc[i][4 * c + 2] = fmaf(pj[i], v4.z, acc[i][4 * c + 2]);
                                acc[i][4 * c + 3] = fmaf(pj[i], v4.w, acc[i][4 * c + 3]);
                            }
                        }
                    } else {
#pragma unroll
                        for (int k = 0; k < DK; k++) {
                            const int d = lane + 32 * k;
                            if (d < D) {
                                const float vv = vr[d];
#pragma unroll
                                for (int i = 0; i < RPT; i++) acc[i][k] = fmaf(pj[i], vv, acc[i][k]);
                            }
                        }
                    }
                }
            }
            __syncthreads();
        }
        /* results of this run's rows */
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            if (!active[i]) continue;
            const size_t th = (size_t)row_t[i] * p.n_heads + row_h[i];
            if (p.splits == 1) {
                /* a division, as the merge does: one split gives the same bits either way */
                float *o = p.out + th * D;
#pragma unroll
                for (int k = 0; k < DK; k++) {
                    const int d = attn_acc_channel(k, lane, vec);
                    if (d < D) o[d] = l[i] > 0.0f ? acc[i][k] / l[i] : 0.0f;
                }
            } else {
                const size_t ps = th * p.splits + split;
                if (lane == 0) {
                    p.part_ml[2 * ps] = m[i];
                    p.part_ml[2 * ps + 1] = l[i];
                }
                float *o = p.part_acc + ps * D;
#pragma unroll
                for (int k = 0; k < DK; k++) {
                    const int d = attn_acc_channel(k, lane, vec);
                    if (d < D) o[d] = acc[i][k];
                }
            }
        }
        run_start = run_end;
        if (run_start <= t_last) run_end = attn_run(p.seq, p.kv_range, p.range_off, run_start, t_last, &lo_u, &hi_u);
    }
}

template <int DMAX, int RPT, int T>
static void launch_attention(cuda_ctx *c, const attn_params &p, int tiles, size_t smem) {
    static unsigned configured; /* the opt-in above 48 KB, once per kernel and device */
    if (!cuda_done_on_device(&configured, c)) {
        /* dynamic shared memory may use what the kernel's static arrays leave */
        cudaFuncAttributes fa;
        if (!cuda_check(c, cudaFuncGetAttributes(&fa, attention_kernel<DMAX, RPT, T>), "cudaFuncGetAttributes"))
            return;
        const int dyn_max = (int)(c->caps.smem_optin - fa.sharedSizeBytes);
        if (!cuda_check(c,
                        cudaFuncSetAttribute(attention_kernel<DMAX, RPT, T>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem > 48 * 1024 ? dyn_max : 48 * 1024),
                        "cudaFuncSetAttribute"))
            return;
        if ((int)smem > 48 * 1024) cuda_mark_device(&configured, c);
    }
    dim3 grid((unsigned)tiles, (unsigned)p.n_kv, (unsigned)p.splits);
    cuda_launch(c, attention_kernel<DMAX, RPT, T>, grid, ATTN_THREADS, smem, p);
    cuda_launched(c, "attention");
}

template <int DMAX, int T>
static void launch_attention_rpt(cuda_ctx *c, const attn_params &p, int rpt, int tiles, size_t smem) {
    if (rpt == 1)
        launch_attention<DMAX, 1, T>(c, p, tiles, smem);
    else if (rpt == 2)
        launch_attention<DMAX, 2, T>(c, p, tiles, smem);
    else
        launch_attention<DMAX, 4, T>(c, p, tiles, smem);
}

/* T = 32 only up to head_dim 256 (the shared memory of 32 rows of 512) */
template <int DMAX>
static void launch_attention_t(cuda_ctx *c, const attn_params &p, int T, int rpt, int tiles, size_t smem) {
    if (T == 32)
        launch_attention_rpt<DMAX, DMAX <= 256 ? 32 : 16>(c, p, rpt, tiles, smem);
    else
        launch_attention_rpt<DMAX, 16>(c, p, rpt, tiles, smem);
}

void cuda_attention(g4_backend *be, float *out, const float *q, const void *kvp, const g4_attn_batch *b, int sliding,
                    int n_heads, float scale) {
    cuda_ctx *c = cuda_of(be);
    const cuda_kv *kv = (const cuda_kv *)kvp;
    const int n = b->n_tokens, D = kv->head_dim, Hkv = kv->n_kv_heads;
    if (n <= 0) return;
    if (Hkv <= 0 || n_heads % Hkv) {
        cuda_fail_op(c, "attention: %d query heads over %d KV heads", n_heads, Hkv);
        return;
    }
    if (D <= 0 || D > 512 || (D > 256 && D % 32)) {
        cuda_fail_op(c, "attention: head_dim %d unsupported (up to 256, or a multiple of 32 up to 512)", D);
        return;
    }
    const int G = n_heads / Hkv;
    const int dmax = D <= 64 ? 64 : D <= 128 ? 128 : D <= 256 ? 256 : 512;
    /* decode-like batches: one token's heads per tile, split keys instead */
    int rpt, rows_per_tile;
    const int decode = n <= 32 && G <= 4 * ATTN_WARPS;
    /* positions per staged K/V tile: 16 for head_dim 512 and for decode (a
     * tile's serial chain of loads, dot products and P V is what a short
     * context waits on), else 32. Two lanes share a position at 16, 16
     * channels each per 32: head_dim must be a multiple of 32. */
    const int T = dmax > 256 || (decode && D % 32 == 0) ? 16 : 32;
    if (decode) {
        rows_per_tile = G;
        rpt = G <= ATTN_WARPS ? 1 : G <= 2 * ATTN_WARPS ? 2 : 4;
    } else {
        rpt = dmax > 256 ? 2 : 4;
        rows_per_tile = ATTN_WARPS * rpt;
    }
    /* many query rows per KV head: tensor cores where the shape fits */
    if (!decode && c->tune.attn != G4_CUDA_ATTN_CORES && cuda_attention_tc(c, out, q, kv, b, sliding, n_heads, scale))
        return;
    const int tiles = (int)(((int64_t)n * G + rows_per_tile - 1) / rows_per_tile);
    /* Decode splits each token's keys into pieces from its first key (at
     * most ATTN_MAX_SPLITS pieces, as many as the cache's capacity needs), so a token's
     * result does not depend on what else is in the batch; prefill tiles are
     * parallel enough alone. The pieces' length comes from the token's own
     * span (kernel side, see attn_params.pieces): a short context in a long
     * session still gets about two blocks per multiprocessor. */
    int splits = 1, split_len = INT32_MAX / 2, pieces = 0, min_len = T;
    if (decode) {
        const int64_t max_span = (int64_t)(sliding ? b->ring_blocks : b->full_table_stride) * b->block_size;
        int64_t len = (max_span + ATTN_MAX_SPLITS - 1) / ATTN_MAX_SPLITS;
        /* Pieces just short enough for about two blocks per multiprocessor
         * over the batch's tiles and KV heads, one key tile at least
         * (tune.attn_min_split raises that floor; shorter pieces than that
         * only add partials to merge). */
        const int64_t want_blocks = 2 * (int64_t)c->caps.sm_count;
        const int64_t fill = ((int64_t)max_span * tiles * Hkv + want_blocks - 1) / want_blocks;
        if (len < fill) len = fill;
        min_len = c->tune.attn_min_split > 0 ? (c->tune.attn_min_split + T - 1) / T * T : T;
        if (len < min_len) len = min_len;
        len = (len + T - 1) / T * T;
        split_len = (int)len;
        splits = (int)((max_span + len - 1) / len); /* at most ATTN_MAX_SPLITS: len >= max_span / that */
        if (splits < 1) splits = 1;
        /* pieces per token for about two blocks per multiprocessor */
        const int64_t per_token = (want_blocks + (int64_t)tiles * Hkv - 1) / ((int64_t)tiles * Hkv);
        if (splits > 1) pieces = (int)(per_token < splits ? per_token : splits);
    }
    attn_params p;
    static_cast<attn_common &>(p) = attn_common_of(out, q, kv, b, sliding, n_heads, scale);
    p.rows_per_tile = rows_per_tile;
    p.splits = splits;
    p.split_len = split_len;
    p.pieces = pieces;
    p.min_len = min_len;
    p.part_acc = p.part_ml = NULL;
    if (splits > 1 && !cuda_attention_parts(c, (int64_t)n * n_heads, splits, D, &p.part_acc, &p.part_ml)) return;
    const size_t smem = ((size_t)ATTN_WARPS * rpt * D + (size_t)T * attn_k_stride(D) + (size_t)T * D) * sizeof(float);
    if (smem > c->caps.smem_optin) {
        cuda_fail_op(c, "attention: %zu bytes of shared memory needed, %zu available", smem, c->caps.smem_optin);
        return;
    }
    switch (dmax) {
    case 64: launch_attention_t<64>(c, p, T, rpt, tiles, smem); break;
    case 128: launch_attention_t<128>(c, p, T, rpt, tiles, smem); break;
    case 256: launch_attention_t<256>(c, p, T, rpt, tiles, smem); break;
    default: launch_attention_t<512>(c, p, T, rpt, tiles, smem); break;
    }
    if (splits > 1) cuda_attention_merge(c, out, p.part_acc, p.part_ml, n * n_heads, splits, D);
}

int cuda_attention_parts(cuda_ctx *c, int64_t rows, int splits, int D, float **part_acc, float **part_ml) {
    const size_t th = (size_t)rows * splits;
    float *part = (float *)cuda_scratch(c, SCRATCH_ATTN_PART, th * ((size_t)D + 2) * sizeof(float));
    if (!part) return 0;
    *part_acc = part;
    *part_ml = part + th * D;
    return 1;
}

void cuda_attention_merge(cuda_ctx *c, float *out, const float *part_acc, const float *part_ml, int64_t rows,
                          int splits, int D) {
    cuda_launch(c, attention_merge_kernel, (unsigned)rows, D > 128 ? 256 : 128, 0, out, part_acc, part_ml, splits, D);
    cuda_launched(c, "attention_merge");
}
