/* The audio tower's ops on the GPU (semantics in backend.h), plus the
 * LayerNorm the 12B's vision embedder uses. Straightforward kernels: the
 * audio tower runs once per clip and is small next to the text decoder. */
#include <math.h>

#include "backend/cuda/cuda_internal.cuh"

#define THREADS 256

static unsigned grid_of(size_t n) { return cuda_blocks(n, THREADS); }

__global__ void scale_rows_kernel(float *out, const float *a, const float *s, size_t n, int dim) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) out[i] = __fmul_rn(a[i], s[i / (size_t)dim]);
}

__global__ void relu_kernel(float *out, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void silu_kernel(float *out, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) out[i] = __fdiv_rn(x[i], __fadd_rn(1.0f, expf(-x[i])));
}

__global__ void glu_kernel(float *out, const float *x, size_t n, int dim) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)dim, c = i % (size_t)dim;
        const float *a = x + r * 2 * (size_t)dim;
        out[i] = __fdiv_rn(a[c], __fadd_rn(1.0f, expf(-a[dim + c])));
    }
}

/* One block per row; mean and variance in double as the CPU does. */
__global__ void layer_norm_kernel(float *out, const float *x, const float *w, const float *b, int dim, float eps) {
    __shared__ double part[THREADS];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = out + (size_t)blockIdx.x * dim;
    double s = 0;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) s += xr[c];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    const double mean = part[0] / dim;
    __syncthreads();
    double q = 0;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) q += ((double)xr[c] - mean) * ((double)xr[c] - mean);
    part[threadIdx.x] = q;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    const float inv = (float)(1.0 / sqrt(part[0] / dim + (double)eps)), mu = (float)mean;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float y = __fmul_rn(__fsub_rn(xr[c], mu), inv);
        if (w) y = __fmul_rn(y, w[c]);
        if (b) y = __fadd_rn(y, b[c]);
        yr[c] = y;
    }
}

/* One thread per output element [i][j][oc]; weights [c_out][kh][kw][c_in]. */
__global__ void conv2d_kernel(float *out, const float *x, const float *w, int H, int W, int c_in, int c_out, int kh,
                              int kw, int stride, int pad, int Ho, int Wo) {
    const size_t n = (size_t)Ho * Wo * c_out;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const int oc = (int)(e % c_out), j = (int)((e / c_out) % Wo), i = (int)(e / ((size_t)c_out * Wo));
        const float *wr = w + (size_t)oc * kh * kw * c_in;
        float acc = 0.0f;
        for (int a = 0; a < kh; a++) {
            const int y = i * stride - pad + a;
            if (y < 0 || y >= H) continue;
            for (int bx = 0; bx < kw; bx++) {
                const int xx = j * stride - pad + bx;
                if (xx < 0 || xx >= W) continue;
                const float *xp = x + ((size_t)y * W + xx) * c_in, *wp = wr + ((size_t)a * kw + bx) * c_in;
                for (int c = 0; c < c_in; c++) acc = fmaf(wp[c], xp[c], acc);
            }
        }
        out[e] = acc;
    }
}

__global__ void depthwise_kernel(float *out, const float *x, const float *w, int T, int C, int K) {
    const size_t n = (size_t)T * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(e % C), t = (int)(e / C);
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            const int src = t - (K - 1) + k;
            if (src >= 0) acc = fmaf(w[(size_t)c * K + k], x[(size_t)src * C + c], acc);
        }
        out[e] = acc;
    }
}

/* One warp per (frame, head): lanes split the head dimension for the dot
 * products; the context window (chunk + past + future slots) is small. */
