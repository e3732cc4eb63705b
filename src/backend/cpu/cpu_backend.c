/* The CPU backend: host memory, OpenMP threads, float32 arithmetic. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_audio_ops.h"
#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_norm.h"
#include "backend/cpu/cpu_qkv.h"
#include "backend/cpu/cpu_sampling.h"
#include "backend/cpu/cpu_vision_ops.h"

/* The CPU backend's one setting, reached through impl (so that a copy of the
 * g4_backend with other ops, as tests make, still finds it). */
typedef struct {
    g4_precision precision;
} cpu_state;

/* One allocation: the backend first, so that freeing a g4_backend * frees
 * all; its op table is cpu_ops completed with the defaults. */
typedef struct {
    g4_backend base;
    cpu_state state;
    g4_backend_ops ops;
} cpu_backend;

static void cpu_destroy(g4_backend *be) { free(be); }

/* FAST: bf16 and int8 products where the processor has them (cpu_fast.h),
 * float32 attention; EXACT: float32 products, float64 attention sums. */
static void cpu_set_precision(g4_backend *be, g4_precision precision) {
    ((cpu_state *)be->impl)->precision = precision;
}

g4_precision cpu_backend_precision(const g4_backend *be) { return ((const cpu_state *)be->impl)->precision; }

static void *cpu_alloc(g4_backend *be, size_t bytes) {
    (void)be;
    /* 64-byte alignment for SIMD loads; round the size up as aligned_alloc wants. */
    size_t padded = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, padded ? padded : 64);
}

static void cpu_release(g4_backend *be, void *ptr) {
    (void)be;
    free(ptr);
}

static void cpu_memcpy(g4_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}

static g4_status cpu_prepare_matrix(g4_backend *be, g4_matrix *m) {
    (void)be;
    (void)m; /* weights are used in place in the memory map */
    return G4_OK;
}

static void cpu_synchronize(g4_backend *be) { (void)be; }

static void cpu_matmul_op(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w) {
    cpu_matmul_with(cpu_backend_precision(be), out, x, n_tokens, w);
}

static void cpu_matmul_precise_op(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w) {
    (void)be;
    cpu_matmul_precise(out, x, n_tokens, w);
}

static void cpu_embed(g4_backend *be, float *out, const g4_matrix *table, const int32_t *ids, int n,
                      float scale) {
    (void)be;
#pragma omp parallel for schedule(static) if (n > 1)
    for (int i = 0; i < n; i++) cpu_matrix_row(table, ids[i], scale, out + (size_t)i * (size_t)table->cols);
}

static void cpu_rmsnorm(g4_backend *be, float *out, const float *x, const float *w, int rows, int dim,
                        float eps) {
    (void)be;
#pragma omp parallel for schedule(static) if (rows > 8)
    for (int r = 0; r < rows; r++) cpu_rmsnorm_row(out + (size_t)r * dim, x + (size_t)r * dim, w, dim, eps);
}

static void cpu_rope(g4_backend *be, float *x, int n_tokens, int n_heads, int head_dim, const int32_t *pos,
                     float theta, int n_pairs) {
    (void)be;
    const int half = head_dim / 2;
    if (n_pairs > half) n_pairs = half;
    if (n_pairs > CPU_ROPE_MAX_PAIRS) n_pairs = CPU_ROPE_MAX_PAIRS;
    if (n_pairs <= 0) return;
    float inv_freq[CPU_ROPE_MAX_PAIRS];
    cpu_rope_inv_freq(inv_freq, theta, head_dim, n_pairs);
#pragma omp parallel for schedule(static) if (n_tokens > 1)
    for (int t = 0; t < n_tokens; t++) {
        float cs[CPU_ROPE_MAX_PAIRS], sn[CPU_ROPE_MAX_PAIRS];
        cpu_rope_angles(cs, sn, pos[t], inv_freq, n_pairs);
        for (int h = 0; h < n_heads; h++)
            cpu_rope_head(x + ((size_t)t * n_heads + h) * head_dim, head_dim, cs, sn, n_pairs);
    }
}

static double gelu_tanh(double x) {
    const double k = 0.7978845608028654; /* sqrt(2/pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

static void cpu_gelu_mul(g4_backend *be, float *out, const float *gate, const float *up, size_t n) {
    const cpu_fast_table *f = cpu_fast_for(cpu_isa_active());
    if (cpu_backend_precision(be) == G4_PRECISION_FAST && f->gelu_mul) {
        enum { PIECE = 4096 };
        const int64_t pieces = ((int64_t)n + PIECE - 1) / PIECE;
#pragma omp parallel for schedule(static) if (pieces > 1)
        for (int64_t p = 0; p < pieces; p++) {
            const int64_t i = p * PIECE, m = (int64_t)n - i < PIECE ? (int64_t)n - i : PIECE;
            f->gelu_mul(out + i, gate + i, up + i, m);
        }
        return;
    }
#pragma omp parallel for schedule(static) if (n > 4096)
    for (size_t i = 0; i < n; i++) out[i] = (float)(gelu_tanh(gate[i]) * up[i]);
}

static void cpu_add_rmsnorm(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                            float scale, float *next_out, const float *next_w) {
#pragma omp parallel for schedule(static) if (rows > 8)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *hr = h + (size_t)r * dim;
        const double inv = cpu_row_inv_rms(xr, dim, eps);
        for (int i = 0; i < dim; i++) {
            const float y = (float)(xr[i] * inv * w[i]); /* cpu_rmsnorm's rounding */
            hr[i] = hr[i] + y;
            if (scale != 1.0f) hr[i] = hr[i] * scale;
        }
    }
    if (next_out) cpu_rmsnorm(be, next_out, h, next_w, rows, dim, eps);
}

