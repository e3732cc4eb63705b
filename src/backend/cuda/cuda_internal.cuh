/* Shared by the CUDA backend's translation units: the backend state, error
 * bookkeeping, growable scratch buffers and device-side weight decoding.
 *
 * Every op runs asynchronously on the backend's one stream; only to_host,
 * release and synchronize wait. A failing CUDA call cannot be returned
 * through the void ops, so the first failure is logged and made sticky:
 * later to_host copies are filled with NaN so nothing downstream mistakes
 * garbage for results (g4_cuda_status reports it). */
#ifndef G4_BACKEND_CUDA_INTERNAL_CUH
#define G4_BACKEND_CUDA_INTERNAL_CUH

#include "backend/cuda/cuda_blas.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda_plan.h"
#include "backend/cuda_tuning.h"
}

/* Growable device buffers, one per use, reused across calls (the stream
 * orders every use, so one buffer per purpose suffices). */
/* tiles x slots of one tensor-core GEMV call that can split their columns */
#define TC_MAX_COUNTERS (1 << 20)

enum cuda_scratch_slot {
    SCRATCH_X_BF16 = 0,  /* activations rounded to bf16 for tensor cores */
    SCRATCH_W_BF16,      /* weights dequantised to bf16 for cuBLAS */
    SCRATCH_ATTN_PART,   /* split-K attention partials */
    SCRATCH_MOE_GATE,
    SCRATCH_MOE_UP,
    SCRATCH_MOE_DOWN,
    SCRATCH_MOE_SORT,
    SCRATCH_MOE_GROUPED, /* experts by cuBLAS: gathered rows, product rows, offsets and pointer arrays */
    SCRATCH_GEMV_FRAGS,   /* activations as fp16 mma fragments (cuda_gemv_tc.cu) */
    SCRATCH_GEMV_PARTIAL, /* its partial sums when a row's columns are split over blocks */
    SCRATCH_GATED,        /* matmul_gated's gate and up sums when they are not paired in the GEMV */
    SCRATCH_TOP_LOGITS, /* top_logits: per-block partials and candidate lists */
    SCRATCH_COUNT
};

struct cuda_upload {
    const void *host;
    void *dev;
    size_t bytes;
};

/* A MoE routing (moe_route's arguments) that the next GEMV pre-pass runs
 * in a block of its own instead of a launch of its own (n 0: none) */
struct cuda_moe_route_job {
    int32_t *ids;
    float *weights;
    const float *logits, *expert_scale;
    int n, n_experts, k;
};

struct cuda_ctx {
    int device;
    char name[256];
    cudaStream_t stream;
    const cuda_blas_api *blas_api; /* loaded at creation */
    cublasHandle_t blas;
    void *blas_workspace;
    size_t blas_workspace_bytes;
    void *scratch[SCRATCH_COUNT];
    size_t scratch_bytes[SCRATCH_COUNT];
    /* weights uploaded by prepare_matrix, owned here and freed at destroy
     * (the op table has no per-matrix release) */
    cuda_upload *uploads;
    size_t n_uploads, cap_uploads;
    void *pinned[2];
    size_t pinned_bytes;
    cudaEvent_t pinned_free[2];
    /* Prefill GEMMs split activations (and non-bf16 weights) into hi + lo
     * bf16 parts: about float32 accuracy for 2-3x the tensor-core work
     * (G4_PRECISION_EXACT). G4_PRECISION_FAST turns it off: one bf16
     * product, ~3 significant digits per activation. */
    int prefill_split;
    g4_cuda_caps caps;   /* the device's, at creation */
    g4_cuda_tuning tune; /* the measured defaults for caps, with G4_CUDA_TUNE and the creator's overrides */
    cuda_moe_route_job route_job; /* a routing until a GEMV pre-pass takes it (cuda_moe_route_flush launches it otherwise) */
    int *gemv_counters; /* TC_MAX_COUNTERS per-tile counters of the tensor-core GEMVs' split rows, zero between calls */
    struct cuda_recorder *recorder; /* run_step's recorded steps (cuda_graph.cu) */
    int capturing;        /* while run_step captures a step */
    int capture_spoiled;  /* a buffer had to grow while recording: drop the recording */
    unsigned generation;  /* bumped whenever a scratch buffer moves; recordings of older generations are stale */
    long graph_launches;
    g4_status failed;   /* sticky first failure */
    char failure[256];  /* and its message */
};

