/* Elementwise ops, RMSNorm, RoPE, embeddings and the vision helpers.
 *
 * These follow the CPU reference's arithmetic step by step (explicit
 * round-to-nearest multiplies and adds where the host compiler does not fuse,
 * double sums for RMSNorm and pooling, RoPE frequencies computed on the host
 * exactly as there), so results agree to a few ulp; only tanh/sin/cos come
 * from CUDA's libdevice (within 2 ulp). */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_norm_rope.cuh"

#define THREADS 256

/* ---- elementwise ---- */


__global__ void gelu_mul_kernel(float *out, const float *gate, const float *up, size_t n) {
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __fmul_rn(gelu_tanh(gate[i]), up[i]);
}

enum binary_op { OP_ADD, OP_MUL };

template <int OP>
__global__ void binary_kernel(float *out, const float *a, const float *b, size_t n) {
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = OP == OP_ADD ? __fadd_rn(a[i], b[i]) : __fmul_rn(a[i], b[i]);
}

template <int OP>
__global__ void rows_kernel(float *out, const float *a, const float *v, size_t n, int dim) {
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float w = v[i % (size_t)dim];
        out[i] = OP == OP_ADD ? __fadd_rn(a[i], w) : __fmul_rn(a[i], w);
    }
}

__global__ void affine_kernel(float *out, const float *a, float s, float b, size_t n) {
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(__fmul_rn(a[i], s), b);
}

__global__ void clamp_kernel(float *out, const float *x, size_t n, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        /* torch.clamp: max first, then min */
        float v = x[i] < lo ? lo : x[i];
        out[i] = v > hi ? hi : v;
    }
}

__global__ void softcap_kernel(float *x, size_t n, float cap) {
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(cap, tanhf(__fdiv_rn(x[i], cap)));
}

static unsigned grid_for(size_t n) {
    unsigned b = cuda_blocks(n, THREADS);
    return b > 65536u ? 65536u : b;
}

/* out[t][r] = gelu_tanh(both[t][r]) * both[t][F + r] */
__global__ void gated_rows_kernel(float *out, const float *both, size_t n, int64_t F) {
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)F, r = i % (size_t)F;
        const float *row = both + t * 2 * (size_t)F;
        out[i] = __fmul_rn(gelu_tanh(row[r]), row[F + r]);
    }
}

void cuda_launch_gated_rows(cuda_ctx *c, float *out, const float *both, int n_tokens, int64_t F) {
    const size_t n = (size_t)n_tokens * (size_t)F;
    if (!n) return;
    cuda_launch(c, gated_rows_kernel, grid_for(n), THREADS, 0, out, both, n, F);
    cuda_launched(c, "gated_rows");
}

void cuda_launch_gelu_mul(cuda_ctx *c, float *out, const float *gate, const float *up, size_t n) {
    if (!n) return;
    cuda_launch(c, gelu_mul_kernel, grid_for(n), THREADS, 0, out, gate, up, n);
    cuda_launched(c, "gelu_mul");
}

void cuda_gelu_mul(g4_backend *be, float *out, const float *gate, const float *up, size_t n) {
    cuda_launch_gelu_mul(cuda_of(be), out, gate, up, n);
}

void cuda_add(g4_backend *be, float *out, const float *a, const float *b, size_t n) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    cuda_launch(c, binary_kernel<OP_ADD>, grid_for(n), THREADS, 0, out, a, b, n);
    cuda_launched(c, "add");
}

void cuda_mul(g4_backend *be, float *out, const float *a, const float *b, size_t n) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    cuda_launch(c, binary_kernel<OP_MUL>, grid_for(n), THREADS, 0, out, a, b, n);
    cuda_launched(c, "mul");
}

void cuda_scale(g4_backend *be, float *out, const float *a, float s, size_t n) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    cuda_launch(c, affine_kernel, grid_for(n), THREADS, 0, out, a, s, 0.0f, n);
    cuda_launched(c, "scale");
}

void cuda_affine(g4_backend *be, float *out, const float *a, float s, float b, size_t n) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    cuda_launch(c, affine_kernel, grid_for(n), THREADS, 0, out, a, s, b, n);
    cuda_launched(c, "affine");
}

