/* The mixture-of-experts block on the GPU: routing (top-k per token by one
 * warp) and the experts, reading only the chosen experts' weights.
 *
 * Each (token, choice) pair is a "slot". Decode-sized batches run a GEMV per
 * slot that picks its expert's rows through the ids on the device. Larger
 * batches sort the slots by expert on the device (no host round trip), then
 * the grouped mma kernel multiplies each expert's rows with bf16 tensor
 * cores (the pipelined grouped kernel of cuda_moe_gemm.cu; other formats
 * and shapes: cuda_mma_gemm, weights dequantised in the tile). gate/up give [slot][width], the
 * GELU-gated product feeds down, and every token sums its k outputs in
 * choice order. */
#include <math.h>

#include "backend/cuda/cuda_moe_route.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

/* ---- routing ---- */

/* route_key, moe_route_token: cuda_moe_route.cuh */
template <int NV>
__global__ void moe_route_kernel(int32_t *ids, float *weights, const float *logits, const float *expert_scale, int n,
                                 int n_experts, int k) {
    pdl_wait();
    pdl_launch_next();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n) return;
    moe_route_token<NV>(ids, weights, logits, expert_scale, t, n_experts, k);
}

void cuda_moe_route(g4_backend *be, int32_t *ids, float *weights, const float *logits, const float *expert_scale,
                    int n, int n_experts, int k) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0 || k <= 0) return;
    if (n_experts > 1024 || k > n_experts || k > 32) {
        cuda_fail_op(c, "moe_route: top-%d of %d experts unsupported (at most 1024 experts, 32 chosen)", k,
                     n_experts);
        return;
    }
    const dim3 grid = cuda_blocks((size_t)n, 4);
    if (n_experts <= 128)
        cuda_launch(c, moe_route_kernel<4>, grid, 128, 0, ids, weights, logits, expert_scale, n, n_experts, k);
    else if (n_experts <= 256)
        cuda_launch(c, moe_route_kernel<8>, grid, 128, 0, ids, weights, logits, expert_scale, n, n_experts, k);
    else
        cuda_launch(c, moe_route_kernel<32>, grid, 128, 0, ids, weights, logits, expert_scale, n, n_experts, k);
    cuda_launched(c, "moe_route");
}

void cuda_moe_route_flush(cuda_ctx *c) {
    if (c->route_job.n <= 0) return;
    const cuda_moe_route_job j = c->route_job;
    c->route_job.n = 0;
    const dim3 grid = cuda_blocks((size_t)j.n, 4);
    cuda_launch(c, moe_route_kernel<4>, grid, 128, 0, j.ids, j.weights, j.logits, j.expert_scale, j.n, j.n_experts,
                j.k);
    cuda_launched(c, "moe_route");
}

/* moe_route then moe_experts; for a decode step's few tokens and up to 128
 * experts the routing rides on the experts' first GEMV pre-pass (an extra
 * block of that grid: one launch fewer a MoE layer). Every GEMV path that
 * does not take it launches it first (cuda_moe_route_flush), so ids are
 * always written before anything reads them. */
void cuda_moe_route_experts(g4_backend *be, float *out, const float *x, int n, int32_t *ids, float *weights,
                            const float *logits, const float *expert_scale, int n_experts, int k,
                            const g4_expert_matrix *gate, const g4_expert_matrix *up, const g4_expert_matrix *down) {
    cuda_ctx *c = cuda_of(be);
    if (n > 0 && n <= 8 && k > 0 && k <= 32 && k <= n_experts && n_experts <= 128) {
        c->route_job = {ids, weights, logits, expert_scale, n, n_experts, k};
    } else {
        cuda_moe_route(be, ids, weights, logits, expert_scale, n, n_experts, k);
    }
    cuda_moe_experts(be, out, x, n, ids, weights, k, gate, up, down);
    cuda_moe_route_flush(c); /* (only if no path took it: an op failure) */
}

/* ---- sorting slots by expert (one block) ---- */

__global__ void moe_sort_kernel(const int32_t *ids, int n_slots, int n_experts, int bm, int32_t *sorted,
                                int32_t *tile_expert, int32_t *tile_start, int32_t *tile_len, int32_t *n_tiles,
                                int32_t *expert_count) {
    extern __shared__ int sh[];
    int *count = sh, *offset = sh + n_experts, *cursor = sh + 2 * n_experts;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) count[e] = cursor[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < n_experts) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, tiles = 0;
        for (int e = 0; e < n_experts; e++) {
            offset[e] = off;
            expert_count[e] = count[e];
            for (int r = 0; r < count[e]; r += bm) {
                tile_expert[tiles] = e;
                tile_start[tiles] = off + r;
                tile_len[tiles] = count[e] - r < bm ? count[e] - r : bm;
                tiles++;
            }
            off += count[e];
        }
        *n_tiles = tiles;
    }
    __syncthreads();
    /* order within an expert is free: each row is computed on its own */
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < n_experts) sorted[offset[e] + atomicAdd(&cursor[e], 1)] = s;
    }
}

