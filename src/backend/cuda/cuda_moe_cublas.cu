/* The MoE experts' prefill products through cuBLAS, for bf16 experts
 * (from c->tune.moe_cublas tokens on; 0 turns it off).
 *
 * Why: at 512 tokens the 26B-A4B's 128 experts get ~32 slots each, and
 * cuBLAS's batched GEMM, every expert padded to the same slot count, is
 * several times faster on them than our grouped kernel (cuda_moe_gemm.cu;
 * bench/RESULTS.md, bench/moe_cublas_bench.cu). Its grouped GEMM, which would
 * need no padding, refuses float32 results for bf16 operands.
 *
 * The products run with the operands swapped: M = the expert's weight rows,
 * N = its slots, K = the input width. Each expert's activation rows are
 * gathered (in the order cuda_moe's sorter gives: expert 0's slots, then
 * 1's, ...) and split into bf16 hi and lo on the way, its hi rows then its
 * lo rows, so that one product covers both parts (N = 2 x its slots); the
 * float32 results of the two parts are added where they are read: by the
 * gelu(gate) * up step, which writes g back in slot order, and by the
 * tokens' weighted sums of their experts' down projections (the same sums
 * as cuda_matmul's two products, then as moe_combine_kernel's).
 *
 * Experts are padded to a few column counts ("buckets", pad_columns), zero
 * rows after their own, and each bucket is one cublasGemmBatchedEx call:
 * skewed routing then costs a few more calls instead of padding every
 * expert to the busiest one's count.
 *
 * cuBLAS takes the shapes on the host: the experts' slot counts come back
 * once per call (a stream synchronisation), so this path only serves steps
 * larger than any the backend records (G4_CUDA_RECORD_MAX_TOKENS): the same
 * kernels whether or not a step is being captured. The pointer arrays and offsets go to the device in one
 * asynchronous copy from pinned memory. */
#include <algorithm>
#include <string.h>
#include <vector>

#include "backend/cuda/cuda_formats.cuh"
#include "backend/cuda/cuda_internal.cuh"

/* the expert holding row i of a list where expert e starts at start[e]:
 * the last e with start[e] <= i */
