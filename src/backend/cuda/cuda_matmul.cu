/* Matrix products over weights in their stored formats.
 *
 *  n_tokens <= 8 (decode): a dequantising GEMV in float32. Each warp owns a
 *    few rows and streams them in 16-byte loads that bypass L1 (each weight
 *    byte is read once); the activations stay in L1 and are reused across
 *    the warp's rows; codes become floats in registers.
 *  n_tokens > 8 (prefill): bf16 tensor cores through cuBLAS. Activations
 *    are split into hi + lo bf16 parts (x = hi + lo to 16 significant bits)
 *    and multiplied twice; weights of other formats are dequantised into a
 *    bf16 scratch (hi and lo) in row chunks, three products each (two for
 *    MXFP4, whose values are exact in bf16). float32
 *    weights use cuBLAS's float32 GEMM (no TF32). G4_PRECISION_FAST keeps
 *    only the hi parts: one product, bf16 rounding of activations and
 *    weights (2^-9 relative), enough for trained checkpoints but not for the
 *    tiny random fixtures, whose logits amplify it to 0.1-1 relative error.
 *    The dequantising pass costs about 2-4 bytes written and read per weight
 *    per call, amortised over the prompt's tokens (dequantising inside the
 *    tiles of the mma kernel below, which the MoE experts use, was slower).
 *    (The warpgroup GEMM of cuda_wgmma.cu, which decodes 4-bit codes in its
 *    main loop, is slower here for now: only the wgmma=2 test hook picks it.)
 * Which kernel runs is planned first (g4_plan_gemv, cuda_plan.h), then the
 * planned one is launched.
 * Precision: float32 activations and accumulation everywhere; the split
 * products keep prefill within about 1e-5 of float32. */
#include <string.h>

#include "backend/cuda/cuda_formats.cuh"
#include "backend/cuda/cuda_wgmma.cuh"
#include "backend/cuda/cuda_internal.cuh"

/* columns held by 16 bytes of a row */
template <int F> __host__ __device__ constexpr int chunk_cols() {
    return F == FF_F32 ? 4 : F == FF_BF16 || F == FF_F16 ? 8 : F == FF_AFF8 ? 16 : F == FF_AFF2 ? 64 : 32;
}

/* rows per warp in the GEMV: enough reuse of each activation load */
template <int F> __host__ __device__ constexpr int gemv_rows() {
    return F == FF_AFF2 ? 1 : F == FF_AFF4 || F == FF_AFF8 || F == FF_MXFP4 ? 2 : 4;
}

static int chunk_cols_of(int f) {
    switch (f) {
    case FF_F32: return chunk_cols<FF_F32>();
    case FF_BF16: return chunk_cols<FF_BF16>();
    case FF_F16: return chunk_cols<FF_F16>();
    case FF_AFF2: return chunk_cols<FF_AFF2>();
    case FF_AFF4: return chunk_cols<FF_AFF4>();
    case FF_AFF8: return chunk_cols<FF_AFF8>();
    case FF_MXFP4: return chunk_cols<FF_MXFP4>();
    }
    return 0;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Decodes one 16-byte chunk into chunk_cols<F>() floats: plain values for
 * float formats, codes q for affine (the caller applies scale and bias),
 * E2M1 values for MXFP4 (the caller applies the E8M0 scale). */
template <int F>
__device__ __forceinline__ void decode_chunk(const uint4 raw, float *v, const float *lut) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    const float magic = 8388608.0f; /* 2^23: (2^23 + q) is exact in float32 */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (F == FF_F32) {
            v[i] = __uint_as_float(w[i]);
        } else if constexpr (F == FF_BF16) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else if constexpr (F == FF_F16) {
            __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
            float2 f = __half22float2(h);
            v[2 * i] = f.x;
            v[2 * i + 1] = f.y;
        } else if constexpr (F == FF_AFF8) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                v[4 * i + k] = __uint_as_float(__byte_perm(w[i], 0x4B000000u, 0x7440u | (uint32_t)k)) - magic;
        } else if constexpr (F == FF_AFF4) {
            /* (a bf16-pair decode, 128 + q per code, was no faster and lost
             * an order of magnitude of precision to the 128 x sum(x) correction) */
#pragma unroll
            for (int k = 0; k < 8; k++) v[8 * i + k] = __uint_as_float(((w[i] >> (4 * k)) & 15u) | 0x4B000000u) - magic;
        } else if constexpr (F == FF_AFF2) {
#pragma unroll
            for (int k = 0; k < 16; k++) v[16 * i + k] = __uint_as_float(((w[i] >> (2 * k)) & 3u) | 0x4B000000u) - magic;
        } else if constexpr (F == FF_MXFP4) {
#pragma unroll
            for (int k = 0; k < 8; k++) v[8 * i + k] = lut[(w[i] >> (4 * k)) & 15u];
        }
    }
}

/* the weights (rows: of one expert with ids), then the product's operands */
struct gemv_args : dev_matrix {
    const float *x;
    size_t x_stride;
    float *out;
    size_t out_stride;
    int n;
    const int32_t *ids;
    int64_t expert_stride, row_offset;
    int x_div, n_experts;
    const float *gelu_mul; /* epilogue: out = gelu_tanh(sum) * gelu_mul[same index], or NULL */
    /* > 0: gated pairs, out[r] = gelu_tanh(row r's sum) * (row r + pair's sum)
     * for the a.rows output rows (gate rows, their up rows pair further on) */
    int64_t pair;
};

#define GEMV_WARPS 4
#define GEMV_THREADS (GEMV_WARPS * 32)

/* out (and mul, the epilogue's factors, laid out like out) already point at
 * the slot's row with ids */
__device__ __forceinline__ void gemv_store(float *out, const float *mul, size_t stride, int t, int64_t row, float v) {
    const size_t i = (size_t)t * stride + (size_t)row;
    out[i] = mul ? __fmul_rn(gelu_tanh(v), mul[i]) : v;
}

/* SPLIT = false: each warp owns R rows and its lanes stride over the
 * columns. SPLIT = true: the block owns R rows and all its threads stride
 * over the columns (partial sums meet in shared memory): four times the
 * blocks, so that the small matrices of a decode step (a few MB, too few
 * warps to keep enough loads in flight) still fill the GPU. */