void cuda_mul_rows(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim) {
    cuda_ctx *c = cuda_of(be);
    size_t n = (size_t)rows * (size_t)dim;
    if (!n) return;
    cuda_launch(c, rows_kernel<OP_MUL>, grid_for(n), THREADS, 0, out, a, v, n, dim);
    cuda_launched(c, "mul_rows");
}

void cuda_add_rows(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim) {
    cuda_ctx *c = cuda_of(be);
    size_t n = (size_t)rows * (size_t)dim;
    if (!n) return;
    cuda_launch(c, rows_kernel<OP_ADD>, grid_for(n), THREADS, 0, out, a, v, n, dim);
    cuda_launched(c, "add_rows");
}

void cuda_clamp(g4_backend *be, float *out, const float *x, float lo, float hi, size_t n) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    clamp_kernel<<<grid_for(n), THREADS, 0, c->stream>>>(out, x, n, lo, hi);
    cuda_launched(c, "clamp");
}

void cuda_softcap(g4_backend *be, float *x, size_t n, float cap) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    cuda_launch(c, softcap_kernel, grid_for(n), THREADS, 0, x, n, cap);
    cuda_launched(c, "softcap");
}

/* ---- row moves ---- */

/* dst[dst_row(i)][:] = src[src_row(i)][:]; NULL index lists mean i itself. */
__global__ void move_rows_kernel(float *dst, size_t dst_stride, const int32_t *dst_rows, const float *src,
                                 size_t src_stride, const int32_t *src_rows, int cols) {
    pdl_wait();
    const int i = blockIdx.x;
    const size_t d = dst_rows ? (size_t)dst_rows[i] : (size_t)i;
    const size_t s = src_rows ? (size_t)src_rows[i] : (size_t)i;
    float *o = dst + d * dst_stride;
    const float *x = src + s * src_stride;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = x[c];
}

static void move_rows(cuda_ctx *c, float *dst, size_t dst_stride, const int32_t *dst_rows, const float *src,
                      size_t src_stride, const int32_t *src_rows, int n, int cols, const char *what) {
    if (n <= 0 || cols <= 0) return;
    cuda_launch(c, move_rows_kernel, n, cols >= 256 ? 256 : 128, 0, dst, dst_stride, dst_rows, src, src_stride,
                                                                   src_rows, cols);
    cuda_launched(c, what);
}

void cuda_gather_rows(g4_backend *be, float *dst, const float *src, const int32_t *rows, int n, int dim) {
    move_rows(cuda_of(be), dst, (size_t)dim, NULL, src, (size_t)dim, rows, n, dim, "gather_rows");
}

void cuda_scatter_rows(g4_backend *be, float *dst, const int32_t *rows, const float *src, int n, int dim) {
    move_rows(cuda_of(be), dst, (size_t)dim, rows, src, (size_t)dim, NULL, n, dim, "scatter_rows");
}

void cuda_copy_rows(g4_backend *be, float *dst, int dst_stride, const float *src, int src_stride, int rows, int cols) {
    cuda_ctx *c = cuda_of(be);
    if (rows <= 0 || cols <= 0) return;
    cuda_check(c,
               cudaMemcpy2DAsync(dst, (size_t)dst_stride * 4, src, (size_t)src_stride * 4, (size_t)cols * 4,
                                 (size_t)rows, cudaMemcpyDeviceToDevice, c->stream),
               "copy_rows");
}

/* ---- RMSNorm ---- */

/* block_inv_rms_of, block_inv_rms: cuda_norm_rope.cuh */

/* One block per row, rows longer than NORM_ROW_MAX_PER_THREAD values per
 * thread (the register kernels below take the rest). */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps) {
    pdl_wait();
    const size_t r = blockIdx.x;
    const float *xr = x + r * (size_t)dim;
    float *yr = out + r * (size_t)dim;
    const float inv = block_inv_rms(xr, dim, eps);
    if (w)
        for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
    else
        for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = __fmul_rn(xr[i], inv);
}

/* h = (h + rmsnorm(x) * w) * scale, then next = rmsnorm(h) * next_w when
 * next is not NULL; one block per row, the same block size as
 * rmsnorm_kernel (so the same sums). */