static inline cuda_ctx *cuda_of(g4_backend *be) { return (cuda_ctx *)be->impl; }

/* Records a failed CUDA call (first one wins, logged once). Returns 1 when ok. */
/* Kernel attributes such as the shared-memory opt-in belong to a device:
 * a kernel's "done" flags hold one bit per device (devices past 31 set the
 * attribute on every launch, which is correct, only slower). */
static inline int cuda_done_on_device(const unsigned *flags, const cuda_ctx *c) {
    return c->device >= 0 && c->device < 32 && (__atomic_load_n(flags, __ATOMIC_RELAXED) >> c->device & 1u);
}
static inline void cuda_mark_device(unsigned *flags, const cuda_ctx *c) {
    if (c->device >= 0 && c->device < 32) __atomic_fetch_or(flags, 1u << c->device, __ATOMIC_RELAXED);
}

int cuda_check(cuda_ctx *c, cudaError_t e, const char *what);
int cuda_check_blas(cuda_ctx *c, cublasStatus_t s, const char *what);
/* After a kernel launch: catches bad launch configurations. */
static inline int cuda_launched(cuda_ctx *c, const char *kernel) { return cuda_check(c, cudaGetLastError(), kernel); }
/* Records a misuse of an op (bad sizes, unsupported shape). */
void cuda_fail_op(cuda_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A device buffer of at least `bytes` for `slot` (NULL and a sticky failure
 * when the device is out of memory). */
void *cuda_scratch(cuda_ctx *c, int slot, size_t bytes);

/* Programmatic dependent launch: a kernel started by cuda_launch may be
 * scheduled while the kernel before it is still finishing its last blocks
 * (hiding the launch gap of a decode step's many small kernels). Every such
 * kernel calls pdl_wait() first, which returns once the previous kernel has
 * completed and its writes are visible; nothing is read or written before,
 * except by the GEMVs without ids (float32, integer and pipelined fp16
 * kernels): their first weights, which no kernel writes. (Letting every
 * kernel start its successor as soon as all its blocks are resident lost:
 * bench/RESULTS.md.) */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Lets the next kernel be scheduled now; it still waits in its pdl_wait()
 * for this one to complete. Called first by the one- or few-block kernels of
 * a decode step (norms, RoPE, activation preparation, routing, merges),
 * whose successor is mostly a GEMV: its blocks are then resident when they
 * finish (faster there, slower in every other kernel: bench/RESULTS.md). */
__device__ __forceinline__ void pdl_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
static inline void cuda_launch(cuda_ctx *c, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                               Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = c->tune.pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

static inline unsigned cuda_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 0x7fffffffu ? 0x7fffffffu : (b ? b : 1));
}