template <int F, int NT, int R, bool SPLIT, int MINB>
__global__ void __launch_bounds__(GEMV_THREADS, MINB) gemv_kernel(gemv_args a) {
    constexpr int C = chunk_cols<F>();
    __shared__ float lut[16];
    if constexpr (F == FF_MXFP4) {
        if (threadIdx.x < 16) lut[threadIdx.x] = e2m1_value(threadIdx.x);
        __syncthreads();
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* gated pairs (a.pair > 0, R even): a warp's first R/2 rows are gate rows,
     * the rest their up rows a.pair further on */
    constexpr int RH = R / 2;
    const bool paired = R % 2 == 0 && a.pair > 0;
    const int out_rows = paired ? RH : R;
    const int64_t row0 = SPLIT ? (int64_t)blockIdx.x * out_rows : ((int64_t)blockIdx.x * GEMV_WARPS + warp) * out_rows;
    int64_t prow[R];  /* the matrix row of each of the warp's R rows */
    bool valid[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t o = paired && r >= RH ? row0 + r - RH : row0 + r; /* output row */
        valid[r] = o < a.rows;
        prow[r] = paired && r >= RH ? o + a.pair : o;
    }
    constexpr int STRIDE = SPLIT ? GEMV_THREADS : 32; /* threads sharing a row's chunks */
    const int first = SPLIT ? (int)threadIdx.x : lane;
    const uint8_t *data = a.data, *scales = a.scales, *biases = a.biases;
    const float *x = a.x, *mul = a.gelu_mul;
    float *out = a.out;
    int n = a.n;
    /* The weights are never written by a kernel: without ids the first pass's
     * weight loads go out before pdl_wait, while the kernel before this one
     * (a norm, the activations' preparation) may still be running. Float
     * formats only (with scales and biases too, the loads held across the
     * loop's first turn cost the 8-bit kernels spills). */
    constexpr bool GROUPED = is_affine<F>() || F == FF_MXFP4;
    const bool early = !GROUPED && !a.ids;
    if (!early) pdl_wait();
    if (a.ids) {
        const int slot = blockIdx.y;
        const int e = a.ids[slot];
        if (e < 0 || e >= a.n_experts) return;
        const int64_t base = (int64_t)e * a.expert_stride + a.row_offset;
        if (mul) mul += (size_t)slot * a.out_stride;
        data += (size_t)base * a.row_bytes;
        if (scales) scales += (size_t)base * a.scale_row_bytes;
        if (biases) biases += (size_t)base * a.scale_row_bytes;
        x += (size_t)(slot / a.x_div) * a.x_stride;
        out += (size_t)slot * a.out_stride;
        n = 1;
    }
    if (!SPLIT && !valid[0]) return;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    const int n_chunks = (int)(a.cols / C);
    /* two chunks per thread per pass: twice the bytes in flight (four, or
     * the L2 256-byte prefetch hint on these loads, were slower) */
    uint4 raw[2][R];
    /* the chunks' scales and biases as loaded, requested with the codes and
     * converted only when used (a conversion here would wait for the load
     * on the spot) */
    uint32_t s_bits[2][R], b_bits[2][R];
    /* a pass's weights: two chunks of each of the R rows from ch0 on */
    auto load_pass = [&](int ch0) {
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int ch = ch0 + STRIDE * u;
                const bool in = ch < n_chunks && valid[r];
                raw[u][r] = in ? load_stream16(data + (size_t)prow[r] * a.row_bytes + (size_t)ch * 16)
                               : make_uint4(0, 0, 0, 0);
                s_bits[u][r] = b_bits[u][r] = 0;
                if constexpr (GROUPED) {
                    if (in) {
                        const int64_t g = (int64_t)ch * C / a.group_size;
                        const size_t off = (size_t)prow[r] * a.scale_row_bytes;
                        if constexpr (F == FF_MXFP4) {
                            s_bits[u][r] = scales[off + g];
                        } else {
                            s_bits[u][r] = load_group_bits(scales + off, a.scale_dtype, g);
                            b_bits[u][r] = load_group_bits(biases + off, a.scale_dtype, g);
                        }
                    }
                }
            }
    };
    if constexpr (!GROUPED) {
        load_pass(first);
        if (early) pdl_wait();
    }
    for (int ch0 = first; ch0 < n_chunks; ch0 += 2 * STRIDE) {
        if (GROUPED || ch0 != first) load_pass(ch0);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int ch = ch0 + STRIDE * u;
            if (ch >= n_chunks) break;
            float s[R], b[R];
            if constexpr (GROUPED) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if constexpr (F == FF_MXFP4) {
                        s[r] = valid[r] ? e8m0_value(s_bits[u][r]) : 0.0f;
                        b[r] = 0.0f;
                    } else {
                        s[r] = group_bits_value(s_bits[u][r], a.scale_dtype);
                        b[r] = group_bits_value(b_bits[u][r], a.scale_dtype);
                    }
                }
            }
            float wv[R][C];
#pragma unroll
            for (int r = 0; r < R; r++) decode_chunk<F>(raw[u][r], wv[r], lut);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                float xv[C];
                const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)t * a.x_stride + (size_t)ch * C);
#pragma unroll
                for (int i = 0; i < C / 4; i++) {
                    float4 q = __ldg(xp + i);
                    xv[4 * i] = q.x;
                    xv[4 * i + 1] = q.y;
                    xv[4 * i + 2] = q.z;
                    xv[4 * i + 3] = q.w;
                }
                float sx = 0.0f;
                if constexpr (is_affine<F>()) {
#pragma unroll
                    for (int i = 0; i < C; i++) sx += xv[i];
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float d = 0.0f;
#pragma unroll
                    for (int i = 0; i < C; i++) d = fmaf(wv[r][i], xv[i], d);
                    if constexpr (is_affine<F>())
                        acc[r][t] += s[r] * d + b[r] * sx;
                    else if constexpr (F == FF_MXFP4)
                        acc[r][t] = fmaf(s[r], d, acc[r][t]);
                    else
                        acc[r][t] += d;
                }
            }
        }
    }
    if constexpr (SPLIT) {
        /* every thread reaches here (no early exit after row0), so the barrier is safe */
        __shared__ float part[GEMV_WARPS][R][NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = warp_sum(acc[r][t]);
                if (lane == 0) part[warp][r][t] = v;
            }
        __syncthreads();
        if (threadIdx.x < out_rows * NT) {
            const int r = threadIdx.x / NT, t = threadIdx.x % NT;
            float v = 0.0f, up = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; w++) {
                v += part[w][r][t];
                if (paired) up += part[w][r + RH][t];
            }
            if (t < n && valid[r]) {
                if (paired)
                    out[(size_t)t * a.out_stride + (size_t)(row0 + r)] = __fmul_rn(gelu_tanh(v), up);
                else
                    gemv_store(out, mul, a.out_stride, t, row0 + r, v);
            }
        }
    } else {
        float v[R][NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) v[r][t] = warp_sum(acc[r][t]);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= n || !valid[r]) continue;
                    if (!paired)
                        gemv_store(out, mul, a.out_stride, t, row0 + r, v[r][t]);
                    else if (r < RH)
                        out[(size_t)t * a.out_stride + (size_t)(row0 + r)] = __fmul_rn(gelu_tanh(v[r][t]), v[r + RH][t]);
                }
    }
}

/* The MoE experts' down projection with each token's weighted sum of its k
 * experts (moe_combine) in one launch, for float weights (bf16, f16, f32:
 * the Hugging Face checkpoints' experts): a block per R rows and token, a
 * warp per chosen expert streaming the R rows over the whole width (704
 * columns for the 26B-A4B), two chunks per lane in flight; the block adds
 * the experts' rows in choice order, weighted, as moe_combine_kernel does.
 * (Before: a GEMV block per (2 rows, slot), then a combine launch.) The
 * quantised formats' kernels: gemv_tc_moe_down_kernel, gemv_i8_moe_down_kernel. */
