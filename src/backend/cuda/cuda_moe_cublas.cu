/* The MoE experts' prefill products through cuBLAS's grouped GEMM, for
 * bf16 experts (G4_CUDA_MOE_CUBLAS=1).
 *
 * Why: at 512 tokens the 26B-A4B's 128 experts get ~32 slots each, and our
 * grouped kernel (cuda_moe_gemm.cu) multiplies them at ~50 TFLOP/s of useful
 * work where cuBLAS runs a plain product at ~650. Here one grouped call per
 * projection does every expert's product with the operands swapped: M =
 * the expert's weight rows, N = its slots, K = the input width.
 *
 * Each expert's activation rows are gathered in slot order (the order
 * cuda_moe's sorter gives: expert 0's slots, then 1's, ...) and split into
 * bf16 hi and lo on the way, an expert's hi rows then its lo rows, so that
 * one product per expert covers both parts (N = 2 x its slots). The
 * float32 results of the two parts are added as they are written back in
 * slot order: the same sums as cuda_matmul's two products.
 *
 * cuBLAS takes the group sizes on the host: the experts' slot counts come
 * back once per call (a stream synchronisation), so this path never runs
 * inside a graph capture. The pointer arrays are built on the device. */
#include <vector>

#include "backend/cuda/cuda_formats.cuh"
#include "backend/cuda/cuda_internal.cuh"