__device__ __forceinline__ int expert_of_row(const int32_t *start, int n_experts, int i) {
    int lo = 0, hi = n_experts - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (start[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Padded row p (one block per row) of expert e (its rows start at
 * padded[e]): j = p - padded[e]; rows j < count[e] hold the hi part of
 * source row src[sorted[offset[e] + j] / src_div], the next count[e] rows
 * (parts 2) its lo part, the rest zeros. Eight columns per thread and step
 * (K % 8 == 0). slot_row (or NULL): each slot's hi row, written. */
__global__ void moe_gather_split_kernel(__nv_bfloat16 *dst, const float *src, int src_div, const int32_t *sorted,
                                        const int32_t *offset, const int32_t *padded, const int32_t *count,
                                        int n_experts, int K, int parts, int32_t *slot_row) {
    const int p = blockIdx.x;
    const int e = expert_of_row(padded, n_experts, p);
    const int j = p - padded[e], c = count[e];
    uint4 *d = reinterpret_cast<uint4 *>(dst + (size_t)p * K);
    const int part = j < c ? 0 : j < parts * c ? 1 : -1;
    if (part < 0) {
        for (int i = threadIdx.x; i < K / 8; i += blockDim.x) d[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    const int slot = sorted[offset[e] + j - part * c];
    if (slot_row && part == 0 && threadIdx.x == 0) slot_row[slot] = p;
    const float4 *s = reinterpret_cast<const float4 *>(src + (size_t)(slot / src_div) * K);
    for (int i = threadIdx.x; i < K / 8; i += blockDim.x) {
        const float4 a = s[2 * i], b = s[2 * i + 1];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        uint32_t packed[4];
        for (int q = 0; q < 4; q++) {
            uint32_t hi, lo;
            split_pack(v[2 * q], v[2 * q + 1], hi, lo);
            packed[q] = part == 0 ? hi : lo;
        }
        d[i] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

/* Sorted row i (one block per row), expert e's j-th slot: its hi product
 * row is padded[e] + j, its lo row count[e] further (parts 2); the gate's
 * and up's sums side by side (row length 2 W). out[sorted[i]][:W] =
 * gelu(gate) * up, each summed from its two parts first. Four columns per
 * thread and step (W % 4 == 0). */
__global__ void moe_scatter_gelu_kernel(float *out, const float *rows, int W, const int32_t *sorted,
                                        const int32_t *offset, const int32_t *padded, const int32_t *count,
                                        int n_experts, int parts) {
    const int i = blockIdx.x;
    const int e = expert_of_row(offset, n_experts, i);
    const int j = i - offset[e];
    const float4 *hi = reinterpret_cast<const float4 *>(rows + (size_t)(padded[e] + j) * 2 * W);
    const float4 *lo = reinterpret_cast<const float4 *>(rows + (size_t)(padded[e] + count[e] + j) * 2 * W);
    auto sum = [&](int q) {
        float4 v = hi[q];
        if (parts > 1) {
            const float4 l = lo[q];
            v.x += l.x, v.y += l.y, v.z += l.z, v.w += l.w;
        }
        return v;
    };
    float4 *o = reinterpret_cast<float4 *>(out + (size_t)sorted[i] * W);
    const int W4 = W / 4;
    for (int q = threadIdx.x; q < W4; q += blockDim.x) {
        const float4 g = sum(q), u = sum(W4 + q);
        o[q] = make_float4(__fmul_rn(gelu_tanh(g.x), u.x), __fmul_rn(gelu_tanh(g.y), u.y),
                           __fmul_rn(gelu_tanh(g.z), u.z), __fmul_rn(gelu_tanh(g.w), u.w));
    }
}

/* out[t][:] = sum_j weights[t][j] * y_j over token t's valid choices, in
 * order, where y_j = hi + lo of slot t k + j's product rows (slot_row: its hi
 * row; the lo row count[e] further): moe_combine_kernel's sums, reading the
 * down projection's rows where they are. Grid (column blocks of 4 x 64,
 * tokens). */
__global__ void moe_cublas_combine_kernel(float *out, const float *rows, int d, const int32_t *slot_row,
                                          const int32_t *count, const int32_t *ids, const float *weights, int k,
                                          int n_experts, int parts) {
    const int t = blockIdx.y;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= d / 4) return;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < k; j++) {
        const size_t slot = (size_t)t * k + j;
        const int e = ids[slot];
        if (e < 0 || e >= n_experts) continue;
        const float w = weights[slot];
        const float *hi_row = rows + (size_t)slot_row[slot] * d;
        float4 y = reinterpret_cast<const float4 *>(hi_row)[q];
        if (parts > 1) {
            const float4 l = reinterpret_cast<const float4 *>(hi_row + (size_t)count[e] * d)[q];
            y.x += l.x, y.y += l.y, y.z += l.z, y.w += l.w;
        }
        acc.x = fmaf(w, y.x, acc.x), acc.y = fmaf(w, y.y, acc.y);
        acc.z = fmaf(w, y.z, acc.z), acc.w = fmaf(w, y.w, acc.w);
    }
    reinterpret_cast<float4 *>(out + (size_t)t * d)[q] = acc;
}

/* columns an expert with `cols` product columns is padded to: multiples of
 * 16 up to 128, then coarser (a bucket is one batched call) */
static int pad_columns(int cols) {
    const int step = cols <= 128 ? 16 : cols <= 512 ? 64 : 256;
    return (cols + step - 1) / step * step;
}

/* What one call of cuda_moe_experts_cublas works from. */
struct moe_cublas_plan {
    int n_experts, parts;
    std::vector<int> count;        /* slots per expert */
    std::vector<int> order;        /* experts with slots, by padded column count */
    std::vector<int32_t> offset;   /* first sorted row of each expert */
    std::vector<int32_t> padded;   /* first padded row of each expert */
    int total, padded_total;       /* sorted rows, padded rows */
    const void **d_ptr; /* per product: the order's A, B and C pointers, len(order) each */
};

/* W_e xs_e for every expert with slots (W_e: M weight rows from the
 * product's A pointer), into its rows of the product buffer (row stride
 * ld_rows): one batched call per bucket; the product's pointers (A, B, C,
 * as product_pointers lists them) sit at d_ptr + 3 n slot. */
static int bucketed_product(cuda_ctx *c, const moe_cublas_plan &p, int slot, int ld_rows, const g4_matrix *w,
                            int64_t M) {
    const int K = (int)w->cols, lda = (int)(w->row_bytes / 2), n = (int)p.order.size();
    const void **a = p.d_ptr + (size_t)3 * n * slot, **b = a + n;
    void **cc = (void **)(a + 2 * n);
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < n;) {
        const int cols = pad_columns(p.parts * p.count[p.order[i]]);
        int j = i;
        while (j < n && pad_columns(p.parts * p.count[p.order[j]]) == cols) j++;
        if (!cuda_check_blas(c,
                             c->blas_api->gemm_batched(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, cols, K, &one, a + i,
                                                       CUDA_R_16BF, lda, b + i, CUDA_R_16BF, K, &zero, cc + i,
                                                       CUDA_R_32F, ld_rows, j - i, CUBLAS_COMPUTE_32F,
                                                       CUBLAS_GEMM_DEFAULT),
                             "cublasGemmBatchedEx"))
            return 0;
        i = j;
    }
    return 1;
}

/* the pointers of one product: A (expert e's first weight row), B (its
 * first gathered row), C (its first product row, from column col0) */
static void product_pointers(const moe_cublas_plan &p, std::vector<const void *> &ptr, const g4_matrix *w,
                             int64_t stride, int64_t row_offset, const __nv_bfloat16 *xs, int K, float *rows,
                             int ld_rows, int col0) {
    const size_t n = p.order.size(), base = ptr.size();
    ptr.resize(base + 3 * n);
    for (size_t i = 0; i < n; i++) {
        const int e = p.order[i];
        ptr[base + i] = (const uint8_t *)w->data + (size_t)((int64_t)e * stride + row_offset) * w->row_bytes;
        ptr[base + n + i] = xs + (size_t)p.padded[e] * K;
        ptr[base + 2 * n + i] = rows + (size_t)p.padded[e] * ld_rows + col0;
    }
}

static size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

int cuda_moe_experts_cublas(cuda_ctx *c, float *out, float *g, const float *x, int n, const int32_t *ids,
                            const float *weights, int k, int n_experts,
                            const g4_matrix *wg, const g4_matrix *wu, const g4_matrix *wd, int64_t gate_stride,
                            int64_t gate_offset, int64_t up_stride, int64_t up_offset, int64_t down_stride,
                            int64_t down_offset, const cuda_groups *groups) {
    if (c->tune.moe_cublas <= 0 || n < c->tune.moe_cublas || !c->blas_api->gemm_batched) return 0;
    const g4_matrix *ws[3] = {wg, wu, wd};
    for (const g4_matrix *w : ws)
        if (fast_format_of(w) != FF_BF16 || w->row_bytes % 16 || ((uintptr_t)w->data & 15) || w->cols % 8 ||
            w->rows % 4 || w->cols > INT32_MAX || w->rows > INT32_MAX / 2)
            return 0;
    /* (the gathers and scatters move 16 bytes at a time) */
    if (((uintptr_t)x & 15) || ((uintptr_t)g & 15) || ((uintptr_t)out & 15)) return 0;
    /* it waits for the host (below): never for a step run_step may record,
     * so that a recorded step replays the kernels it runs eagerly */
    if (n <= G4_CUDA_RECORD_MAX_TOKENS) return 0;

    const int n_slots = n * k, parts = c->prefill_split ? 2 : 1;
    const int64_t width = wg->rows, d = wd->rows, d_in = wg->cols;
    /* gate and up as one product where up's rows follow gate's in one tensor (HF's gate_up_proj) */
    const int fused = wg->data == wu->data && gate_stride == up_stride && up_offset == gate_offset + width;

    moe_cublas_plan p;
    p.n_experts = n_experts;
    p.parts = parts;
    p.count.resize(n_experts);
    /* the experts' slot counts, on the host, through the first pinned
     * staging buffer (free once its last upload's event has passed) */
    uint8_t *stage = (uint8_t *)c->pinned[0];
    if (!cuda_check(c, cudaEventSynchronize(c->pinned_free[0]), "cudaEventSynchronize") ||
        !cuda_check(c, cudaMemcpyAsync(stage, groups->expert_count, (size_t)n_experts * 4, cudaMemcpyDeviceToHost,
                                       c->stream),
                    "expert counts") ||
        !cuda_check(c, cudaStreamSynchronize(c->stream), "expert counts"))
        return 1;
    memcpy(p.count.data(), stage, (size_t)n_experts * 4);
    p.offset.resize(n_experts);
    p.padded.resize(n_experts);
    p.total = p.padded_total = 0;
    for (int e = 0; e < n_experts; e++) {
        p.offset[e] = p.total;
        p.padded[e] = p.padded_total;
        p.total += p.count[e];
        if (p.count[e] > 0) {
            p.padded_total += pad_columns(parts * p.count[e]);
            p.order.push_back(e);
        }
    }
    /* (slots of invalid ids are not sorted: their rows stay unwritten, and
     * the combine skips them) */
    if (p.total > n_slots) {
        cuda_fail_op(c, "moe (cuBLAS): %d sorted slots of %d", p.total, n_slots);
        return 1;
    }
    if (p.total == 0) return 0;
    std::stable_sort(p.order.begin(), p.order.end(), [&](int a, int b) {
        return pad_columns(parts * p.count[a]) < pad_columns(parts * p.count[b]);
    });

    /* device: gathered rows (bf16), product rows (float32), offsets, pointers */
    const int64_t widest_in = d_in > width ? d_in : width, widest_out = 2 * width > d ? 2 * width : d;
    const size_t n_ptr = 3 * p.order.size() * 3;
    const size_t xs_bytes = align256((size_t)p.padded_total * widest_in * 2);
    const size_t rows_bytes = align256((size_t)p.padded_total * widest_out * 4);
    const size_t idx_bytes = align256((size_t)n_experts * 4);
    const size_t ptr_bytes = align256(n_ptr * sizeof(void *));
    const size_t slot_bytes = align256((size_t)n_slots * 4);
    uint8_t *buf = (uint8_t *)cuda_scratch(c, SCRATCH_MOE_GROUPED,
                                           xs_bytes + rows_bytes + 3 * idx_bytes + ptr_bytes + slot_bytes);
    if (!buf) return 1; /* (a sticky failure: the forward pass reports it) */
    __nv_bfloat16 *xs = (__nv_bfloat16 *)buf;
    float *rows = (float *)(buf + xs_bytes);
    int32_t *d_offset = (int32_t *)(buf + xs_bytes + rows_bytes);
    int32_t *d_padded = (int32_t *)(buf + xs_bytes + rows_bytes + idx_bytes);
    int32_t *d_count = (int32_t *)(buf + xs_bytes + rows_bytes + 2 * idx_bytes);
    p.d_ptr = (const void **)(buf + xs_bytes + rows_bytes + 3 * idx_bytes);
    int32_t *slot_row = (int32_t *)(buf + xs_bytes + rows_bytes + 3 * idx_bytes + ptr_bytes);

    /* products: 0 gate (or gate|up), 1 up, 2 down; gate's and up's sums side by side in rows */
    const int ld_gu = (int)(2 * width);
    std::vector<const void *> ptr;
    product_pointers(p, ptr, wg, gate_stride, gate_offset, xs, (int)d_in, rows, ld_gu, 0);
    product_pointers(p, ptr, wu, up_stride, up_offset, xs, (int)d_in, rows, ld_gu, (int)width);
    product_pointers(p, ptr, wd, down_stride, down_offset, xs, (int)width, rows, (int)d, 0);
    /* offsets, padded offsets, counts and pointers: one asynchronous copy
     * from the staging buffer, laid out as in buf */
    const size_t plan_bytes = 3 * idx_bytes + ptr_bytes;
    if (plan_bytes > c->pinned_bytes) {
        cuda_fail_op(c, "moe (cuBLAS): a plan of %zu bytes", plan_bytes);
        return 1;
    }
    memcpy(stage, p.offset.data(), (size_t)n_experts * 4);
    memcpy(stage + idx_bytes, p.padded.data(), (size_t)n_experts * 4);
    memcpy(stage + 2 * idx_bytes, p.count.data(), (size_t)n_experts * 4);
    memcpy(stage + 3 * idx_bytes, ptr.data(), n_ptr * sizeof(void *));
    if (!cuda_check(c, cudaMemcpyAsync(d_offset, stage, plan_bytes, cudaMemcpyHostToDevice, c->stream),
                    "moe (cuBLAS) plan") ||
        !cuda_check(c, cudaEventRecord(c->pinned_free[0], c->stream), "cudaEventRecord"))
        return 1;

    /* gate and up from the tokens' rows, then g = gelu(gate) * up per slot */
    moe_gather_split_kernel<<<p.padded_total, 256, 0, c->stream>>>(xs, x, k, groups->sorted, d_offset, d_padded,
                                                                   d_count, n_experts, (int)d_in, parts, slot_row);
    if (!cuda_launched(c, "moe_gather_split")) return 1;
    if (fused) {
        if (!bucketed_product(c, p, 0, ld_gu, wg, 2 * width)) return 1;
    } else if (!bucketed_product(c, p, 0, ld_gu, wg, width) ||
               !bucketed_product(c, p, 1, ld_gu, wu, width)) {
        return 1;
    }
    moe_scatter_gelu_kernel<<<p.total, 256, 0, c->stream>>>(g, rows, (int)width, groups->sorted, d_offset, d_padded,
                                                            d_count, n_experts, parts);
    if (!cuda_launched(c, "moe_scatter_gelu")) return 1;
    /* down from each slot's own row of g */
    moe_gather_split_kernel<<<p.padded_total, 256, 0, c->stream>>>(xs, g, 1, groups->sorted, d_offset, d_padded,
                                                                   d_count, n_experts, (int)width, parts, NULL);
    if (!cuda_launched(c, "moe_gather_split")) return 1;
    if (!bucketed_product(c, p, 2, (int)d, wd, d)) return 1;
    /* each token's weighted sum of its experts' rows, straight from the product rows */
    dim3 grid(cuda_blocks((size_t)d / 4, 64), (unsigned)n);
    moe_cublas_combine_kernel<<<grid, 64, 0, c->stream>>>(out, rows, (int)d, slot_row, d_count, ids, weights, k,
                                                          n_experts, parts);
    cuda_launched(c, "moe_cublas_combine");
    return 1;
}