#define GEMV_MOE_WARPS 8
#define GEMV_MOE_ROWS 4

template <int F>
__global__ void __launch_bounds__(GEMV_MOE_WARPS * 32) gemv_moe_down_kernel(gemv_args a, const float *weights, int k) {
    pdl_wait();
    constexpr int C = chunk_cols<F>(), R = GEMV_MOE_ROWS;
    __shared__ float part[GEMV_MOE_WARPS][R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, token = blockIdx.y;
    const int64_t row0 = (int64_t)blockIdx.x * R;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    const int slot = token * k + warp;
    const int e = warp < k ? a.ids[slot] : -1;
    if (e >= 0 && e < a.n_experts) {
        const uint8_t *data = a.data + (size_t)((int64_t)e * a.expert_stride + a.row_offset) * a.row_bytes;
        const float *x = a.x + (size_t)slot * a.x_stride;
        const int n_chunks = (int)(a.cols / C);
        for (int ch0 = lane; ch0 < n_chunks; ch0 += 64) {
            uint4 raw[2][R];
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int ch = ch0 + 32 * u;
                    raw[u][r] = ch < n_chunks && row0 + r < a.rows
                                    ? load_stream16(data + (size_t)(row0 + r) * a.row_bytes + (size_t)ch * 16)
                                    : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int ch = ch0 + 32 * u;
                if (ch >= n_chunks) break;
                float xv[C];
                const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)ch * C);
#pragma unroll
                for (int i = 0; i < C / 4; i++) {
                    const float4 q = __ldg(xp + i);
                    xv[4 * i] = q.x, xv[4 * i + 1] = q.y, xv[4 * i + 2] = q.z, xv[4 * i + 3] = q.w;
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wv[C];
                    decode_chunk<F>(raw[u][r], wv, NULL);
                    float d = 0.0f;
#pragma unroll
                    for (int i = 0; i < C; i++) d = fmaf(wv[i], xv[i], d);
                    acc[r] += d;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = v;
    }
    __syncthreads();
    const int r = threadIdx.x;
    if (r >= R || row0 + r >= a.rows) return;
    float v = 0.0f;
    for (int j = 0; j < k; j++) {
        const int ej = a.ids[token * k + j];
        if (ej >= 0 && ej < a.n_experts) v = fmaf(weights[token * k + j], part[j][r], v);
    }
    a.out[(size_t)token * a.out_stride + (size_t)(row0 + r)] = v;
}

static void launch_gemv_moe_down(cuda_ctx *c, const cuda_gemv_req *r) {
    const g4_matrix *w = r->w;
    gemv_args a;
    memset(&a, 0, sizeof a);
    static_cast<dev_matrix &>(a) = dev_matrix_of(w);
    a.rows = w->rows;
    a.cols = w->cols;
    a.x = r->x;
    a.x_stride = r->x_stride;
    a.out = r->out;
    a.out_stride = r->out_stride;
    a.ids = r->ids;
    a.expert_stride = r->expert_stride;
    a.row_offset = r->row_offset;
    a.n_experts = r->n_experts;
    const int k = r->combine_k;
    const dim3 grid(cuda_blocks((size_t)w->rows, GEMV_MOE_ROWS), (unsigned)(r->n_slots / k));
    switch (fast_format_of(w)) {
    case FF_BF16: cuda_launch(c, gemv_moe_down_kernel<FF_BF16>, grid, GEMV_MOE_WARPS * 32, 0, a, r->combine_w, k); break;
    case FF_F16: cuda_launch(c, gemv_moe_down_kernel<FF_F16>, grid, GEMV_MOE_WARPS * 32, 0, a, r->combine_w, k); break;
    default: cuda_launch(c, gemv_moe_down_kernel<FF_F32>, grid, GEMV_MOE_WARPS * 32, 0, a, r->combine_w, k); break;
    }
    cuda_launched(c, "gemv_moe_down");
}

/* Any format, any alignment: element by element (odd shapes, 3/5/6/7-bit). */
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_generic_kernel(gemv_args a, dev_matrix m) {
    pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    const float *x = a.x, *mul = a.gelu_mul;
    float *out = a.out;
    int n = a.n;
    int64_t base = 0;
    if (a.ids) {
        const int slot = blockIdx.y;
        const int e = a.ids[slot];
        if (e < 0 || e >= a.n_experts) return;
        base = (int64_t)e * a.expert_stride + a.row_offset;
        if (mul) mul += (size_t)slot * a.out_stride;
        x += (size_t)(slot / a.x_div) * a.x_stride;
        out += (size_t)slot * a.out_stride;
        n = 1;
    }
    if (row >= a.rows) return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t c = lane; c < a.cols; c += 32) {
        const float w = dev_matrix_get(m, base + row, c);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < n) acc[t] = fmaf(w, x[(size_t)t * a.x_stride + c], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0 && t < n) gemv_store(out, mul, a.out_stride, t, row, v);
    }
}

/* The float32 GEMV as planned: rows per warp and launch bound are the
 * plan's (g4_gemv_float_rows, g4_gemv_float_min_blocks), instantiated here
 * for each format and token count. */
template <int F> __host__ __device__ constexpr int float_rows(int NT) {
    return NT == 1 && (F == FF_AFF4 || F == FF_AFF8 || F == FF_MXFP4) ? 4
           : NT == 1 && F == FF_BF16                                  ? 2
                                                                      : gemv_rows<F>();
}
template <int F> __host__ __device__ constexpr int float_min_blocks(int NT) {
    return NT == 1 && (F == FF_AFF4 || F == FF_MXFP4) ? 5 : NT == 1 && F == FF_AFF8 ? 6 : 0;
}

template <int F, int NT>
static void launch_gemv_float_nt(cuda_ctx *c, const g4_gemv_plan *p, const gemv_args &a, int n_slots) {
    constexpr int R = float_rows<F>(NT), MINB = float_min_blocks<F>(NT);
    if (p->rows != R || p->min_blocks != MINB) {
        cuda_fail_op(c, "gemv: no float32 kernel for %d rows per warp, %d blocks per multiprocessor", p->rows,
                     p->min_blocks);
        return;
    }
    const int rp = a.pair > 0 ? R / 2 : R; /* output rows per warp */
    if (p->split) {
        dim3 grid(cuda_blocks((size_t)a.rows, rp), (unsigned)n_slots);
        cuda_launch(c, gemv_kernel<F, NT, R, true, MINB>, grid, GEMV_THREADS, 0, a);
    } else {
        dim3 grid(cuda_blocks((size_t)a.rows, GEMV_WARPS * rp), (unsigned)n_slots);
        cuda_launch(c, gemv_kernel<F, NT, R, false, MINB>, grid, GEMV_THREADS, 0, a);
    }
    cuda_launched(c, "gemv");
}