__global__ void add_rmsnorm_kernel(float *h, const float *x, const float *w, int dim, float eps, float scale,
                                   float *next, const float *next_w) {
    pdl_wait();
    const size_t r = blockIdx.x;
    const float *xr = x + r * (size_t)dim;
    float *hr = h + r * (size_t)dim;
    const float inv = block_inv_rms(xr, dim, eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = __fadd_rn(hr[i], __fmul_rn(__fmul_rn(xr[i], inv), w[i]));
        hr[i] = scale != 1.0f ? __fmul_rn(v, scale) : v;
    }
    if (!next) return;
    __syncthreads(); /* the whole new row of h before its norm */
    const float inv_h = block_inv_rms(hr, dim, eps);
    float *nr = next + r * (size_t)dim;
    if (next_w)
        for (int i = threadIdx.x; i < dim; i += blockDim.x) nr[i] = __fmul_rn(__fmul_rn(hr[i], inv_h), next_w[i]);
    else
        for (int i = threadIdx.x; i < dim; i += blockDim.x) nr[i] = __fmul_rn(hr[i], inv_h);
}

/* The same two kernels with the row held in registers (PER values per
 * thread): every load is issued at the start, one memory round trip instead
 * of one per pass, the same sums in the same order (identical results).
 * Decode runs a few of these per layer on one row each, so their latency is
 * what counts. */
#define NORM_ROW_MAX_PER_THREAD 16

/* out = rmsnorm(x) * w, and when out2 is not NULL also out2 = rmsnorm(x) * w2
 * (two weights on one norm: one launch) */
template <int PER>
__global__ void rmsnorm_row_kernel(float *out, const float *x, const float *w, int dim, float eps, float *out2,
                                   const float *w2) {
    pdl_wait();
    pdl_launch_next();
    const size_t r = blockIdx.x;
    const float *xr = x + r * (size_t)dim;
    float xv[PER], wv[PER], wv2[PER];
    double ss = 0;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        xv[k] = i < dim ? xr[i] : 0.0f;
        wv[k] = w && i < dim ? w[i] : 1.0f;
        wv2[k] = out2 && w2 && i < dim ? w2[i] : 1.0f;
    }
#pragma unroll
    for (int k = 0; k < PER; k++)
        if (threadIdx.x + k * blockDim.x < dim) ss += (double)xv[k] * (double)xv[k];
    const float inv = block_inv_rms_of(ss, dim, eps);
    float *yr = out + r * (size_t)dim, *yr2 = out2 ? out2 + r * (size_t)dim : NULL;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i >= dim) continue;
        const float y = __fmul_rn(xv[k], inv);
        yr[i] = w ? __fmul_rn(y, wv[k]) : y;
        if (yr2) yr2[i] = w2 ? __fmul_rn(y, wv2[k]) : y;
    }
}

/* returns rmsnorm(h)'s factor when nr is not NULL (else 0) */
template <int PER>
__device__ __forceinline__ float add_rmsnorm_regs(float (&hv)[PER], const float (&xv)[PER], const float (&wv)[PER],
                                                 const float (&nw)[PER], bool next_weighted, float *hr, float *nr,
                                                 int dim, float eps, float scale) {
    double ss = 0;
#pragma unroll
    for (int k = 0; k < PER; k++)
        if (threadIdx.x + k * blockDim.x < dim) ss += (double)xv[k] * (double)xv[k];
    const float inv = block_inv_rms_of(ss, dim, eps);
    double ss_h = 0;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        const float v = __fadd_rn(hv[k], __fmul_rn(__fmul_rn(xv[k], inv), wv[k]));
        hv[k] = scale != 1.0f ? __fmul_rn(v, scale) : v;
        if (i < dim) {
            hr[i] = hv[k];
            ss_h += (double)hv[k] * (double)hv[k];
        }
    }
    if (!nr) return 0.0f;
    const float inv_h = block_inv_rms_of(ss_h, dim, eps);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < dim) nr[i] = next_weighted ? __fmul_rn(__fmul_rn(hv[k], inv_h), nw[k]) : __fmul_rn(hv[k], inv_h);
    }
    return inv_h;
}

/* A residual step's row into registers (PER values per thread): the branch
 * output x, the residual h, the post-norm's weight w and the next norm's nw
 * (1 where there is none) */