/* out[t][:] = sum_j weights[t][j] * y[t*k + j][:] over valid choices, in
 * order. Grid (column blocks, tokens), one column per thread: a token's
 * row is spread over many blocks (one block per token leaves the GPU idle). */
__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *ids, const float *weights, int k,
                                   int n_experts, int d) {
    pdl_wait();
    pdl_launch_next();
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
        const int e = ids[(size_t)t * k + j];
        if (e >= 0 && e < n_experts) acc = fmaf(weights[(size_t)t * k + j], y[((size_t)t * k + j) * d + c], acc);
    }
    out[(size_t)t * d + c] = acc;
}

/* ---- experts ---- */

/* One expert's matrix as the kernels take it: rows of one expert, the
 * stacked tensor's pointers (experts are picked by the ids). */
static g4_matrix one_expert_shape(const g4_expert_matrix *e) {
    g4_matrix m = e->all;
    m.rows = e->rows_per_expert;
    return m;
}

/* Grouped slots for the mma kernel; NULL when shapes do not allow it. */
static int moe_groups(cuda_ctx *c, const int32_t *ids, int n_slots, int n_experts, cuda_groups *g) {
    const int max_tiles = (n_slots + CUDA_MMA_GROUP_BM - 1) / CUDA_MMA_GROUP_BM + n_experts;
    int32_t *buf = (int32_t *)cuda_scratch(c, SCRATCH_MOE_SORT,
                                           ((size_t)n_slots + 3 * (size_t)max_tiles + 1 + (size_t)n_experts) * 4);
    if (!buf) return 0;
    g->sorted = buf;
    g->tile_expert = buf + n_slots;
    g->tile_start = buf + n_slots + max_tiles;
    g->tile_len = buf + n_slots + 2 * max_tiles;
    g->n_tiles = buf + n_slots + 3 * max_tiles;
    g->expert_count = buf + n_slots + 3 * max_tiles + 1;
    g->max_tiles = max_tiles;
    const size_t smem = 3 * (size_t)n_experts * sizeof(int);
    if (smem > 48 * 1024) {
        cuda_fail_op(c, "moe: %d experts exceed the sorter's shared memory", n_experts);
        return 0;
    }
    moe_sort_kernel<<<1, 1024, smem, c->stream>>>(ids, n_slots, n_experts, CUDA_MMA_GROUP_BM, buf,
                                                  (int32_t *)g->tile_expert, (int32_t *)g->tile_start,
                                                  (int32_t *)g->tile_len, (int32_t *)g->n_tiles,
                                                  (int32_t *)g->expert_count);
    return cuda_launched(c, "moe_sort");
}

/* One grouped product of the experts' prefill with the activations already
 * bf16: 4-bit experts in the fast precision on Hopper by the warpgroup GEMM
 * decoding their codes (cuda_wgmma.cu), the others by the pipelined kernel. */
static void experts_product(cuda_ctx *c, float *out, size_t ldo, const __nv_bfloat16 *x_hi, const __nv_bfloat16 *x_lo,
                            int x_div, const g4_matrix *w, int64_t rows, int64_t stride, int64_t offset,
                            const cuda_groups *groups) {
    if (g4_plan_wgmma_q4(&c->caps, &c->tune, w, c->prefill_split))
        cuda_wgmma_q4_grouped(c, out, ldo, x_hi, x_div, w, rows, stride, offset, groups);
    else
        cuda_moe_gemm(c, out, ldo, x_hi, x_lo, x_div, w, rows, stride, offset, groups);
}