template <int F> static void launch_gemv_float(cuda_ctx *c, const g4_gemv_plan *p, const gemv_args &a, int n_slots) {
    switch (p->tokens) {
    case 1: launch_gemv_float_nt<F, 1>(c, p, a, n_slots); break;
    case 2: launch_gemv_float_nt<F, 2>(c, p, a, n_slots); break;
    case 4: launch_gemv_float_nt<F, 4>(c, p, a, n_slots); break;
    default: launch_gemv_float_nt<F, 8>(c, p, a, n_slots); break;
    }
}

template <int NT>
static void launch_gemv_generic(cuda_ctx *c, const gemv_args &a, const dev_matrix &m, int n_slots) {
    dim3 grid(cuda_blocks((size_t)a.rows, GEMV_WARPS), (unsigned)n_slots);
    cuda_launch(c, gemv_generic_kernel<NT>, grid, GEMV_WARPS * 32, 0, a, m);
    cuda_launched(c, "gemv_generic");
}


static g4_gemv_plan plan_of(const cuda_ctx *c, const cuda_gemv_req *r) {
    g4_gemv_shape sh;
    sh.w = r->w;
    sh.n_tokens = r->n_tokens;
    sh.has_ids = r->ids != NULL;
    sh.n_slots = r->n_slots;
    sh.x_div = r->x_div;
    sh.x_aligned = aligned16(r->x) && r->x_stride % 4 == 0;
    sh.pair = r->pair;
    sh.combine_k = r->combine_k;
    sh.exact = c->prefill_split;
    return g4_plan_gemv(&c->caps, &c->tune, &sh);
}

/* The float32 GEMV kernels (plan GEMV_FLOAT or GEMV_GENERIC). */
static void launch_gemv_planned(cuda_ctx *c, const g4_gemv_plan *p, const cuda_gemv_req *r) {
    const g4_matrix *w = r->w;
    gemv_args a;
    static_cast<dev_matrix &>(a) = dev_matrix_of(w);
    a.rows = w->rows; /* with ids: rows of one expert */
    a.cols = w->cols;
    a.x = r->x;
    a.x_stride = r->x_stride;
    a.out = r->out;
    a.out_stride = r->out_stride;
    a.n = r->ids ? 1 : r->n_tokens;
    a.ids = r->ids;
    a.expert_stride = r->expert_stride;
    a.row_offset = r->row_offset;
    a.x_div = r->x_div > 0 ? r->x_div : 1;
    a.n_experts = r->n_experts;
    a.gelu_mul = r->pair > 0 ? NULL : r->gelu_mul;
    a.pair = r->pair;
    const int n_slots = r->ids ? r->n_slots : 1;
    if (p->kernel == G4_KERNEL_GEMV_GENERIC) {
        const dev_matrix m = dev_matrix_of(w);
        if (p->tokens == 1)
            launch_gemv_generic<1>(c, a, m, n_slots);
        else if (p->tokens == 4)
            launch_gemv_generic<4>(c, a, m, n_slots);
        else
            launch_gemv_generic<8>(c, a, m, n_slots);
        return;
    }
    switch (fast_format_of(w)) {
    case FF_F32: launch_gemv_float<FF_F32>(c, p, a, n_slots); break;
    case FF_BF16: launch_gemv_float<FF_BF16>(c, p, a, n_slots); break;
    case FF_F16: launch_gemv_float<FF_F16>(c, p, a, n_slots); break;
    case FF_AFF2: launch_gemv_float<FF_AFF2>(c, p, a, n_slots); break;
    case FF_AFF4: launch_gemv_float<FF_AFF4>(c, p, a, n_slots); break;
    case FF_AFF8: launch_gemv_float<FF_AFF8>(c, p, a, n_slots); break;
    case FF_MXFP4: launch_gemv_float<FF_MXFP4>(c, p, a, n_slots); break;
    }
}

/* Plans r, then runs the planned kernel: 0 when none takes it (nothing launched). */
static int run_gemv(cuda_ctx *c, const cuda_gemv_req *r) {
    const g4_gemv_plan p = plan_of(c, r);
    switch (p.kernel) {
    case G4_KERNEL_GEMV_FP16:
    case G4_KERNEL_GEMV_FP16_TOKENS:
    case G4_KERNEL_GEMV_INT8:
    case G4_KERNEL_MOE_DOWN_FP16:
    case G4_KERNEL_MOE_DOWN_INT8: cuda_gemv_tc_launch(c, &p, r); return 1;
    default: break;
    }
    cuda_moe_route_flush(c); /* a routing waiting for a pre-pass: these kernels have none */
    switch (p.kernel) {
    case G4_KERNEL_SKIP: return 1;
    case G4_KERNEL_GEMV_GENERIC:
    case G4_KERNEL_GEMV_FLOAT: launch_gemv_planned(c, &p, r); return 1;
    case G4_KERNEL_MOE_DOWN_FLOAT: launch_gemv_moe_down(c, r); return 1;
    case G4_KERNEL_DECLINE: return 0;
    default: cuda_fail_op(c, "gemv: plan %s is not a GEMV", g4_kernel_name(p.kernel)); return 1;
    }
}

int cuda_gemv(cuda_ctx *c, float *out, size_t out_stride, const float *x, size_t x_stride, int n_tokens,
              const g4_matrix *w, const int32_t *ids, int n_slots, int x_div, int64_t expert_stride,
              int64_t row_offset, int n_experts, const float *gelu_mul, int64_t pair) {
    if (n_tokens > 8) {
        cuda_fail_op(c, "gemv: %d tokens (at most 8)", n_tokens);
        return 1;
    }
    const cuda_gemv_req r = {w,        x,           x_stride,   out,      out_stride, n_tokens, ids, n_slots,
                             x_div,    expert_stride, row_offset, n_experts, gelu_mul, pair,     NULL, 0};
    return run_gemv(c, &r);
}

int cuda_gemv_moe_down(cuda_ctx *c, float *out, size_t out_stride, const float *x, size_t x_stride,
                       const g4_matrix *w, const int32_t *ids, const float *weights, int n_slots, int k,
                       int64_t expert_stride, int64_t row_offset, int n_experts) {
    if (k <= 0) {
        cuda_moe_route_flush(c);
        return 0;
    }
    const cuda_gemv_req r = {w, x, x_stride, out, out_stride, 1, ids, n_slots, 1, expert_stride, row_offset,
                             n_experts, NULL, 0, weights, k};
    return run_gemv(c, &r);
}

/* ---- conversions for the tensor-core path ---- */

/* hi = bf16(x); lo = bf16(x - hi) when lo is not NULL */
__global__ void split_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = src[i];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[i] = h;
        if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

/* The same, four values a thread (16-byte loads, 8-byte stores), the last
 * n % 4 by the first threads: the scalar kernel's 4-byte loads left the
 * pass at about a third of the bandwidth (prefill's "activations to bf16",
 * bench/RESULTS.md). Same bits as split_bf16_kernel. */