template <int PER>
__device__ __forceinline__ void load_residual_row(float (&xv)[PER], float (&hv)[PER], float (&wv)[PER],
                                                  float (&nw)[PER], const float *xr, const float *hr, const float *w,
                                                  const float *next_w, int dim) {
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        const bool in = i < dim;
        xv[k] = in ? xr[i] : 0.0f;
        hv[k] = in ? hr[i] : 0.0f;
        wv[k] = in ? w[i] : 0.0f;
        nw[k] = in && next_w ? next_w[i] : 1.0f;
    }
}

template <int PER>
__global__ void add_rmsnorm_row_kernel(float *h, const float *x, const float *w, int dim, float eps, float scale,
                                       float *next, const float *next_w) {
    pdl_wait();
    pdl_launch_next();
    const size_t r = blockIdx.x;
    const float *xr = x + r * (size_t)dim;
    float *hr = h + r * (size_t)dim;
    float xv[PER], hv[PER], wv[PER], nw[PER];
    load_residual_row<PER>(xv, hv, wv, nw, xr, hr, w, next_w, dim);
    add_rmsnorm_regs<PER>(hv, xv, wv, nw, next_w != NULL, hr, next ? next + r * (size_t)dim : NULL, dim, eps, scale);
}

/* add_rmsnorm_row_kernel (scale 1, a next norm) and then rmsnorm_row_kernel
 * with two weights on the new h, in one launch (g4_backend_ops.
 * add_rmsnorm_moe): the same threads and sums, so the same bits. */
template <int PER>
__global__ void __launch_bounds__(512) add_rmsnorm_moe_row_kernel(float *h, const float *x, const float *w, int dim,
                                                                  float eps, float *out, const float *w_out,
                                                                  float *out2, const float *w2, float *out3,
                                                                  const float *w3) {
    pdl_wait();
    pdl_launch_next();
    const size_t r = blockIdx.x;
    const float *xr = x + r * (size_t)dim;
    float *hr = h + r * (size_t)dim;
    float xv[PER], hv[PER], wv[PER], nw[PER], v2[PER], v3[PER];
    load_residual_row<PER>(xv, hv, wv, nw, xr, hr, w, w_out, dim);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v2[k] = i < dim && w2 ? w2[i] : 1.0f;
        v3[k] = i < dim && w3 ? w3[i] : 1.0f;
    }
    const float inv_h = add_rmsnorm_regs<PER>(hv, xv, wv, nw, w_out != NULL, hr, out + r * (size_t)dim, dim, eps, 1.0f);
    float *o2 = out2 + r * (size_t)dim, *o3 = out3 + r * (size_t)dim;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i >= dim) continue;
        const float y = __fmul_rn(hv[k], inv_h);
        o2[i] = w2 ? __fmul_rn(y, v2[k]) : y;
        o3[i] = w3 ? __fmul_rn(y, v3[k]) : y;
    }
}

/* The end of a MoE layer's feed-forward block in one launch (see
 * g4_backend_ops.moe_residual): the dense branch's norm, the experts' norm
 * added to it, then the residual step; each rounding as rmsnorm_row_kernel
 * then add_rmsnorm_row_kernel twice. */
template <int PER>
__global__ void moe_residual_row_kernel(float *h, float *dense, const float *w_dense, const float *experts,
                                        const float *w_experts, const float *w_post, int dim, float eps, float scale,
                                        float *next, const float *next_w) {
    pdl_wait();
    pdl_launch_next();
    const size_t r = blockIdx.x;
    const float *er = experts + r * (size_t)dim;
    float *dr = dense + r * (size_t)dim, *hr = h + r * (size_t)dim;
    float dv[PER], ev[PER], hv[PER], wd[PER], we[PER], wp[PER], nw[PER], ones[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        const bool in = i < dim;
        dv[k] = in ? dr[i] : 0.0f;
        ev[k] = in ? er[i] : 0.0f;
        hv[k] = in ? hr[i] : 0.0f;
        wd[k] = in ? w_dense[i] : 0.0f;
        we[k] = in ? w_experts[i] : 0.0f;
        wp[k] = in ? w_post[i] : 0.0f;
        nw[k] = in && next_w ? next_w[i] : 1.0f;
        ones[k] = 1.0f;
    }
    double ss = 0;
#pragma unroll
    for (int k = 0; k < PER; k++)
        if (threadIdx.x + k * blockDim.x < dim) ss += (double)dv[k] * (double)dv[k];
    const float inv = block_inv_rms_of(ss, dim, eps);
#pragma unroll
    for (int k = 0; k < PER; k++) dv[k] = __fmul_rn(__fmul_rn(dv[k], inv), wd[k]); /* the dense branch normed */
    add_rmsnorm_regs<PER>(dv, ev, we, ones, false, dr, NULL, dim, eps, 1.0f);
    add_rmsnorm_regs<PER>(hv, dv, wp, nw, next_w != NULL, hr, next ? next + r * (size_t)dim : NULL, dim, eps, scale);
}

