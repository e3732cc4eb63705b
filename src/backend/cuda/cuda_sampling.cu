/* top_logits on the GPU: the k largest logits of each row (value
 * descending, equal values by ascending id) and the row's log-sum-exp, so
 * that a decode step copies k pairs to the host instead of the row.
 *
 * Two launches per call, every row at once:
 *  1. top_partial_kernel, grid (blocks, rows): each block takes a chunk of
 *     the row and writes its max, sum exp(x - max) and NaN flag, and its
 *     own top-k' (k' = min(k, chunk)) found by a radix select on the
 *     float's order-preserving bits (8 bits a pass, passes over the chunk
 *     in L2; ties at the k'-th value taken lowest id first). k = 1 is a
 *     plain argmax (one 64-bit max per block).
 *  2. top_merge_kernel, one block per row: the union of the blocks' lists
 *     (at most MERGE_MAX entries, in shared memory) as distinct 64-bit keys
 *     (value bits << 32 | ~id: larger key = earlier in the order), a radix
 *     select of the k largest, a bitonic sort of those, and the lse from the
 *     partials in double.
 * The row's top-k lies in the union: each of its members is in its block's
 * top-k'. Blocks per row: 128 for k = 1, else MERGE_MAX / k (64 at most),
 * so the union fits shared memory: with vocab 262144 a block reads 2048
 * (k = 1), 4096 (k <= 64) to 65536 (k = 1024) logits per pass, a few passes,
 * from L2 where the LM head just wrote them.
 *
 * top_logits_masked (constrained decoding) is the same two launches reading
 * each masked row through its token mask (a disallowed token reads -inf;
 * one mask word per 32 logits, from L2 too), so that no row's allowed
 * tokens need the whole row on the host. */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