__global__ void split_bf16_vec4_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *src, size_t n) {
    const size_t n4 = n / 4, stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (size_t i = first; i < n4; i += stride) {
        const float4 v = reinterpret_cast<const float4 *>(src)[i];
        uint32_t h0, h1, l0, l1;
        split_pack(v.x, v.y, h0, l0);
        split_pack(v.z, v.w, h1, l1);
        reinterpret_cast<uint2 *>(hi)[i] = make_uint2(h0, h1);
        if (lo) reinterpret_cast<uint2 *>(lo)[i] = make_uint2(l0, l1);
    }
    if (first < n - n4 * 4) {
        const size_t i = n4 * 4 + first;
        const float v = src[i];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[i] = h;
        if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

int cuda_split_bf16(cuda_ctx *c, __nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, size_t n) {
    if (aligned16(x) && (uintptr_t)hi % 8 == 0 && (uintptr_t)lo % 8 == 0) {
        const unsigned grid = cuda_blocks(n / 4 + 1, 256);
        split_bf16_vec4_kernel<<<grid > 65536u ? 65536u : grid, 256, 0, c->stream>>>(hi, lo, x, n);
        return cuda_launched(c, "split_bf16 (4 a thread)");
    }
    const unsigned grid = cuda_blocks(n, 256);
    split_bf16_kernel<<<grid > 65536u ? 65536u : grid, 256, 0, c->stream>>>(hi, lo, x, n);
    return cuda_launched(c, "split_bf16");
}

/* Rows [r0, r0 + nr) as bf16 (hi, and the remainder in lo when not NULL),
 * eight values per thread: consecutive threads read consecutive bytes and
 * write consecutive 16-byte runs (both coalesced). */
template <int F>
__global__ void dequant_bf16_kernel(dev_matrix m, int64_t r0, int64_t nr, __nv_bfloat16 *dst, __nv_bfloat16 *lo) {
    __shared__ float lut[16];
    if constexpr (F == FF_MXFP4) {
        if (threadIdx.x < 16) lut[threadIdx.x] = e2m1_value(threadIdx.x);
        __syncthreads();
    }
    const float magic = 8388608.0f;
    const int64_t per_row = m.cols / 8;
    /* rows along y, runs of 8 columns along x: no integer division */
    for (int64_t r = blockIdx.y; r < nr; r += gridDim.y)
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < per_row; j += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c0 = j * 8;
        const uint8_t *row = m.data + (size_t)(r0 + r) * m.row_bytes;
        float v[8];
        if constexpr (F == FF_F32) {
            const float4 a = *reinterpret_cast<const float4 *>(row + c0 * 4);
            const float4 b = *reinterpret_cast<const float4 *>(row + c0 * 4 + 16);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else if constexpr (F == FF_BF16 || F == FF_F16) {
            const uint4 q = *reinterpret_cast<const uint4 *>(row + c0 * 2);
            const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if constexpr (F == FF_BF16) {
                    v[2 * k] = __uint_as_float(w[k] << 16);
                    v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
                } else {
                    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[k]));
                    v[2 * k] = f.x;
                    v[2 * k + 1] = f.y;
                }
            }
        } else {
            const uint8_t *sr = m.scales + (size_t)(r0 + r) * m.scale_row_bytes;
            const int64_t g = c0 / m.group_size;
            if constexpr (F == FF_AFF8) {
                const uint2 q = *reinterpret_cast<const uint2 *>(row + c0);
                const float s = load_group_param(sr, m.scale_dtype, g);
                const float b = load_group_param(m.biases + (size_t)(r0 + r) * m.scale_row_bytes, m.scale_dtype, g);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    v[k] = fmaf(s, __uint_as_float(__byte_perm(q.x, 0x4B000000u, 0x7440u | (uint32_t)k)) - magic, b);
                    v[4 + k] = fmaf(s, __uint_as_float(__byte_perm(q.y, 0x4B000000u, 0x7440u | (uint32_t)k)) - magic, b);
                }
            } else if constexpr (F == FF_AFF4 || F == FF_AFF2) {
                const uint32_t q = F == FF_AFF4 ? *reinterpret_cast<const uint32_t *>(row + c0 / 2)
                                                : (uint32_t)*reinterpret_cast<const uint16_t *>(row + c0 / 4);
                const float s = load_group_param(sr, m.scale_dtype, g);
                const float b = load_group_param(m.biases + (size_t)(r0 + r) * m.scale_row_bytes, m.scale_dtype, g);
                constexpr int bits = F == FF_AFF4 ? 4 : 2;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[k] = fmaf(s, __uint_as_float(((q >> (bits * k)) & ((1u << bits) - 1u)) | 0x4B000000u) - magic, b);
            } else if constexpr (F == FF_MXFP4) {
                const uint32_t q = *reinterpret_cast<const uint32_t *>(row + c0 / 2);
                const float s = e8m0_value(sr[g]);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = lut[(q >> (4 * k)) & 15u] * s;
            }
        }
        uint32_t hi[4], lw[4];
#pragma unroll
        for (int k = 0; k < 4; k++) split_pack(v[2 * k], v[2 * k + 1], hi[k], lw[k]);
        const size_t o = (size_t)r * m.cols + (size_t)c0;
        *reinterpret_cast<uint4 *>(dst + o) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        if (lo) *reinterpret_cast<uint4 *>(lo + o) = make_uint4(lw[0], lw[1], lw[2], lw[3]);
    }
}