static int norm_threads(int dim) { return dim >= 2048 ? 512 : dim >= 512 ? 256 : dim >= 128 ? 128 : 32; }

static void rmsnorm_rows(cuda_ctx *c, float *out, const float *x, const float *w, int rows, int dim, float eps,
                         float *out2, const float *w2) {
    const int threads = norm_threads(dim), per = (dim + threads - 1) / threads;
    if (per <= 4)
        cuda_launch(c, rmsnorm_row_kernel<4>, rows, threads, 0, out, x, w, dim, eps, out2, w2);
    else if (per <= 8)
        cuda_launch(c, rmsnorm_row_kernel<8>, rows, threads, 0, out, x, w, dim, eps, out2, w2);
    else if (per <= NORM_ROW_MAX_PER_THREAD)
        cuda_launch(c, rmsnorm_row_kernel<NORM_ROW_MAX_PER_THREAD>, rows, threads, 0, out, x, w, dim, eps, out2, w2);
    else {
        cuda_launch(c, rmsnorm_kernel, rows, threads, 0, out, x, w, dim, eps);
        if (out2) cuda_launch(c, rmsnorm_kernel, rows, threads, 0, out2, x, w2, dim, eps);
    }
    cuda_launched(c, "rmsnorm");
}

void cuda_rmsnorm(g4_backend *be, float *out, const float *x, const float *w, int rows, int dim, float eps) {
    if (rows <= 0 || dim <= 0) return;
    rmsnorm_rows(cuda_of(be), out, x, w, rows, dim, eps, NULL, NULL);
}

void cuda_rmsnorm_pair(g4_backend *be, float *out, const float *w, float *out2, const float *w2, const float *x,
                       int rows, int dim, float eps) {
    if (rows <= 0 || dim <= 0) return;
    rmsnorm_rows(cuda_of(be), out, x, w, rows, dim, eps, out2, w2);
}

void cuda_add_rmsnorm(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                      float scale, float *next_out, const float *next_w) {
    cuda_ctx *c = cuda_of(be);
    if (rows <= 0 || dim <= 0) return;
    const int threads = norm_threads(dim), per = (dim + threads - 1) / threads;
    if (per <= 4)
        cuda_launch(c, add_rmsnorm_row_kernel<4>, rows, threads, 0, h, x, w, dim, eps, scale, next_out, next_w);
    else if (per <= 8)
        cuda_launch(c, add_rmsnorm_row_kernel<8>, rows, threads, 0, h, x, w, dim, eps, scale, next_out, next_w);
    else if (per <= NORM_ROW_MAX_PER_THREAD)
        cuda_launch(c, add_rmsnorm_row_kernel<NORM_ROW_MAX_PER_THREAD>, rows, threads, 0, h, x, w, dim, eps, scale,
                    next_out, next_w);
    else
        cuda_launch(c, add_rmsnorm_kernel, rows, threads, 0, h, x, w, dim, eps, scale, next_out, next_w);
    cuda_launched(c, "add_rmsnorm");
}

void cuda_add_rmsnorm_moe(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                          float *out, const float *w_out, float *out2, const float *w2, float *out3, const float *w3) {
    cuda_ctx *c = cuda_of(be);
    if (rows <= 0 || dim <= 0) return;
    const int threads = norm_threads(dim), per = (dim + threads - 1) / threads;
    if (per > 8) { /* the two steps one by one */
        cuda_add_rmsnorm(be, h, x, w, rows, dim, eps, 1.0f, out, w_out);
        cuda_rmsnorm_pair(be, out2, w2, out3, w3, h, rows, dim, eps);
        return;
    }
    if (per <= 4)
        cuda_launch(c, add_rmsnorm_moe_row_kernel<4>, rows, threads, 0, h, x, w, dim, eps, out, w_out, out2, w2, out3,
                    w3);
    else
        cuda_launch(c, add_rmsnorm_moe_row_kernel<8>, rows, threads, 0, h, x, w, dim, eps, out, w_out, out2, w2, out3,
                    w3);
    cuda_launched(c, "add_rmsnorm_moe");
}