namespace {

constexpr int TOP_THREADS = 1024;
constexpr int MERGE_MAX = 4096; /* candidates of one row in the merge */
constexpr int MAX_BLOCKS = 128; /* blocks per row */
constexpr unsigned FULL = 0xffffffffu;

/* Unsigned key ordered as the float: NaN counts as -inf (a NaN row is
 * reported through lse; its selection only has to stay defined) and -0 as
 * +0 (equal values are ordered by id). */
__device__ __forceinline__ uint32_t order_key(float v) {
    uint32_t u = __float_as_uint(v != v ? -INFINITY : v);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* value order then lower id first, as one distinct 64-bit key */
__device__ __forceinline__ uint64_t rank_key(float v, int32_t id) {
    return ((uint64_t)order_key(v) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

__device__ __forceinline__ int32_t id_of(uint64_t key) { return (int32_t)(0xffffffffu - (uint32_t)key); }

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }

/* A row as its token mask leaves it (bits NULL: every token allowed);
 * MASKED false compiles to the plain reads. */
template <bool MASKED> struct row_view {
    const float *x;
    const uint32_t *bits;
    int words;
    __device__ __forceinline__ float operator()(int i) const {
        if (!MASKED || !bits) return x[i];
        const int w = i >> 5;
        return w < words && ((bits[w] >> (i & 31)) & 1u) ? x[i] : -INFINITY;
    }
};

template <bool MASKED>
__device__ __forceinline__ row_view<MASKED> view_of(const float *x, const uint32_t *masks, int words,
                                                    const int32_t *slot, int r) {
    row_view<MASKED> v = {x, nullptr, 0};
    if (MASKED && masks && slot[r] >= 0) {
        v.bits = masks + (size_t)slot[r] * words;
        v.words = words;
    }
    return v;
}

__device__ float block_max(float v) {
    __shared__ float w[32];
    v = warp_max(v);
    if (lane_id() == 0) w[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? w[threadIdx.x] : -INFINITY;
        v = warp_max(v);
        if (threadIdx.x == 0) w[0] = v;
    }
    __syncthreads();
    v = w[0];
    __syncthreads();
    return v;
}

__device__ float block_sum(float v) {
    __shared__ float w[32];
    v = warp_sum(v);
    if (lane_id() == 0) w[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? w[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) w[0] = v;
    }
    __syncthreads();
    v = w[0];
    __syncthreads();
    return v;
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t t = __shfl_xor_sync(FULL, v, o);
        v = t > v ? t : v;
    }
    return v;
}

__device__ uint64_t block_max_u64(uint64_t v) {
    __shared__ uint64_t w[32];
    v = warp_max_u64(v);
    if (lane_id() == 0) w[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? w[threadIdx.x] : 0;
        v = warp_max_u64(v);
        if (threadIdx.x == 0) w[0] = v;
    }
    __syncthreads();
    v = w[0];
    __syncthreads();
    return v;
}

/* hist[bin] += 1 for each lane with bin < 256, lanes of equal bins added
 * once (logit exponents crowd a few bins). Every lane of the warp calls. */
__device__ __forceinline__ void hist_add(unsigned *hist, unsigned bin) {
    const unsigned peers = __match_any_sync(FULL, bin);
    if (bin < 256u && (int)lane_id() == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}

/* Every lane with `take` gets a distinct slot from *counter (warp-aggregated). */
__device__ __forceinline__ unsigned claim_slot(unsigned *counter, bool take) {
    const unsigned ballot = __ballot_sync(FULL, take);
    unsigned base = 0;
    if (lane_id() == 0 && ballot) base = atomicAdd(counter, (unsigned)__popc(ballot));
    base = __shfl_sync(FULL, base, 0);
    return base + (unsigned)__popc(ballot & ((1u << lane_id()) - 1u));
}

struct selection {
    uint64_t prefix, mask; /* the want-th largest key agrees with prefix on mask */
    unsigned remaining;    /* how many of the keys matching prefix belong to the top `want` */
    unsigned matching;     /* how many keys match prefix */
};

/* Radix select of the want-th largest of n keys (load(i), BITS wide), 8
 * bits a pass from the top, stopping early once every key of the chosen
 * bin is taken. The top `want` are then the keys with (key & mask) >
 * prefix, and `remaining` of those equal to it (all when remaining ==
 * matching). Called by the whole block; 1 <= want <= n. */
template <int BITS, typename Load>
__device__ selection block_select(Load load, int n, unsigned want) {
    __shared__ unsigned hist[256];
    __shared__ uint64_t s_prefix;
    __shared__ unsigned s_remaining, s_count;
    const unsigned lane = lane_id();
    selection s = {0, 0, want, (unsigned)n};
    for (int shift = BITS - 8; shift >= 0; shift -= 8) {
        for (int j = threadIdx.x; j < 256; j += blockDim.x) hist[j] = 0;
        __syncthreads();
        for (int base = 0; base < n; base += blockDim.x) {
            const int i = base + (int)threadIdx.x;
            unsigned bin = 256u;
            if (i < n) {
                const uint64_t key = load(i);
                if ((key & s.mask) == s.prefix) bin = (unsigned)(key >> shift) & 255u;
            }
            hist_add(hist, bin);
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* lane l holds bins 255 - 8l down to 248 - 8l */
            unsigned c[8], sum = 0;
            for (int q = 0; q < 8; q++) {
                c[q] = hist[255 - 8 * lane - q];
                sum += c[q];
            }
            unsigned incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned t = __shfl_up_sync(FULL, incl, o);
                if ((int)lane >= o) incl += t;
            }
            unsigned above = incl - sum;
            if (above < s.remaining && s.remaining <= incl) {
                for (int q = 0; q < 8; q++) {
                    if (above + c[q] >= s.remaining) {
                        s_prefix = s.prefix | ((uint64_t)(255 - 8 * lane - q) << shift);
                        s_remaining = s.remaining - above;
                        s_count = c[q];
                        break;
                    }
                    above += c[q];
                }
            }
        }
        __syncthreads();
        s.prefix = s_prefix;
        s.remaining = s_remaining;
        s.matching = s_count;
        s.mask |= (uint64_t)255 << shift;
        __syncthreads(); /* s_* and hist are written again next pass */
        if (s.matching == s.remaining) break;
    }
    return s;
}

template <bool MASKED>
__global__ void __launch_bounds__(TOP_THREADS)
    top_partial_kernel(const float *logits, int vocab, int chunk, int k, int n_blocks, float *cand_v,
                       int32_t *cand_i, float4 *part, const uint32_t *masks, int mask_words, const int32_t *mask_slot) {
    pdl_wait();
    const int b = blockIdx.x, r = blockIdx.y;
    const row_view<MASKED> x = view_of<MASKED>(logits + (size_t)r * vocab, masks, mask_words, mask_slot, r);
    const int lo = (int)min((long long)b * chunk, (long long)vocab), hi = min(lo + chunk, vocab), n = hi - lo;
    const size_t slot = ((size_t)r * n_blocks + b) * (size_t)k;

    /* partial max, NaN flag and (k = 1) the argmax */
    float m = -INFINITY;
    int nan = 0;
    uint64_t best = 0;
    for (int i = lo + (int)threadIdx.x; i < hi; i += blockDim.x) {
        const float v = x(i);
        nan |= v != v;
        m = fmaxf(m, v); /* NaN ignored */
        if (k == 1) {
            const uint64_t key = rank_key(v, i);
            best = key > best ? key : best;
        }
    }
    m = block_max(m);
    nan = __syncthreads_or(nan);
    float sum = 0.0f;
    if (m > -INFINITY && m < INFINITY)
        for (int i = lo + (int)threadIdx.x; i < hi; i += blockDim.x) sum += expf(x(i) - m);
    sum = block_sum(sum);
    if (threadIdx.x == 0) part[(size_t)r * n_blocks + b] = make_float4(m, sum, nan ? 1.0f : 0.0f, 0.0f);
    if (n <= 0) return;

    if (k == 1) {
        best = block_max_u64(best);
        if (threadIdx.x == 0) {
            cand_i[slot] = id_of(best);
            cand_v[slot] = x(id_of(best));
        }
        return;
    }

    const unsigned want = (unsigned)min(k, n);
    auto load = [x, lo](int i) -> uint64_t { return order_key(x(lo + i)); };
    const selection s = block_select<32>(load, n, want);
    __shared__ unsigned s_out;
    if (threadIdx.x == 0) s_out = 0;
    __syncthreads();
    const bool all_ties = s.matching == s.remaining;
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + (int)threadIdx.x;
        bool take = false;
        if (i < n) {
            const uint64_t key = load(i) & s.mask;
            take = all_ties ? key >= s.prefix : key > s.prefix;
        }
        const unsigned pos = claim_slot(&s_out, take);
        if (take) {
            cand_i[slot + pos] = lo + i;
            cand_v[slot + pos] = x(lo + i);
        }
    }
    if (all_ties) return;
    /* more logits equal the k'-th than fit: the lowest ids, ranked in id order */
    __shared__ unsigned warp_count[32];
    const unsigned above = want - s.remaining;
    const unsigned warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    unsigned done = 0; /* ties seen before this stretch, the same in every thread */
    for (int base = 0; base < n && done < s.remaining; base += blockDim.x) {
        const int i = base + (int)threadIdx.x;
        const bool tie = i < n && load(i) == s.prefix;
        const unsigned ballot = __ballot_sync(FULL, tie);
        if (lane_id() == 0) warp_count[warp] = (unsigned)__popc(ballot);
        __syncthreads();
        unsigned rank = done, total = done;
        for (unsigned w = 0; w < n_warps; w++) {
            if (w < warp) rank += warp_count[w];
            total += warp_count[w];
        }
        rank += (unsigned)__popc(ballot & ((1u << lane_id()) - 1u));
        if (tie && rank < s.remaining) {
            cand_i[slot + above + rank] = lo + i;
            cand_v[slot + above + rank] = x(lo + i);
        }
        __syncthreads(); /* warp_count is written again */
        done = total;
    }
}

template <bool MASKED>
__global__ void __launch_bounds__(TOP_THREADS)
    top_merge_kernel(const float *logits, int vocab, int chunk, int k, int n_blocks, const float *cand_v,
                     const int32_t *cand_i, const float4 *part, int32_t *ids, float *values, double *lse,
                     const uint32_t *masks, int mask_words, const int32_t *mask_slot) {
    pdl_wait();
    __shared__ uint64_t keys[MERGE_MAX];
    __shared__ uint64_t sorted[G4_TOP_LOGITS_MAX_K];
    __shared__ unsigned s_n;
    const int r = blockIdx.x;
    const row_view<MASKED> x = view_of<MASKED>(logits + (size_t)r * vocab, masks, mask_words, mask_slot, r);

    /* log-sum-exp from the blocks' (max, sum exp(x - max)), in double */
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        int nan = 0;
        for (int b = (int)threadIdx.x; b < n_blocks; b += 32) {
            const float4 p = part[(size_t)r * n_blocks + b];
            M = fmaxf(M, p.x);
            nan |= p.z != 0.0f;
        }
        M = warp_max(M);
        nan = __any_sync(FULL, nan);
        double S = 0;
        if (M > -INFINITY && M < INFINITY)
            for (int b = (int)threadIdx.x; b < n_blocks; b += 32) {
                const float4 p = part[(size_t)r * n_blocks + b];
                if (p.x > -INFINITY) S += (double)p.y * exp((double)p.x - (double)M);
            }
        for (int o = 16; o > 0; o >>= 1) S += __shfl_xor_sync(FULL, S, o);
        if (threadIdx.x == 0) lse[r] = nan ? (double)NAN : (M > -INFINITY && M < INFINITY) ? (double)M + log(S) : (double)M;
    }