void cuda_moe_experts(g4_backend *be, float *out, const float *x, int n, const int32_t *ids, const float *weights,
                      int k, const g4_expert_matrix *gate, const g4_expert_matrix *up, const g4_expert_matrix *down) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    const int64_t width = gate->rows_per_expert, d = down->rows_per_expert, d_in = gate->all.cols;
    const int n_slots = n * k;
    const int E = gate->n_experts;
    if (k <= 0 || up->rows_per_expert != width || down->all.cols != width) {
        cuda_fail_op(c, "moe_experts: inconsistent expert shapes");
        return;
    }
    float *g = (float *)cuda_scratch(c, SCRATCH_MOE_GATE, (size_t)n_slots * width * 4);
    float *u = (float *)cuda_scratch(c, SCRATCH_MOE_UP, (size_t)n_slots * width * 4);
    float *y = (float *)cuda_scratch(c, SCRATCH_MOE_DOWN, (size_t)n_slots * d * 4);
    if (!g || !u || !y) return;
    const g4_matrix wg = one_expert_shape(gate), wu = one_expert_shape(up), wd = one_expert_shape(down);
    cuda_groups groups;
    if (n > 8) cuda_moe_route_flush(c); /* the grouped paths sort the ids first */
    const int grouped = n > 8 && cuda_mma_supported(&wg, x, (size_t)d_in) && cuda_mma_supported(&wu, x, (size_t)d_in) &&
                        cuda_mma_supported(&wd, g, (size_t)width) && moe_groups(c, ids, n_slots, E, &groups);
    const int general = c->tune.moe == G4_CUDA_MOE_MMA; /* (the test hook) */
    const int pipelined = grouped && !general && cuda_moe_gemm_supported(&wg) && cuda_moe_gemm_supported(&wu) &&
                          cuda_moe_gemm_supported(&wd);
    /* bf16 experts from c->tune.moe_cublas tokens on through cuBLAS, the
     * tokens' sums included (unless the general kernel was asked for) */
    if (grouped && !general &&
        cuda_moe_experts_cublas(c, out, g, x, n, ids, weights, k, E, &wg, &wu, &wd, gate->expert_stride,
                                gate->row_offset, up->expert_stride, up->row_offset, down->expert_stride,
                                down->row_offset, &groups))
        return;
    if (pipelined) {
        /* the activations split once per product's input */
        const int parts = c->prefill_split ? 2 : 1;
        const size_t nx = (size_t)n * d_in, ng = (size_t)n_slots * width;
        __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(c, SCRATCH_X_BF16, (nx > ng ? nx : ng) * parts * 2);
        if (!xb) return;
        if (!cuda_split_bf16(c, xb, parts > 1 ? xb + nx : NULL, x, nx)) return;
        experts_product(c, g, (size_t)width, xb, parts > 1 ? xb + nx : NULL, k, &wg, width, gate->expert_stride,
                        gate->row_offset, &groups);
        experts_product(c, u, (size_t)width, xb, parts > 1 ? xb + nx : NULL, k, &wu, width, up->expert_stride,
                        up->row_offset, &groups);
        cuda_launch_gelu_mul(c, g, g, u, ng);
        if (!cuda_split_bf16(c, xb, parts > 1 ? xb + ng : NULL, g, ng)) return;
        experts_product(c, y, (size_t)d, xb, parts > 1 ? xb + ng : NULL, 1, &wd, d, down->expert_stride,
                        down->row_offset, &groups);
    } else if (grouped) {
        cuda_mma_gemm(c, g, (size_t)width, x, (size_t)d_in, k, &wg, width, gate->expert_stride,
                      gate->row_offset, &groups);
        cuda_mma_gemm(c, u, (size_t)width, x, (size_t)d_in, k, &wu, width, up->expert_stride,
                      up->row_offset, &groups);
        cuda_launch_gelu_mul(c, g, g, u, (size_t)n_slots * width);
        cuda_mma_gemm(c, y, (size_t)d, g, (size_t)width, 1, &wd, d, down->expert_stride, down->row_offset,
                      &groups);
    } else {
        /* one GEMV per slot, its expert picked on the device; gate and up rows
         * of one stacked tensor (HF's gate_up_proj) in one launch as pairs */
        const int64_t pair = gate->all.data == up->all.data && gate->expert_stride == up->expert_stride &&
                                     up->row_offset > gate->row_offset
                                 ? up->row_offset - gate->row_offset
                                 : 0;
        if (!(pair > 0 && cuda_gemv(c, g, (size_t)width, x, (size_t)d_in, 1, &wg, ids, n_slots, k,
                                    gate->expert_stride, gate->row_offset, E, NULL, pair))) {
            cuda_gemv(c, u, (size_t)width, x, (size_t)d_in, 1, &wu, ids, n_slots, k, up->expert_stride,
                      up->row_offset, E, NULL, 0);
            /* g = gelu(gate x) * u in the GEMV's epilogue */
            cuda_gemv(c, g, (size_t)width, x, (size_t)d_in, 1, &wg, ids, n_slots, k, gate->expert_stride,
                      gate->row_offset, E, u, 0);
        }
        /* the down projection and the tokens' weighted sums in one launch where a kernel does both */
        if (cuda_gemv_moe_down(c, out, (size_t)d, g, (size_t)width, &wd, ids, weights, n_slots, k,
                               down->expert_stride, down->row_offset, E))
            return;
        cuda_gemv(c, y, (size_t)d, g, (size_t)width, 1, &wd, ids, n_slots, 1, down->expert_stride, down->row_offset,
                  E, NULL, 0);
    }
    dim3 grid(cuda_blocks((size_t)d, 128), (unsigned)n);
    cuda_launch(c, moe_combine_kernel, grid, 128, 0, out, y, ids, weights, k, E, (int)d);
    cuda_launched(c, "moe_combine");
}