static void cpu_add(g4_backend *be, float *out, const float *a, const float *b, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_scale(g4_backend *be, float *out, const float *a, float s, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) out[i] = a[i] * s;
}

static void cpu_mul_rows(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim) {
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dim; c++) out[(size_t)r * dim + c] = a[(size_t)r * dim + c] * v[c];
}

static void cpu_mul(g4_backend *be, float *out, const float *a, const float *b, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

static void cpu_softcap(g4_backend *be, float *x, size_t n, float cap) {
    const cpu_fast_table *f = cpu_fast_for(cpu_isa_active());
    if (cpu_backend_precision(be) == G4_PRECISION_FAST && f->softcap) {
        enum { PIECE = 16384 };
        const int64_t pieces = ((int64_t)n + PIECE - 1) / PIECE;
#pragma omp parallel for schedule(static) if (pieces > 2)
        for (int64_t p = 0; p < pieces; p++) {
            const int64_t i = p * PIECE;
            f->softcap(x + i, (int64_t)n - i < PIECE ? (int64_t)n - i : PIECE, cap);
        }
        return;
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

static void cpu_gather_rows(g4_backend *be, float *dst, const float *src, const int32_t *rows, int n, int dim) {
    (void)be;
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)i * dim, src + (size_t)rows[i] * dim, (size_t)dim * sizeof *dst);
}

static void cpu_scatter_rows(g4_backend *be, float *dst, const int32_t *rows, const float *src, int n, int dim) {
    (void)be;
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)rows[i] * dim, src + (size_t)i * dim, (size_t)dim * sizeof *dst);
}

static void cpu_copy_rows(g4_backend *be, float *dst, int dst_stride, const float *src, int src_stride, int rows,
                          int cols) {
    (void)be;
    for (int r = 0; r < rows; r++)
        memmove(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride, (size_t)cols * sizeof *dst);
}

/* What the CPU does itself; the fused ops it would only compose (matmul_gelu_mul,
 * rmsnorm_pair, rmsnorm_rope, moe_residual, ...), stacking (none: weights stay
 * in the memory map) and recording (none) are the defaults. */
static const g4_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .set_precision = cpu_set_precision,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .copy = cpu_memcpy,
    .prepare_matrix = cpu_prepare_matrix,
    .synchronize = cpu_synchronize,
    .matmul = cpu_matmul_op,
    .matmul_precise = cpu_matmul_precise_op,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .add_rmsnorm = cpu_add_rmsnorm,
    .gelu_mul = cpu_gelu_mul,
    .add = cpu_add,
    .scale = cpu_scale,
    .mul_rows = cpu_mul_rows,
    .mul = cpu_mul,
    .softcap = cpu_softcap,
    .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows,
    .copy_rows = cpu_copy_rows,
    .top_logits = cpu_top_logits,
    .kv_alloc = cpu_kv_alloc,
    .kv_free = cpu_kv_free,
    .kv_store = cpu_kv_store,
    .kv_read = cpu_kv_read,
    .kv_copy_blocks = cpu_kv_copy_blocks,
    .kv_save_blocks = cpu_kv_save_blocks,
    .kv_load_blocks = cpu_kv_load_blocks,
    .qkv_prepare = cpu_qkv_prepare,
    .attention = cpu_attention,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    /* vision tower */
    .affine = cpu_affine,
    .rope_2d = cpu_rope_2d,
    .pool_rows = cpu_pool_rows,
    /* audio tower (clamp and add_rows serve the vision tower too) */
    .scale_rows = cpu_scale_rows,
    .add_rows = cpu_add_rows,
    .clamp = cpu_clamp,
    .relu = cpu_relu,
    .silu = cpu_silu,
    .glu = cpu_glu,
    .layer_norm = cpu_layer_norm,
    .conv2d = cpu_conv2d,
    .depthwise_conv1d_causal = cpu_depthwise_conv1d_causal,
    .chunked_attention = cpu_chunked_attention,
    /* constrained decoding (issue 31) */
    .top_logits_masked = cpu_top_logits_masked,
};

g4_status g4_backend_cpu_create(int threads, g4_backend **out) {
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    cb->ops = cpu_ops;
    g4_backend_fill_defaults(&cb->ops);
    cb->base.ops = &cb->ops;
    cb->base.impl = &cb->state;
    cb->state.precision = G4_PRECISION_EXACT;
    if (threads > 0) omp_set_num_threads(threads);
    *out = &cb->base;
    return G4_OK;
}

void g4_backend_destroy(g4_backend *be) {
    if (be) be->ops->destroy(be);
}