    /* the blocks' lists as keys; empty slots (blocks shorter than k) are 0,
     * below every real key */
    const int U = n_blocks * k;
    const size_t first = (size_t)r * n_blocks * k;
    for (int j = (int)threadIdx.x; j < U; j += blockDim.x) {
        const int b = j / k, q = j - b * k;
        const int n_b = max(0, min(chunk, vocab - b * chunk));
        keys[j] = q < n_b ? rank_key(cand_v[first + j], cand_i[first + j]) : 0;
    }
    if (threadIdx.x == 0) s_n = 0;
    __syncthreads();

    const int want = min(k, vocab);
    if (want == 1) {
        uint64_t best = 0;
        for (int j = (int)threadIdx.x; j < U; j += blockDim.x) best = keys[j] > best ? keys[j] : best;
        best = block_max_u64(best);
        if (threadIdx.x == 0) sorted[0] = best;
        __syncthreads();
    } else {
        auto load = [](int i) -> uint64_t { return keys[i]; };
        const selection s = block_select<64>(load, U, (unsigned)want);
        /* keys are distinct, so exactly `want` pass */
        for (int base = 0; base < U; base += blockDim.x) {
            const int j = base + (int)threadIdx.x;
            const bool take = j < U && (keys[j] & s.mask) >= s.prefix && keys[j] != 0;
            const unsigned pos = claim_slot(&s_n, take);
            if (take && pos < (unsigned)G4_TOP_LOGITS_MAX_K) sorted[pos] = keys[j];
        }
        int P = 1;
        while (P < want) P <<= 1;
        __syncthreads();
        for (int j = want + (int)threadIdx.x; j < P; j += blockDim.x) sorted[j] = 0;
        __syncthreads();
        /* bitonic sort, descending */
        for (int size = 2; size <= P; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int i = (int)threadIdx.x; i < P; i += blockDim.x) {
                    const int j = i ^ stride;
                    if (j > i) {
                        const uint64_t a = sorted[i], c = sorted[j];
                        const bool descending = (i & size) == 0;
                        if (descending ? a < c : a > c) {
                            sorted[i] = c;
                            sorted[j] = a;
                        }
                    }
                }
                __syncthreads();
            }
    }
    for (int j = (int)threadIdx.x; j < k; j += blockDim.x) {
        const size_t o = (size_t)r * k + j;
        if (j < want) {
            const int32_t id = id_of(sorted[j]);
            const float v = x(id); /* the logit's own bits (-0 stays -0) */
            /* a masked row's -inf tokens cannot be drawn: id -1 (backend.h) */
            ids[o] = MASKED && x.bits && v == -INFINITY ? -1 : id;
            values[o] = v;
        } else {
            ids[o] = -1;
            values[o] = -INFINITY;
        }
    }
}

} // namespace