/* the expert holding sorted row i: the last e with offset[e] <= i */
__device__ __forceinline__ int expert_of_row(const int32_t *offset, int n_experts, int i) {
    int lo = 0, hi = n_experts - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (offset[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Row i of the sorted slots (one block per row): its source row
 * src[sorted[i] / src_div] as bf16 hi at dst row 2 offset[e] + j and, with
 * parts 2, lo at dst row 2 offset[e] + count[e] + j (j = i - offset[e]). */
__global__ void moe_gather_split_kernel(__nv_bfloat16 *dst, const float *src, int src_div, const int32_t *sorted,
                                        const int32_t *offset, const int32_t *count, int n_experts, int K, int parts) {
    const int i = blockIdx.x;
    const int e = expert_of_row(offset, n_experts, i);
    const int j = i - offset[e];
    const float *s = src + (size_t)(sorted[i] / src_div) * K;
    __nv_bfloat16 *hi = dst + ((size_t)parts * offset[e] + j) * K;
    __nv_bfloat16 *lo = hi + (size_t)count[e] * K;
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        const float v = s[c];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[c] = h;
        if (parts > 1) lo[c] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

/* out[sorted[i]][:] = the hi row's sums + the lo row's (as gathered above) */
__global__ void moe_scatter_sum_kernel(float *out, const float *rows, const int32_t *sorted, const int32_t *offset,
                                       const int32_t *count, int n_experts, int N, int parts) {
    const int i = blockIdx.x;
    const int e = expert_of_row(offset, n_experts, i);
    const int j = i - offset[e];
    const float *hi = rows + ((size_t)parts * offset[e] + j) * N;
    const float *lo = hi + (size_t)count[e] * N;
    float *o = out + (size_t)sorted[i] * N;
    for (int c = threadIdx.x; c < N; c += blockDim.x) o[c] = parts > 1 ? hi[c] + lo[c] : hi[c];
}

/* (one thread) each expert's first sorted row: offset[e] = count[0] + ... + count[e - 1] */
__global__ void moe_offsets_kernel(const int32_t *count, int n_experts, int32_t *offset) {
    int off = 0;
    for (int e = 0; e < n_experts; e++) offset[e] = off, off += count[e];
}

/* (one thread) the grouped call's pointer arrays, for the experts with
 * slots in expert order (as the host lists their sizes) */
__global__ void moe_grouped_pointers_kernel(const int32_t *count, const int32_t *offset, int n_experts, int parts,
                                            const uint8_t *w, size_t row_bytes, int64_t stride, int64_t row_offset,
                                            const __nv_bfloat16 *xs, int K, float *rows, int N, const void **a,
                                            const void **b, void **c) {
    int j = 0;
    for (int e = 0; e < n_experts; e++) {
        if (count[e] == 0) continue;
        a[j] = w + (size_t)((int64_t)e * stride + row_offset) * row_bytes;
        b[j] = xs + (size_t)parts * offset[e] * K;
        c[j] = rows + (size_t)parts * offset[e] * N;
        j++;
    }
}

/* What one call needs on the host and the device. */
struct grouped_plan {
    int n_experts, parts, groups;
    std::vector<int> count; /* per expert */
    const int32_t *d_count, *d_offset;
    const void **d_a, **d_b;
    void **d_c;
};

/* rows[2 offset[e] + r][:] = W_e x_e for every expert with slots: one grouped
 * cuBLAS call; xs holds the gathered rows (K wide), W_e = rows [e stride +
 * row_offset, + N) of w. */
static int grouped_product(cuda_ctx *c, const grouped_plan &p, float *rows, const __nv_bfloat16 *xs, const g4_matrix *w,
                           int64_t N, int64_t stride, int64_t row_offset) {
    const int K = (int)w->cols, lda = (int)(w->row_bytes / 2);
    std::vector<cublasOperation_t> ta, tb;
    std::vector<int> m, n, k, ld_a, ld_b, ld_c, size;
    std::vector<float> alpha, beta;
    for (int e = 0; e < p.n_experts; e++) {
        if (p.count[e] == 0) continue;
        ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N);
        m.push_back((int)N), n.push_back(p.parts * p.count[e]), k.push_back(K);
        ld_a.push_back(lda), ld_b.push_back(K), ld_c.push_back((int)N), size.push_back(1);
        alpha.push_back(1.0f), beta.push_back(0.0f);
    }
    /* the pointers are built on the device (no host-to-device copy, which
     * from pageable memory would wait for the stream) */
    moe_grouped_pointers_kernel<<<1, 1, 0, c->stream>>>(p.d_count, p.d_offset, p.n_experts, p.parts,
                                                       (const uint8_t *)w->data, w->row_bytes, stride, row_offset, xs,
                                                       K, rows, (int)N, p.d_a, p.d_b, p.d_c);
    if (!cuda_launched(c, "moe_grouped_pointers")) return 0;
    return cuda_check_blas(c,
                           c->blas_api->gemm_grouped(c->blas, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                                     alpha.data(), p.d_a, CUDA_R_16BF, ld_a.data(), p.d_b, CUDA_R_16BF,
                                                     ld_b.data(), beta.data(), p.d_c, CUDA_R_32F, ld_c.data(),
                                                     (int)m.size(), size.data(), CUBLAS_COMPUTE_32F),
                           "cublasGemmGroupedBatchedEx");
}

int cuda_moe_experts_cublas(cuda_ctx *c, float *g, float *u, float *y, const float *x, int n, int k, int n_experts,
                            const g4_matrix *wg, const g4_matrix *wu, const g4_matrix *wd, int64_t gate_stride,
                            int64_t gate_offset, int64_t up_stride, int64_t up_offset, int64_t down_stride,
                            int64_t down_offset, const cuda_groups *groups) {
    if (!c->blas_api->gemm_grouped) return 0;
    const g4_matrix *ws[3] = {wg, wu, wd};
    for (const g4_matrix *w : ws)
        if (fast_format_of(w) != FF_BF16 || w->row_bytes % 2 || w->cols > INT32_MAX || w->rows > INT32_MAX) return 0;
    cudaStreamCaptureStatus capture;
    if (cudaStreamIsCapturing(c->stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return 0;

    const int n_slots = n * k, parts = c->prefill_split ? 2 : 1;
    const int64_t width = wg->rows, d = wd->rows, d_in = wg->cols;
    const int64_t widest_in = d_in > width ? d_in : width, widest_out = width > d ? width : d;
    grouped_plan p;
    p.n_experts = n_experts;
    p.parts = parts;
    p.count.resize(n_experts);
    /* device: gathered rows (bf16), product rows (float32), offsets and the pointer arrays */
    /* (each region starts 256-byte aligned) */
    const size_t xs_bytes = ((size_t)parts * n_slots * widest_in * 2 + 255) / 256 * 256;
    const size_t rows_bytes = ((size_t)parts * n_slots * widest_out * 4 + 255) / 256 * 256;
    const size_t ptr_bytes = ((size_t)n_experts * sizeof(void *) + 255) / 256 * 256;
    uint8_t *buf = (uint8_t *)cuda_scratch(c, SCRATCH_MOE_GROUPED, xs_bytes + rows_bytes + 3 * ptr_bytes +
                                                                        (size_t)n_experts * 4 + 256);
    if (!buf) return 1; /* (a sticky failure: the forward pass reports it) */
    __nv_bfloat16 *xs = (__nv_bfloat16 *)buf;
    float *rows = (float *)(buf + xs_bytes);
    p.d_a = (const void **)(buf + xs_bytes + rows_bytes);
    p.d_b = (const void **)(buf + xs_bytes + rows_bytes + ptr_bytes);
    p.d_c = (void **)(buf + xs_bytes + rows_bytes + 2 * ptr_bytes);
    int32_t *d_offset = (int32_t *)(buf + xs_bytes + rows_bytes + 3 * ptr_bytes);
    p.d_count = groups->expert_count;
    p.d_offset = d_offset;

    /* the experts' slot counts, on the host */
    if (!cuda_check(c, cudaMemcpyAsync(p.count.data(), groups->expert_count, (size_t)n_experts * 4,
                                       cudaMemcpyDeviceToHost, c->stream),
                    "expert counts") ||
        !cuda_check(c, cudaStreamSynchronize(c->stream), "expert counts"))
        return 1;
    /* (slots of invalid ids are not sorted: their rows stay unwritten, and
     * the combine skips them) */
    int total = 0;
    for (int e = 0; e < n_experts; e++) total += p.count[e];
    if (total > n_slots) {
        cuda_fail_op(c, "moe (cuBLAS): %d sorted slots of %d", total, n_slots);
        return 1;
    }
    if (total == 0) return 1;
    moe_offsets_kernel<<<1, 1, 0, c->stream>>>(p.d_count, n_experts, d_offset);
    if (!cuda_launched(c, "moe_offsets")) return 1;

    /* gate and up from the tokens' rows, then g = gelu(gate) * up */
    moe_gather_split_kernel<<<total, 256, 0, c->stream>>>(xs, x, k, groups->sorted, p.d_offset, p.d_count,
                                                            n_experts, (int)d_in, parts);
    if (!cuda_launched(c, "moe_gather_split")) return 1;
    if (!grouped_product(c, p, rows, xs, wg, width, gate_stride, gate_offset)) return 1;
    moe_scatter_sum_kernel<<<total, 256, 0, c->stream>>>(g, rows, groups->sorted, p.d_offset, p.d_count, n_experts,
                                                           (int)width, parts);
    if (!cuda_launched(c, "moe_scatter_sum")) return 1;
    if (!grouped_product(c, p, rows, xs, wu, width, up_stride, up_offset)) return 1;
    moe_scatter_sum_kernel<<<total, 256, 0, c->stream>>>(u, rows, groups->sorted, p.d_offset, p.d_count, n_experts,
                                                           (int)width, parts);
    if (!cuda_launched(c, "moe_scatter_sum")) return 1;
    cuda_launch_gelu_mul(c, g, g, u, (size_t)n_slots * width);
    /* down from each slot's own row of g */
    moe_gather_split_kernel<<<total, 256, 0, c->stream>>>(xs, g, 1, groups->sorted, p.d_offset, p.d_count,
                                                            n_experts, (int)width, parts);
    if (!cuda_launched(c, "moe_gather_split")) return 1;
    if (!grouped_product(c, p, rows, xs, wd, d, down_stride, down_offset)) return 1;
    moe_scatter_sum_kernel<<<total, 256, 0, c->stream>>>(y, rows, groups->sorted, p.d_offset, p.d_count, n_experts,
                                                           (int)d, parts);
    cuda_launched(c, "moe_scatter_sum");
    return 1;
}