__global__ void chunked_attention_kernel(float *out, const float *q, const float *k, const float *v,
                                         const float *rel_k, const int32_t *valid, g4_chunked_attn_params p) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    const int T = p.n_frames, H = p.n_heads, D = p.head_dim, Wc = p.chunk + p.past + p.future;
    if (warp >= T * H) return;
    const int i = warp / H, h = warp % H;
    const size_t row = (size_t)H * D;
    const float *qi = q + (size_t)i * row + (size_t)h * D;
    float *oi = out + (size_t)i * row + (size_t)h * D;
    const int w = i % p.chunk, first = i - w - p.past;
    float logits[64]; /* Wc <= 64 (checked by the launcher) */
    float mx = -INFINITY;
    for (int c = 0; c < Wc; c++) {
        const int j = first + c, dist = i - j, r = c - w;
        const int inside = j >= 0 && j < T;
        float l = 0.0f;
        if (inside) {
            const float *kj = k + (size_t)j * row + (size_t)h * D;
            for (int d = lane; d < D; d += 32) l = fmaf(qi[d], kj[d], l);
        }
        if (r >= 0 && r < p.n_rel) {
            const float *rk = rel_k + (size_t)r * row + (size_t)h * D;
            for (int d = lane; d < D; d += 32) l = fmaf(qi[d], rk[d], l);
        }
        for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (p.logit_cap > 0.0f) l = p.logit_cap * tanhf(l / p.logit_cap);
        int visible = inside && valid[j] && dist <= p.max_past_dist && -dist <= p.max_future_dist;
        if (p.invert_mask) visible = inside && !visible;
        if (!visible) l = p.invalid_logit;
        logits[c] = l;
        mx = fmaxf(mx, l);
    }
    float sum = 0.0f;
    for (int c = 0; c < Wc; c++) {
        logits[c] = expf(logits[c] - mx);
        sum += logits[c];
    }
    for (int d = lane; d < D; d += 32) {
        float acc = 0.0f;
        for (int c = 0; c < Wc; c++) {
            const int j = first + c;
            if (j < 0 || j >= T) continue;
            acc = fmaf(logits[c] / sum, v[(size_t)j * row + (size_t)h * D + d], acc);
        }
        oi[d] = acc;
    }
}

void cuda_scale_rows(g4_backend *be, float *out, const float *a, const float *s, int rows, int dim) {
    cuda_ctx *c = cuda_of(be);
    size_t n = (size_t)rows * dim;
    if (!n) return;
    scale_rows_kernel<<<grid_of(n), THREADS, 0, c->stream>>>(out, a, s, n, dim);
    cuda_launched(c, "scale_rows");
}

void cuda_relu(g4_backend *be, float *out, const float *x, size_t n) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    relu_kernel<<<grid_of(n), THREADS, 0, c->stream>>>(out, x, n);
    cuda_launched(c, "relu");
}

void cuda_silu(g4_backend *be, float *out, const float *x, size_t n) {
    cuda_ctx *c = cuda_of(be);
    if (!n) return;
    silu_kernel<<<grid_of(n), THREADS, 0, c->stream>>>(out, x, n);
    cuda_launched(c, "silu");
}

void cuda_glu(g4_backend *be, float *out, const float *x, int rows, int dim) {
    cuda_ctx *c = cuda_of(be);
    size_t n = (size_t)rows * dim;
    if (!n) return;
    glu_kernel<<<grid_of(n), THREADS, 0, c->stream>>>(out, x, n, dim);
    cuda_launched(c, "glu");
}

void cuda_layer_norm(g4_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int dim,
                     float eps) {
    cuda_ctx *c = cuda_of(be);
    if (rows <= 0 || dim <= 0) return;
    layer_norm_kernel<<<rows, THREADS, 0, c->stream>>>(out, x, w, b, dim, eps);
    cuda_launched(c, "layer_norm");
}

void cuda_conv2d(g4_backend *be, float *out, const float *x, const float *w, int H, int W, int c_in, int c_out, int kh,
                 int kw, int stride, int pad) {
    cuda_ctx *c = cuda_of(be);
    const int Ho = (H + 2 * pad - kh) / stride + 1, Wo = (W + 2 * pad - kw) / stride + 1;
    size_t n = (size_t)Ho * Wo * c_out;
    if (Ho <= 0 || Wo <= 0 || !n) return;
    conv2d_kernel<<<grid_of(n), THREADS, 0, c->stream>>>(out, x, w, H, W, c_in, c_out, kh, kw, stride, pad, Ho, Wo);
    cuda_launched(c, "conv2d");
}

void cuda_depthwise_conv1d_causal(g4_backend *be, float *out, const float *x, const float *w, int T, int C, int K) {
    cuda_ctx *c = cuda_of(be);
    size_t n = (size_t)T * C;
    if (!n) return;
    depthwise_kernel<<<grid_of(n), THREADS, 0, c->stream>>>(out, x, w, T, C, K);
    cuda_launched(c, "depthwise_conv1d_causal");
}

void cuda_chunked_attention(g4_backend *be, float *out, const float *q, const float *k, const float *v,
                            const float *rel_k, const int32_t *valid, const g4_chunked_attn_params *p) {
    cuda_ctx *c = cuda_of(be);
    if (p->chunk + p->past + p->future > 64) {
        cuda_fail_op(c, "chunked attention with a %d-frame context (at most 64 here)", p->chunk + p->past + p->future);
        return;
    }
    size_t threads = (size_t)p->n_frames * p->n_heads * 32;
    if (!threads) return;
    chunked_attention_kernel<<<cuda_blocks(threads, THREADS), THREADS, 0, c->stream>>>(out, q, k, v, rel_k, valid, *p);
    cuda_launched(c, "chunked_attention");
}