/* Both launches for every row; masks NULL: plain top_logits. */
template <bool MASKED>
static void top_logits_launch(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                              int vocab, int k, const uint32_t *masks, int mask_words, const int32_t *slot) {
    cuda_ctx *c = cuda_of(be);
    if (rows <= 0 || k <= 0 || vocab <= 0) return;
    if (k > G4_TOP_LOGITS_MAX_K) {
        cuda_fail_op(c, "top_logits: k = %d above %d", k, G4_TOP_LOGITS_MAX_K);
        return;
    }
    int n_blocks = k == 1 ? MAX_BLOCKS : MERGE_MAX / k;
    if (n_blocks > 64 && k > 1) n_blocks = 64;
    const int by_size = (vocab + 1023) / 1024; /* at least ~1024 logits a block */
    if (n_blocks > by_size) n_blocks = by_size;
    if (n_blocks < 1) n_blocks = 1;
    const int chunk = (vocab + n_blocks - 1) / n_blocks;
    /* sized for the largest k, so a recording never needs it to grow */
    const size_t part_bytes = (size_t)rows * MAX_BLOCKS * sizeof(float4);
    const size_t cand_n = (size_t)rows * MERGE_MAX;
    char *buf = (char *)cuda_scratch(c, SCRATCH_TOP_LOGITS, part_bytes + cand_n * 8);
    if (!buf) return;
    float4 *part = (float4 *)buf;
    float *cand_v = (float *)(buf + part_bytes);
    int32_t *cand_i = (int32_t *)(cand_v + cand_n);
    cuda_launch(c, top_partial_kernel<MASKED>, dim3((unsigned)n_blocks, (unsigned)rows), TOP_THREADS, 0,
        logits, vocab, chunk, k, n_blocks, cand_v, cand_i, part, masks, mask_words, slot);
    if (!cuda_launched(c, "top_logits (blocks)")) return;
    cuda_launch(c, top_merge_kernel<MASKED>, (unsigned)rows, TOP_THREADS, 0, logits, vocab, chunk, k, n_blocks,
                cand_v, cand_i, part, ids, values, lse, masks, mask_words, slot);
    cuda_launched(c, "top_logits (merge)");
}

void cuda_top_logits(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                     int vocab, int k) {
    top_logits_launch<false>(be, ids, values, lse, logits, rows, vocab, k, nullptr, 0, nullptr);
}

void cuda_top_logits_masked(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                            int vocab, int k, const uint32_t *masks, int mask_words, const int32_t *slot) {
    top_logits_launch<true>(be, ids, values, lse, logits, rows, vocab, k, masks, mask_words, slot);
}