__device__ __forceinline__ float gelu_tanh(float x) {
    /* 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))), evaluated
     * left to right without fused multiply-adds, as the host does */
    const float k = 0.7978845608028654f;
    float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
    float t = tanhf(__fmul_rn(k, __fadd_rn(x, cube)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
}

/* ---- per-file entry points ---- */

/* elementwise, norms, rope, embeddings, vision helpers (cuda_elementwise.cu) */
void cuda_embed(g4_backend *be, float *out, const g4_matrix *table, const int32_t *ids, int n, float scale);
void cuda_rmsnorm(g4_backend *be, float *out, const float *x, const float *w, int rows, int dim, float eps);
void cuda_rmsnorm_pair(g4_backend *be, float *out, const float *w, float *out2, const float *w2, const float *x,
                       int rows, int dim, float eps);
void cuda_rmsnorm_rope(g4_backend *be, float *x, const float *w, int n_tokens, int n_heads, int head_dim,
                       const int32_t *pos, float theta, int n_pairs, float eps);
void cuda_add_rmsnorm(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                      float scale, float *next_out, const float *next_w);
void cuda_add_rmsnorm_moe(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                          float *out, const float *w_out, float *out2, const float *w2, float *out3, const float *w3);
void cuda_moe_route_experts(g4_backend *be, float *out, const float *x, int n, int32_t *ids, float *weights,
                            const float *logits, const float *expert_scale, int n_experts, int k,
                            const g4_expert_matrix *gate, const g4_expert_matrix *up, const g4_expert_matrix *down);
/* launches c->route_job's routing now if one is waiting (before any kernel that may read its ids) */
void cuda_moe_route_flush(cuda_ctx *c);
void cuda_moe_residual(g4_backend *be, float *h, float *dense, const float *w_dense, const float *experts,
                       const float *w_experts, const float *w_post, int rows, int dim, float eps, float scale,
                       float *next_out, const float *next_w);
void cuda_rope(g4_backend *be, float *x, int n_tokens, int n_heads, int head_dim, const int32_t *pos, float theta,
               int n_pairs);
void cuda_gelu_mul(g4_backend *be, float *out, const float *gate, const float *up, size_t n);
void cuda_add(g4_backend *be, float *out, const float *a, const float *b, size_t n);
void cuda_scale(g4_backend *be, float *out, const float *a, float s, size_t n);
void cuda_mul_rows(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim);
void cuda_mul(g4_backend *be, float *out, const float *a, const float *b, size_t n);
void cuda_softcap(g4_backend *be, float *x, size_t n, float cap);
void cuda_gather_rows(g4_backend *be, float *dst, const float *src, const int32_t *rows, int n, int dim);
void cuda_scatter_rows(g4_backend *be, float *dst, const int32_t *rows, const float *src, int n, int dim);
void cuda_copy_rows(g4_backend *be, float *dst, int dst_stride, const float *src, int src_stride, int rows, int cols);
void cuda_clamp(g4_backend *be, float *out, const float *x, float lo, float hi, size_t n);
void cuda_affine(g4_backend *be, float *out, const float *a, float s, float b, size_t n);
void cuda_add_rows(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim);
void cuda_rope_2d(g4_backend *be, float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, float theta);
void cuda_pool_rows(g4_backend *be, float *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim,
                    float scale);
/* audio tower ops (cuda_audio_ops.cu) */
void cuda_scale_rows(g4_backend *be, float *out, const float *a, const float *s, int rows, int dim);
void cuda_relu(g4_backend *be, float *out, const float *x, size_t n);
void cuda_silu(g4_backend *be, float *out, const float *x, size_t n);
void cuda_glu(g4_backend *be, float *out, const float *x, int rows, int dim);
void cuda_layer_norm(g4_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int dim,
                     float eps);
void cuda_conv2d(g4_backend *be, float *out, const float *x, const float *w, int H, int W, int c_in, int c_out, int kh,
                 int kw, int stride, int pad);
void cuda_depthwise_conv1d_causal(g4_backend *be, float *out, const float *x, const float *w, int T, int C, int K);
void cuda_chunked_attention(g4_backend *be, float *out, const float *q, const float *k, const float *v,
                            const float *rel_k, const int32_t *valid, const g4_chunked_attn_params *p);
/* out = gelu_tanh(gate) * up on the backend's stream (also used by MoE) */
void cuda_launch_gelu_mul(cuda_ctx *c, float *out, const float *gate, const float *up, size_t n);
/* out[t][r] = gelu_tanh(both[t][r]) * both[t][F + r] for r < F */
void cuda_launch_gated_rows(cuda_ctx *c, float *out, const float *both, int n_tokens, int64_t F);

/* recording (cuda_graph.cu): run_step, and freeing the recordings at destroy */
g4_status cuda_run_step(g4_backend *be, const g4_step_key *key, g4_status (*issue)(void *ctx), void *ctx);
void cuda_recorder_free(cuda_ctx *c);

/* matrices (cuda_matmul.cu) */
void cuda_matmul(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w);
void cuda_matmul_gated(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w);
void cuda_matmul_gelu_mul(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w,
                          const float *mul);

/* Matrix-vector products for up to 8 tokens, float32 throughout. With ids,
 * each of n_slots slots multiplies one vector (row slot / x_div of x) by
 * expert ids[slot]'s rows [ids*expert_stride + row_offset, + rows) of w and
 * writes out row slot (slots with ids outside [0, n_experts) are skipped).
 * gelu_mul (NULL for none; laid out like out): out[i] = gelu_tanh(sum) *
 * gelu_mul[i]. pair > 0: gated pairs instead, out[r] = gelu_tanh(sum of
 * row r) * (sum of row r + pair) for w's rows r (the gate rows; their up
 * rows lie pair rows further in the same buffer, scales alike). Returns 0,
 * launching nothing, when pairs are asked for a format or shape the
 * kernels cannot pair (then run them apart); else 1. */
int cuda_gemv(cuda_ctx *c, float *out, size_t out_stride, const float *x, size_t x_stride, int n_tokens,
              const g4_matrix *w, const int32_t *ids, int n_slots, int x_div, int64_t expert_stride,
              int64_t row_offset, int n_experts, const float *gelu_mul, int64_t pair);
/* One product as the GEMV kernels take it (cuda_gemv's arguments; with
 * combine_w the MoE down projection's weighted sum of each token's
 * combine_k slots, as cuda_gemv_moe_down). */
struct cuda_gemv_req {
    const g4_matrix *w;
    const float *x;
    size_t x_stride;
    float *out;
    size_t out_stride;
    int n_tokens;
    const int32_t *ids;
    int n_slots, x_div;
    int64_t expert_stride, row_offset;
    int n_experts;
    const float *gelu_mul;
    int64_t pair;
    const float *combine_w;
    int combine_k;
};
/* Runs a plan of the tensor-core GEMVs (GEMV_FP16, GEMV_FP16_TOKENS,
 * GEMV_INT8, MOE_DOWN_FP16, MOE_DOWN_INT8: cuda_gemv_tc.cu, cuda_gemv_i8.cu),
 * its activation pre-pass first. */
void cuda_gemv_tc_launch(cuda_ctx *c, const g4_gemv_plan *p, const cuda_gemv_req *r);
/* The MoE experts' down projection (one token per slot, k slots per token,
 * expert ids on the device) with each token's weighted sum of its slots
 * written to out[t] (out_stride apart), as moe_combine_kernel adds them: 1
 * when done, 0 (nothing launched) where no kernel does both (see
 * g4_plan_gemv). */
int cuda_gemv_moe_down(cuda_ctx *c, float *out, size_t out_stride, const float *x, size_t x_stride,
                       const g4_matrix *w, const int32_t *ids, const float *weights, int n_slots, int k,
                       int64_t expert_stride, int64_t row_offset, int n_experts);
/* Whether the mma kernel below handles this matrix (format, alignment). */
int cuda_mma_supported(const g4_matrix *w, const float *x, size_t x_stride);
/* out[dst(m)][n] = sum_k W_e[n][k] x[src(m)][k] with bf16 tensor cores and
 * weights dequantised in the tile, over the grouped tiles g from
 * cuda_moe_sort (src = slot / x_div): the MoE experts' general prefill. */
typedef struct {
    const int32_t *sorted, *tile_expert, *tile_start, *tile_len, *n_tiles;
    const int32_t *expert_count; /* slots per expert (sorted holds expert 0's, then 1's, ...) */
    int max_tiles;
} cuda_groups;
void cuda_mma_gemm(cuda_ctx *c, float *out, size_t out_stride, const float *x, size_t x_stride, int x_div,
                   const g4_matrix *w, int64_t rows, int64_t expert_stride, int64_t row_offset, const cuda_groups *g);
/* Rows per tile of the grouped mma kernel. */
#define CUDA_MMA_GROUP_BM 64
/* hi[i] = bf16(x[i]), lo[i] = bf16(x[i] - hi[i]) (lo NULL: hi only); 0 on a failed launch. */
int cuda_split_bf16(cuda_ctx *c, __nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, size_t n);
/* The grouped product of cuda_mma_gemm for expert weights in bf16, MLX
 * affine 4/8-bit or MXFP4, with the activations already split (x_lo NULL:
 * one product), pipelined (cuda_moe_gemm.cu); supported: whether w's
 * format, shape and alignment suit it. */
int cuda_moe_gemm_supported(const g4_matrix *w);
/* The bf16 experts of cuda_moe_experts by cuBLAS's batched GEMM
 * (cuda_moe_cublas.cu): g = gelu(gate) * up per slot (g: scratch) and out =
 * each token's weighted sum of its experts' down projections. Returns 0,
 * having launched nothing, where it does not apply (other formats, fewer
 * tokens than c->tune.moe_cublas, or no more than a step run_step records). */
int cuda_moe_experts_cublas(cuda_ctx *c, float *out, float *g, const float *x, int n, const int32_t *ids,
                            const float *weights, int k, int n_experts, const g4_matrix *wg, const g4_matrix *wu,
                            const g4_matrix *wd, int64_t gate_stride, int64_t gate_offset, int64_t up_stride,
                            int64_t up_offset, int64_t down_stride, int64_t down_offset, const cuda_groups *groups);
void cuda_moe_gemm(cuda_ctx *c, float *out, size_t out_stride, const __nv_bfloat16 *x_hi, const __nv_bfloat16 *x_lo,
                   int x_div, const g4_matrix *w, int64_t rows, int64_t expert_stride, int64_t row_offset,
                   const cuda_groups *g);

/* attention and KV cache (cuda_attention.cu) */
void *cuda_kv_alloc(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim, g4_kv_type type);
void cuda_kv_free(g4_backend *be, void *kv);
void cuda_kv_store(g4_backend *be, void *kv, const float *k, const float *v, const g4_attn_batch *b, int sliding);
void cuda_attention(g4_backend *be, float *out, const float *q, const void *kv, const g4_attn_batch *b, int sliding,
                    int n_heads, float scale);
void cuda_kv_read(g4_backend *be, const void *kv, float *k, float *v, const g4_attn_batch *b, int sliding);
void cuda_kv_copy_blocks(g4_backend *be, void *kv, const int32_t *src, const int32_t *dst, int n);
void cuda_kv_save_blocks(g4_backend *be, const void *kv, const int32_t *blocks, int n, void *host);
void cuda_kv_load_blocks(g4_backend *be, void *kv, const int32_t *blocks, int n, const void *host);

/* a layer's attention input from its merged projection (cuda_qkv.cu) */
void cuda_qkv_prepare(g4_backend *be, float *q, const float *qkv, const g4_qkv_params *p, void *kv,
                      const g4_attn_batch *b, int sliding);

/* mixture of experts (cuda_moe.cu) */
void cuda_moe_route(g4_backend *be, int32_t *ids, float *weights, const float *logits, const float *expert_scale,
                    int n, int n_experts, int k);
void cuda_moe_experts(g4_backend *be, float *out, const float *x, int n, const int32_t *ids, const float *weights,
                      int k, const g4_expert_matrix *gate, const g4_expert_matrix *up, const g4_expert_matrix *down);

/* sampling support (cuda_sampling.cu) */
void cuda_top_logits(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                     int vocab, int k);
void cuda_top_logits_masked(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                            int vocab, int k, const uint32_t *masks, int mask_words, const int32_t *slot);

/* ---- device-side weights ---- */

/* A g4_matrix as the kernels see it. */
struct dev_matrix {
    const uint8_t *data, *scales, *biases;
    size_t row_bytes, scale_row_bytes;
    int format, bits, group_size, scale_dtype; /* scale_dtype: 0 bf16, 1 f16, 2 f32 */
    int64_t rows, cols;
};

static inline dev_matrix dev_matrix_of(const g4_matrix *m) {
    dev_matrix d;
    d.data = (const uint8_t *)m->data;
    d.scales = (const uint8_t *)m->scales;
    d.biases = (const uint8_t *)m->biases;
    d.row_bytes = m->row_bytes;
    d.scale_row_bytes = m->scale_row_bytes;
    d.format = (int)m->format;
    d.bits = m->bits;
    d.group_size = m->group_size;
    d.scale_dtype = m->scale_dtype == G4_DTYPE_F16 ? 1 : m->scale_dtype == G4_DTYPE_F32 ? 2 : 0;
    d.rows = m->rows;
    d.cols = m->cols;
    return d;
}

__device__ __forceinline__ float bf16_bits_to_float(uint32_t h) { return __uint_as_float(h << 16); }

/* A group's scale or bias in two steps: the stored bits (zero-extended),
 * then their value. Kernels that load ahead keep the bits and convert them
 * when used (a conversion right after the load waits for it there). */
__device__ __forceinline__ uint32_t load_group_bits(const uint8_t *row, int dtype, int64_t g) {
    if (dtype == 0 || dtype == 1) return ((const uint16_t *)row)[g];
    return ((const uint32_t *)row)[g];
}

__device__ __forceinline__ float group_bits_value(uint32_t bits, int dtype) {
    if (dtype == 0) return bf16_bits_to_float(bits);
    if (dtype == 1) return __half2float(__ushort_as_half((unsigned short)bits));
    return __uint_as_float(bits);
}

__device__ __forceinline__ float load_group_param(const uint8_t *row, int dtype, int64_t g) {
    return group_bits_value(load_group_bits(row, dtype, g), dtype);
}

/* 2^(e - 127) exactly, denormal for e = 0; NaN for 255 (OCP E8M0). */
__device__ __forceinline__ float e8m0_value(uint32_t e) {
    if (e == 255u) return __uint_as_float(0x7fc00000u);
    if (e == 0u) return __uint_as_float(0x00400000u);
    return __uint_as_float(e << 23);
}

/* E2M1: bits s e1 e0 m; value (-1)^s 2^(e-1) (1 + m/2), or m/2 when e = 0. */
__device__ __forceinline__ float e2m1_value(uint32_t code) {
    const float mag2 = (float)((0xC8643210u >> (4u * (code & 7u))) & 15u); /* twice the magnitude */
    return (code & 8u) ? -0.5f * mag2 : 0.5f * mag2;
}

/* Code c of a row stored as a little-endian bit stream of `bits`-bit codes. */
__device__ __forceinline__ uint32_t read_code(const uint8_t *row, int bits, int64_t c) {
    uint64_t bit = (uint64_t)c * (uint64_t)bits;
    const uint8_t *p = row + bit / 8;
    uint32_t shift = (uint32_t)(bit % 8);
    uint32_t v = (uint32_t)p[0] >> shift;
    if (shift + (uint32_t)bits > 8) v |= (uint32_t)p[1] << (8 - shift);
    return v & ((1u << bits) - 1u);
}

/* Element (r, c) as float, rounded exactly as the host reference
 * (g4_matrix_get): scale * q + bias without a fused multiply-add. */
__device__ __forceinline__ float dev_matrix_get(const dev_matrix &m, int64_t r, int64_t c) {
    const uint8_t *row = m.data + (size_t)r * m.row_bytes;
    switch (m.format) {
    case G4_WEIGHT_F32: return ((const float *)row)[c];
    case G4_WEIGHT_BF16: return bf16_bits_to_float(((const uint16_t *)row)[c]);
    case G4_WEIGHT_F16: return __half2float(((const __half *)row)[c]);
    case G4_WEIGHT_AFFINE: {
        const uint8_t *s = m.scales + (size_t)r * m.scale_row_bytes;
        const uint8_t *b = m.biases + (size_t)r * m.scale_row_bytes;
        int64_t g = c / m.group_size;
        float q = (float)read_code(row, m.bits, c);
        return __fadd_rn(__fmul_rn(load_group_param(s, m.scale_dtype, g), q), load_group_param(b, m.scale_dtype, g));
    }
    case G4_WEIGHT_MXFP4: {
        const uint8_t *s = m.scales + (size_t)r * m.scale_row_bytes;
        return __fmul_rn(e2m1_value(read_code(row, 4, c)), e8m0_value(s[c / m.group_size]));
    }
    }
    return __uint_as_float(0x7fc00000u);
}

/* 16 bytes of weights streamed past L1 (read once, keep L1 for activations). */
__device__ __forceinline__ uint4 load_stream16(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Asynchronous 16-byte copies global -> shared (cp.async, sm_80+): issue,
 * group, wait. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

/* 16 bytes, or 16 zero bytes when !copy (nothing is read then) */
__device__ __forceinline__ void cp_async16_or_zero(void *smem, const void *gmem, bool copy) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(copy ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* until at most N of this thread's newest groups are still in flight */
template <int N> __device__ __forceinline__ void cp_async_wait_newest() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 16-bit matrices from shared memory into mma fragments, one row
 * address per thread (threads 8i..8i+7: the rows of matrix i); .trans: each
 * matrix transposed. One instruction instead of four 32-bit loads per
 * fragment register. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const void *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* d += a b on tensor cores, bf16 operands (as mma_f16_16816 below). Not
 * volatile: the compiler may interleave independent products (a product
 * waits ~30 cycles for the one before it into the same d). */
__device__ __forceinline__ void mma_bf16(float *d, const uint32_t *a, const uint32_t *b) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* d += a b on tensor cores: a 16x16 fp16 A fragment (row-major), a 16x8
 * fp16 B fragment (column-major), float32 accumulators (PTX mma m16n8k16) */
__device__ __forceinline__ void mma_f16_16816(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