void cuda_moe_residual(g4_backend *be, float *h, float *dense, const float *w_dense, const float *experts,
                       const float *w_experts, const float *w_post, int rows, int dim, float eps, float scale,
                       float *next_out, const float *next_w) {
    cuda_ctx *c = cuda_of(be);
    if (rows <= 0 || dim <= 0) return;
    const int threads = norm_threads(dim), per = (dim + threads - 1) / threads;
    if (per > 8) { /* the three steps one by one */
        cuda_rmsnorm(be, dense, dense, w_dense, rows, dim, eps);
        cuda_add_rmsnorm(be, dense, experts, w_experts, rows, dim, eps, 1.0f, NULL, NULL);
        cuda_add_rmsnorm(be, h, dense, w_post, rows, dim, eps, scale, next_out, next_w);
        return;
    }
    if (per <= 4)
        cuda_launch(c, moe_residual_row_kernel<4>, rows, threads, 0, h, dense, w_dense, experts, w_experts, w_post, dim,
                    eps, scale, next_out, next_w);
    else
        cuda_launch(c, moe_residual_row_kernel<8>, rows, threads, 0, h, dense, w_dense, experts, w_experts, w_post, dim,
                    eps, scale, next_out, next_w);
    cuda_launched(c, "moe_residual");
}

/* ---- RoPE ---- */

/* ROPE_MAX_PAIRS, rope_freqs: cuda_norm_rope.cuh */

/* One block per token: cos/sin of its angles once, then every head. x is
 * [n][n_heads][head_dim] with the rotated part of head h at
 * h*head_dim + offset (offset/half select one axis of 2-D RoPE). */
__global__ void rope_kernel(float *x, int n_heads, int head_dim, int half, int offset, int n_pairs,
                            const int32_t *pos, int pos_stride, rope_freqs f) {
    __shared__ float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
    const int t = blockIdx.x;
    const float p = (float)pos[(size_t)t * pos_stride];
    for (int j = threadIdx.x; j < n_pairs; j += blockDim.x) {
        float angle = __fmul_rn(p, f.inv_freq[j]);
        cs[j] = cosf(angle);
        sn[j] = sinf(angle);
    }
    __syncthreads();
    float *xt = x + (size_t)t * n_heads * head_dim + offset;
    for (int i = threadIdx.x; i < n_heads * n_pairs; i += blockDim.x) {
        const int h = i / n_pairs, j = i % n_pairs;
        float *v = xt + (size_t)h * head_dim;
        float a = v[j], b = v[j + half];
        v[j] = __fsub_rn(__fmul_rn(a, cs[j]), __fmul_rn(b, sn[j]));
        v[j + half] = __fadd_rn(__fmul_rn(b, cs[j]), __fmul_rn(a, sn[j]));
    }
}

void cuda_rope(g4_backend *be, float *x, int n_tokens, int n_heads, int head_dim, const int32_t *pos, float theta,
               int n_pairs) {
    cuda_ctx *c = cuda_of(be);
    const int half = head_dim / 2;
    if (n_pairs > half) n_pairs = half;
    if (n_tokens <= 0 || n_pairs <= 0 || n_heads <= 0) return;
    if (n_pairs > ROPE_MAX_PAIRS) {
        cuda_fail_op(c, "rope: %d frequency pairs exceed the supported %d", n_pairs, ROPE_MAX_PAIRS);
        return;
    }
    const rope_freqs f = rope_freqs_of(theta, head_dim, n_pairs);
    rope_kernel<<<n_tokens, 128, 0, c->stream>>>(x, n_heads, head_dim, half, 0, n_pairs, pos, 1, f);
    cuda_launched(c, "rope");
}

/* One block per (token, head): the head's RMS, then each thread normalises
 * and rotates its pairs (j, j + half), rounding as rmsnorm_kernel then
 * rope_kernel do. */