__global__ void dequant_bf16_generic_kernel(dev_matrix m, int64_t r0, int64_t nr, __nv_bfloat16 *dst,
                                            __nv_bfloat16 *lo) {
    const int64_t total = nr * m.cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = dev_matrix_get(m, r0 + i / m.cols, i % m.cols);
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        dst[i] = h;
        if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

static void dequant_rows_bf16(cuda_ctx *c, const g4_matrix *w, int64_t r0, int64_t nr, __nv_bfloat16 *dst,
                              __nv_bfloat16 *lo) {
    cudaStream_t stream = c->stream;
    dev_matrix m = dev_matrix_of(w);
    int f = fast_format_of(w);
    const int C = f == FF_NONE ? 0 : chunk_cols_of(f);
    /* the 8-per-thread kernel reads whole rows of 8 values at aligned offsets */
    int fast = f != FF_NONE && w->cols % 8 == 0 && w->row_bytes == (size_t)(w->cols / C) * 16 && aligned16(w->data) &&
               w->row_bytes % 16 == 0;
    if (fast && (f == FF_AFF2 || f == FF_AFF4 || f == FF_AFF8 || f == FF_MXFP4))
        fast = w->group_size > 0 && w->group_size % 8 == 0 && (f != FF_MXFP4 || w->group_size == 32);
    const size_t work = (size_t)nr * (size_t)w->cols;
    unsigned grid1 = cuda_blocks(work, 256);
    if (grid1 > 65536u) grid1 = 65536u;
    const dim3 grid(cuda_blocks((size_t)(w->cols / 8), 256), (unsigned)(nr < 65535 ? nr : 65535));
    switch (fast ? f : FF_NONE) {
    case FF_F16: dequant_bf16_kernel<FF_F16><<<grid, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    case FF_F32: dequant_bf16_kernel<FF_F32><<<grid, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    case FF_BF16: dequant_bf16_kernel<FF_BF16><<<grid, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    case FF_AFF2: dequant_bf16_kernel<FF_AFF2><<<grid, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    case FF_AFF4: dequant_bf16_kernel<FF_AFF4><<<grid, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    case FF_AFF8: dequant_bf16_kernel<FF_AFF8><<<grid, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    case FF_MXFP4: dequant_bf16_kernel<FF_MXFP4><<<grid, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    default: dequant_bf16_generic_kernel<<<grid1, 256, 0, stream>>>(m, r0, nr, dst, lo); break;
    }
    cuda_launched(c, "dequantise to bf16");
}

/* out[t][r] (row stride ldo) (+)= sum_c W[r][c] x[t][c] for bf16 W (lda elements per row). */
static void gemm_bf16(cuda_ctx *c, float *out, size_t ldo, const __nv_bfloat16 *xb, int n, const void *w,
                      size_t lda, int64_t rows, int64_t cols, float beta) {
    const float alpha = 1.0f;
    cuda_check_blas(c,
                    c->blas_api->gemm_ex(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &alpha, w, CUDA_R_16BF,
                                 (int)lda, xb, CUDA_R_16BF, (int)cols, &beta, out, CUDA_R_32F, (int)ldo,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx (bf16)");
}

void cuda_matmul(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w) {
    cuda_ctx *c = cuda_of(be);
    if (n_tokens <= 0 || w->rows <= 0) return;
    if (w->cols <= 0) {
        cuda_check(c, cudaMemsetAsync(out, 0, (size_t)n_tokens * w->rows * 4, c->stream), "memset");
        return;
    }
    if (n_tokens <= 8) {
        cuda_gemv(c, out, (size_t)w->rows, x, (size_t)w->cols, n_tokens, w, NULL, 1, 1, 0, 0, 0, NULL, 0);
        return;
    }
    if (w->rows > INT32_MAX || w->cols > INT32_MAX) {
        cuda_fail_op(c, "matmul: %lld x %lld is too large for cuBLAS", (long long)w->rows, (long long)w->cols);
        return;
    }
    const int split = c->prefill_split;
    g4_gemv_shape sh = {w, n_tokens, 0, 1, 1, 1, 0, 0, split};
    const g4_gemv_plan p = g4_plan_gemv(&c->caps, &c->tune, &sh);
    if (p.kernel == G4_KERNEL_GEMM_F32) {
        const float alpha = 1.0f, beta = 0.0f;
        cuda_check_blas(c,
                        c->blas_api->sgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, n_tokens, (int)w->cols, &alpha,
                                    (const float *)w->data, (int)(w->row_bytes / 4), x, (int)w->cols, &beta, out,
                                    (int)w->rows),
                        "cublasSgemm");
        return;
    }
    const size_t nx = (size_t)n_tokens * (size_t)w->cols;
    const size_t nx_pad = (nx + 7) / 8 * 8; /* lo starts 16-byte aligned (the vector conversion, cuBLAS) */
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(c, SCRATCH_X_BF16, nx_pad * 2 * (split ? 2 : 1));
    if (!xb) return;
    __nv_bfloat16 *x_lo = split ? xb + nx_pad : NULL;
    if (!cuda_split_bf16(c, xb, x_lo, x, nx)) return;
    if (p.kernel == G4_KERNEL_GEMM_WGMMA4) {
        cuda_wgmma_q4_gemm(c, out, (size_t)w->rows, xb, n_tokens, w);
        return;
    }
    if (p.kernel == G4_KERNEL_GEMM_BF16) {
        gemm_bf16(c, out, (size_t)w->rows, xb, n_tokens, w->data, w->row_bytes / 2, w->rows, w->cols, 0.0f);
        if (split) gemm_bf16(c, out, (size_t)w->rows, x_lo, n_tokens, w->data, w->row_bytes / 2, w->rows, w->cols, 1.0f);
        return;
    }
    /* dequantise row chunks of at most q_chunk Mi values into bf16 (hi, lo),
     * multiply each; chunks start at multiples of 128 rows so that cuBLAS
     * sees aligned output columns (an odd start sent it to a kernel ten times
     * slower) */
    int64_t chunk_rows = (int64_t)(((size_t)c->tune.q_chunk << 20) / (size_t)w->cols) / 128 * 128;
    if (chunk_rows < 128) chunk_rows = 128;
    const int64_t rows_per = chunk_rows < w->rows ? chunk_rows : w->rows;
    const size_t chunk_elems = (size_t)rows_per * (size_t)w->cols;
    /* weights whose every value is a bf16 (MXFP4) need no lo part: two products */
    const int w_split = split && !weights_exact_in_bf16(w);
    const size_t buf_elems = chunk_elems * (w_split ? 2 : 1);
    __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(c, SCRATCH_W_BF16, buf_elems * 2);
    if (!wb) return;
    __nv_bfloat16 *hi = wb, *w_lo = w_split ? wb + chunk_elems : NULL;
    for (int64_t r0 = 0; r0 < w->rows; r0 += rows_per) {
        const int64_t nr = w->rows - r0 < rows_per ? w->rows - r0 : rows_per;
        dequant_rows_bf16(c, w, r0, nr, hi, w_lo);
        gemm_bf16(c, out + r0, (size_t)w->rows, xb, n_tokens, hi, (size_t)w->cols, nr, w->cols, 0.0f);
        if (split) {
            gemm_bf16(c, out + r0, (size_t)w->rows, x_lo, n_tokens, hi, (size_t)w->cols, nr, w->cols, 1.0f);
            if (w_lo) gemm_bf16(c, out + r0, (size_t)w->rows, xb, n_tokens, w_lo, (size_t)w->cols, nr, w->cols, 1.0f);
        }
    }
}

/* ---- the mma kernel: bf16 tensor cores, weights dequantised in the tile ---- */

#define MMA_BN 128
#define MMA_BK 32
#define MMA_LDS (MMA_BK + 8) /* bf16 per shared row: 80 bytes, conflict-free fragment loads */

struct mma_args : dev_matrix {
    int64_t N, K; /* weight rows (per expert) and columns */
    int64_t expert_stride, row_offset;
    const float *x;
    size_t x_stride;
    int x_div;
    float *out;
    size_t out_stride;
    cuda_groups g;
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}


template <int BM, bool SPLIT> __host__ __device__ constexpr size_t mma_smem_bytes() {
    return (size_t)2 * (SPLIT ? 2 : 1) * (BM + MMA_BN) * MMA_LDS * sizeof(uint16_t);
}

/* SPLIT: activations and (unless exact in bf16: bf16, MXFP4) weights as
 * hi + lo bf16 parts, three products per step, two for exact weights (the
 * lo x lo term is below float32 rounding of the sum): about float32 accuracy
 * at two or three times the tensor-core work. Without SPLIT: one bf16 product. */
template <int F, int BM, bool SPLIT>
__global__ void __launch_bounds__(256) mma_gemm_kernel(mma_args a) {
    constexpr int PARTS = SPLIT ? 2 : 1;
    constexpr bool W_LO = SPLIT && !exact_in_bf16<F>(); /* bf16 and MXFP4 weights are exact in one part */
    constexpr int RAW = mma_raw_bytes<F>() / 4;  /* 32-bit words */
    constexpr int MT = BM / 32;                  /* m16 tiles per warp (warps 2 x 4) */
    constexpr int A_PER = BM / 32;               /* float4 of A per thread per k tile */
    extern __shared__ __align__(16) uint16_t mma_smem[];
    typedef uint16_t a_tile[PARTS][BM][MMA_LDS];
    typedef uint16_t b_tile[PARTS][MMA_BN][MMA_LDS];
    a_tile *As = reinterpret_cast<a_tile *>(mma_smem);                           /* [2 stages] */
    b_tile *Bs = reinterpret_cast<b_tile *>(mma_smem + 2 * PARTS * BM * MMA_LDS); /* [2 stages] */
    __shared__ float lut[16];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    if (tid < 16) lut[tid] = e2m1_value(tid);

    const int tile = blockIdx.x;
    const int64_t n0 = (int64_t)blockIdx.y * MMA_BN;
    if (tile >= *a.g.n_tiles) return;
    const int32_t *rowlist = a.g.sorted + a.g.tile_start[tile];
    const int m_len = a.g.tile_len[tile];
    const int64_t base = (int64_t)a.g.tile_expert[tile] * a.expert_stride + a.row_offset;
    __syncthreads(); /* lut */

    /* this thread's A rows (NULL: beyond the tile's rows, loads zeros) */
    const float *a_src[A_PER];
#pragma unroll
    for (int j = 0; j < A_PER; j++) {
        const int m = (tid + j * 256) >> 3;
        a_src[j] = NULL;
        if (m < m_len) {
            const int src = rowlist[m] / a.x_div;
            a_src[j] = a.x + (size_t)src * a.x_stride;
        }
    }
    /* this thread's B row and 16-column half of each k tile */
    const int bn = tid >> 1, bhalf = tid & 1;
    const bool b_valid = n0 + bn < a.N;
    const uint8_t *b_row = a.data + (size_t)(base + n0 + bn) * a.row_bytes;
    const uint8_t *s_row = a.scales ? a.scales + (size_t)(base + n0 + bn) * a.scale_row_bytes : NULL;
    const uint8_t *z_row = a.biases ? a.biases + (size_t)(base + n0 + bn) * a.scale_row_bytes : NULL;

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.0f;

    float4 a_reg[A_PER];
    uint32_t b_reg[RAW > 4 ? RAW : 4];
    float b_s = 0.0f, b_b = 0.0f;

    auto load_tile = [&](int kt) {
        const int64_t k0 = (int64_t)kt * MMA_BK;
#pragma unroll
        for (int j = 0; j < A_PER; j++) {
            const int kq = (tid + j * 256) & 7;
            a_reg[j] = a_src[j] ? *reinterpret_cast<const float4 *>(a_src[j] + k0 + kq * 4) : make_float4(0, 0, 0, 0);
        }
        const int64_t col = k0 + bhalf * 16;
        if (b_valid) {
            const uint8_t *p = b_row + (size_t)(col * mma_raw_bytes<F>() / 16);
            if constexpr (RAW >= 4) {
#pragma unroll
                for (int i = 0; i < RAW / 4; i++) {
                    uint4 v = *reinterpret_cast<const uint4 *>(p + 16 * i);
                    b_reg[4 * i] = v.x;
                    b_reg[4 * i + 1] = v.y;
                    b_reg[4 * i + 2] = v.z;
                    b_reg[4 * i + 3] = v.w;
                }
            } else if constexpr (RAW == 2) {
                uint2 v = *reinterpret_cast<const uint2 *>(p);
                b_reg[0] = v.x;
                b_reg[1] = v.y;
            } else {
                b_reg[0] = *reinterpret_cast<const uint32_t *>(p);
            }
            if constexpr (is_affine<F>()) {
                const int64_t grp = col / a.group_size;
                b_s = load_group_param(s_row, a.scale_dtype, grp);
                b_b = load_group_param(z_row, a.scale_dtype, grp);
            } else if constexpr (F == FF_MXFP4) {
                b_s = e8m0_value(s_row[col / a.group_size]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < (RAW > 4 ? RAW : 4); i++) b_reg[i] = 0;
            b_s = b_b = 0.0f;
        }
    };
    auto store_tile = [&](int buf) {
#pragma unroll
        for (int j = 0; j < A_PER; j++) {
            const int i = tid + j * 256, m = i >> 3, kq = i & 7;
            uint32_t h0, h1, l0, l1;
            split_pack(a_reg[j].x, a_reg[j].y, h0, l0);
            split_pack(a_reg[j].z, a_reg[j].w, h1, l1);
            *reinterpret_cast<uint2 *>(&As[buf][0][m][kq * 4]) = make_uint2(h0, h1);
            if constexpr (SPLIT) *reinterpret_cast<uint2 *>(&As[buf][PARTS - 1][m][kq * 4]) = make_uint2(l0, l1);
        }
        uint32_t hi[8], lo[8];
        if constexpr (F == FF_BF16) {
#pragma unroll
            for (int i = 0; i < 8; i++) hi[i] = b_valid ? b_reg[i] : 0u;
        } else {
            float v[16];
            if (b_valid) {
                dequant16<F>(b_reg, b_s, b_b, v, lut);
            } else {
#pragma unroll
                for (int i = 0; i < 16; i++) v[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) split_pack(v[2 * i], v[2 * i + 1], hi[i], lo[i]);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(&Bs[buf][0][bn][bhalf * 16]);
        dst[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        dst[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
        if constexpr (W_LO) {
            uint4 *dl = reinterpret_cast<uint4 *>(&Bs[buf][PARTS - 1][bn][bhalf * 16]);
            dl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            dl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
        }
    };

    const int KT = (int)(a.K / MMA_BK);
    load_tile(0);
    store_tile(0);
    __syncthreads();
    for (int kt = 0; kt < KT; kt++) {
        const int buf = kt & 1;
        if (kt + 1 < KT) load_tile(kt + 1);
#pragma unroll
        for (int kk = 0; kk < MMA_BK; kk += 16) {
            uint32_t af[PARTS][MT][4], bf[PARTS][4][2];
#pragma unroll
            for (int p = 0; p < PARTS; p++)
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    const int r = wm * (BM / 2) + i * 16 + g;
                    af[p][i][0] = *reinterpret_cast<const uint32_t *>(&As[buf][p][r][kk + tig * 2]);
                    af[p][i][1] = *reinterpret_cast<const uint32_t *>(&As[buf][p][r + 8][kk + tig * 2]);
                    af[p][i][2] = *reinterpret_cast<const uint32_t *>(&As[buf][p][r][kk + 8 + tig * 2]);
                    af[p][i][3] = *reinterpret_cast<const uint32_t *>(&As[buf][p][r + 8][kk + 8 + tig * 2]);
                }
#pragma unroll
            for (int p = 0; p < (W_LO ? 2 : 1); p++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int n = wn * 32 + j * 8 + g;
                    bf[p][j][0] = *reinterpret_cast<const uint32_t *>(&Bs[buf][p][n][kk + tig * 2]);
                    bf[p][j][1] = *reinterpret_cast<const uint32_t *>(&Bs[buf][p][n][kk + 8 + tig * 2]);
                }
            /* x_lo w_hi, x_hi w_lo, x_hi w_hi, each over all fragments in turn
             * (a product's accumulator is not the one before's) */
#pragma unroll
            for (int term = 0; term < 3; term++) {
                if (term == 0 && !SPLIT) continue;
                if (term == 1 && !W_LO) continue;
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        if (term == 0) mma_bf16(acc[i][j], af[PARTS - 1][i], bf[0][j]);
                        else if (term == 1) mma_bf16(acc[i][j], af[0][i], bf[PARTS - 1][j]);
                        else mma_bf16(acc[i][j], af[0][i], bf[0][j]);
                    }
            }
        }
        if (kt + 1 < KT) store_tile(buf ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int m = wm * (BM / 2) + i * 16 + g + half * 8;
            if (m >= m_len) continue;
            const size_t dst = (size_t)rowlist[m];
            float *o = a.out + dst * a.out_stride;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t n = n0 + wn * 32 + j * 8 + tig * 2;
                if (n < a.N) o[n] = acc[i][j][2 * half];
                if (n + 1 < a.N) o[n + 1] = acc[i][j][2 * half + 1];
            }
        }
}

int cuda_mma_supported(const g4_matrix *w, const float *x, size_t x_stride) {
    int f = fast_format_of(w);
    if (f == FF_NONE) return 0;
    if (w->cols % MMA_BK || w->row_bytes % 16 || !aligned16(w->data) || !aligned16(x) || x_stride % 4) return 0;
    if (w->row_bytes != (size_t)(w->cols / chunk_cols_of(f)) * 16) return 0;
    if (f == FF_AFF2 || f == FF_AFF4 || f == FF_AFF8) return w->group_size > 0 && w->group_size % 16 == 0;
    if (f == FF_MXFP4) return w->group_size == 32;
    return 1;
}

template <int F, int BM, bool SPLIT>
static void launch_mma(cuda_ctx *c, const mma_args &a, unsigned tiles) {
    constexpr size_t smem = mma_smem_bytes<BM, SPLIT>();
    static unsigned configured; /* the opt-in above 48 KB, once per kernel and device */
    if (!cuda_done_on_device(&configured, c)) {
        if (!cuda_check(c,
                        cudaFuncSetAttribute(mma_gemm_kernel<F, BM, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        "cudaFuncSetAttribute"))
            return;
        cuda_mark_device(&configured, c);
    }
    dim3 grid(tiles, cuda_blocks((size_t)a.N, MMA_BN));
    mma_gemm_kernel<F, BM, SPLIT><<<grid, 256, smem, c->stream>>>(a);
    cuda_launched(c, "mma_gemm");
}

template <int BM, bool SPLIT>
static void launch_mma_format(cuda_ctx *c, int f, const mma_args &a, unsigned tiles) {
    switch (f) {
    case FF_F32: launch_mma<FF_F32, BM, SPLIT>(c, a, tiles); break;
    case FF_BF16: launch_mma<FF_BF16, BM, SPLIT>(c, a, tiles); break;
    case FF_F16: launch_mma<FF_F16, BM, SPLIT>(c, a, tiles); break;
    case FF_AFF2: launch_mma<FF_AFF2, BM, SPLIT>(c, a, tiles); break;
    case FF_AFF4: launch_mma<FF_AFF4, BM, SPLIT>(c, a, tiles); break;
    case FF_AFF8: launch_mma<FF_AFF8, BM, SPLIT>(c, a, tiles); break;
    case FF_MXFP4: launch_mma<FF_MXFP4, BM, SPLIT>(c, a, tiles); break;
    }
}

void cuda_mma_gemm(cuda_ctx *c, float *out, size_t out_stride, const float *x, size_t x_stride, int x_div,
                   const g4_matrix *w, int64_t rows, int64_t expert_stride, int64_t row_offset, const cuda_groups *g) {
    mma_args a;
    static_cast<dev_matrix &>(a) = dev_matrix_of(w);
    a.N = rows;
    a.K = w->cols;
    a.expert_stride = expert_stride;
    a.row_offset = row_offset;
    a.x = x;
    a.x_stride = x_stride;
    a.x_div = x_div > 0 ? x_div : 1;
    a.out = out;
    a.out_stride = out_stride;
    a.g = *g;
    const int f = fast_format_of(w);
    if (rows <= 0) return;
    const unsigned tiles = (unsigned)g->max_tiles;
    if (c->prefill_split)
        launch_mma_format<CUDA_MMA_GROUP_BM, true>(c, f, a, tiles);
    else
        launch_mma_format<CUDA_MMA_GROUP_BM, false>(c, f, a, tiles);
}

void cuda_matmul_gated(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w) {
    cuda_ctx *c = cuda_of(be);
    const int64_t F = w->rows / 2;
    if (w->rows % 2 || n_tokens <= 0) {
        if (w->rows % 2) cuda_fail_op(c, "matmul_gated: %lld rows (gate and up rows: an even count)", (long long)w->rows);
        return;
    }
    g4_matrix gate = g4_matrix_rows(w, 0, F);
    if (n_tokens <= 8 && cuda_gemv(c, out, (size_t)F, x, (size_t)w->cols, n_tokens, &gate, NULL, 1, 1, 0, 0, 0, NULL, F))
        return;
    /* prefill, or a format the GEMV cannot pair: both halves, then gate them */
    float *both = (float *)cuda_scratch(c, SCRATCH_GATED, (size_t)n_tokens * (size_t)w->rows * sizeof(float));
    if (!both) return;
    cuda_matmul(be, both, x, n_tokens, w);
    cuda_launch_gated_rows(c, out, both, n_tokens, F);
}

void cuda_matmul_gelu_mul(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w,
                          const float *mul) {
    cuda_ctx *c = cuda_of(be);
    if (n_tokens > 0 && n_tokens <= 8 && w->rows > 0 && w->cols > 0) {
        cuda_gemv(c, out, (size_t)w->rows, x, (size_t)w->cols, n_tokens, w, NULL, 1, 1, 0, 0, 0, mul, 0);
        return;
    }
    cuda_matmul(be, out, x, n_tokens, w);
    cuda_launch_gelu_mul(c, out, out, mul, (size_t)n_tokens * (size_t)w->rows);
}