__global__ void rmsnorm_rope_kernel(float *x, const float *w, int n_heads, int head_dim, int n_pairs, float eps,
                                    const int32_t *pos, rope_freqs f) {
    pdl_wait();
    pdl_launch_next();
    const int t = blockIdx.x, h = blockIdx.y;
    float *v = x + ((size_t)t * n_heads + h) * head_dim;
    const float inv = block_inv_rms(v, head_dim, eps);
    norm_rope_head(v, v, w, inv, head_dim, n_pairs, (float)pos[t], f);
}

void cuda_rmsnorm_rope(g4_backend *be, float *x, const float *w, int n_tokens, int n_heads, int head_dim,
                       const int32_t *pos, float theta, int n_pairs, float eps) {
    cuda_ctx *c = cuda_of(be);
    const int half = head_dim / 2;
    if (n_pairs > half) n_pairs = half;
    if (n_tokens <= 0 || n_heads <= 0 || head_dim <= 0) return;
    if (n_pairs > ROPE_MAX_PAIRS) {
        cuda_fail_op(c, "rmsnorm_rope: %d frequency pairs exceed the supported %d", n_pairs, ROPE_MAX_PAIRS);
        return;
    }
    if (n_heads > 65535) {
        cuda_fail_op(c, "rmsnorm_rope: %d heads", n_heads);
        return;
    }
    const rope_freqs f = rope_freqs_of(theta, head_dim, n_pairs);
    dim3 grid((unsigned)n_tokens, (unsigned)n_heads);
    cuda_launch(c, rmsnorm_rope_kernel, grid, head_dim >= 512 ? 256 : 128, 0, x, w, n_heads, head_dim, n_pairs, eps,
                                                                             pos, f);
    cuda_launched(c, "rmsnorm_rope");
}

void cuda_rope_2d(g4_backend *be, float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, float theta) {
    cuda_ctx *c = cuda_of(be);
    const int part = head_dim / 2, half = part / 2;
    if (n <= 0 || half <= 0 || n_heads <= 0) return;
    if (half > ROPE_MAX_PAIRS) {
        cuda_fail_op(c, "rope_2d: head_dim %d too large", head_dim);
        return;
    }
    rope_freqs f;
    for (int j = 0; j < half; j++) f.inv_freq[j] = 1.0f / powf(theta, (float)(2 * j) / (float)part);
    for (int axis = 0; axis < 2; axis++) {
        rope_kernel<<<n, 128, 0, c->stream>>>(x, n_heads, head_dim, half, axis * part, half, pos_xy + axis, 2, f);
        cuda_launched(c, "rope_2d");
    }
}

/* ---- embeddings ---- */

__global__ void embed_kernel(float *out, dev_matrix table, const int32_t *ids, float scale) {
    pdl_wait();
    const int i = blockIdx.x;
    const int64_t r = ids[i];
    float *o = out + (size_t)i * (size_t)table.cols;
    const bool scaled = scale != 1.0f;
    for (int64_t c = threadIdx.x; c < table.cols; c += blockDim.x) {
        float v = dev_matrix_get(table, r, c);
        o[c] = scaled ? __fmul_rn(v, scale) : v;
    }
}

void cuda_embed(g4_backend *be, float *out, const g4_matrix *table, const int32_t *ids, int n, float scale) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0) return;
    cuda_launch(c, embed_kernel, n, 256, 0, out, dev_matrix_of(table), ids, scale);
    cuda_launched(c, "embed");
}

/* ---- pooling ---- */

/* One block per output row: sums the rows that pool into it in input
 * order, in double, then scales (as the host does). */
__global__ void pool_rows_kernel(float *out, const float *in, const int32_t *slot, int n_in, int dim, float scale) {
    const int o = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    double acc = 0;
    for (int r = 0; r < n_in; r++)
        if (slot[r] == o) acc += (double)in[(size_t)r * dim + c];
    out[(size_t)o * dim + c] = (float)(acc * scale);
}

void cuda_pool_rows(g4_backend *be, float *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim,
                    float scale) {
    cuda_ctx *c = cuda_of(be);
    if (n_out <= 0 || dim <= 0) return;
    dim3 grid(cuda_blocks((size_t)dim, 128), (unsigned)n_out);
    pool_rows_kernel<<<grid, 128, 0, c->stream>>>(out, in, slot, n_in, dim, scale);
    cuda_launched(c, "pool_rows");
}
