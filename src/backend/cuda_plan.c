/* The CUDA backend's kernel choice for a matrix product (cuda_plan.h).
 * The numbers here are the kernels' own limits (cuda_matmul.cu,
 * cuda_gemv_tc.cu, cuda_gemv_i8.cu); why each choice wins is in
 * bench/RESULTS.md. */
#include "backend/cuda_plan.h"

#include <stddef.h>

enum {
    TC_WARPS = 4,              /* warps per block of the tensor-core GEMVs */
    TC_MOE_WARPS = 8,          /* ... of their MoE down projections: the most slots per token */
    TC_MAX_COUNTERS = 1 << 20, /* tiles x slots that may split their columns */
    GEMV_WARPS = 4,            /* warps per block of the float32 GEMV */
    GEMV_MOE_WARPS = 8,        /* the float MoE down projection's most slots per token */
};

static int is_quantised(const g4_matrix *w) { return w->format == G4_WEIGHT_AFFINE || w->format == G4_WEIGHT_MXFP4; }

/* the float32 kernels' format code: 0 when they have no fast kernel for it */
static int float_format_known(const g4_matrix *w) {
    switch (w->format) {
    case G4_WEIGHT_F32:
    case G4_WEIGHT_BF16:
    case G4_WEIGHT_F16: return 1;
    case G4_WEIGHT_AFFINE: return w->bits == 2 || w->bits == 4 || w->bits == 8;
    case G4_WEIGHT_MXFP4: return w->bits == 4;
    }
    return 0;
}

/* columns in 16 bytes of a row */
static int chunk_cols(const g4_matrix *w) {
    switch (w->format) {
    case G4_WEIGHT_F32: return 4;
    case G4_WEIGHT_BF16:
    case G4_WEIGHT_F16: return 8;
    case G4_WEIGHT_AFFINE: return w->bits == 8 ? 16 : w->bits == 2 ? 64 : 32;
    case G4_WEIGHT_MXFP4: return 32;
    }
    return 0;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

int g4_gemv_float_rows(const g4_matrix *w, int tokens) {
    const int aff2 = w->format == G4_WEIGHT_AFFINE && w->bits == 2;
    if (tokens == 1 && is_quantised(w) && !aff2) return 4; /* each activation load serves four rows */
    if (tokens == 1 && w->format == G4_WEIGHT_BF16) return 2; /* twice the blocks: whole waves */
    if (aff2) return 1;
    return is_quantised(w) ? 2 : 4;
}

int g4_gemv_float_min_blocks(const g4_matrix *w, int tokens) {
    const int aff2 = w->format == G4_WEIGHT_AFFINE && w->bits == 2;
    /* one token of 4 or 8 bits: enough warps to hide the loads, no spills */
    if (tokens == 1 && is_quantised(w) && !aff2) return w->format == G4_WEIGHT_AFFINE && w->bits == 8 ? 6 : 5;
    return 0;
}

/* whether the float32 kernels (not the generic one) take the layout */
static int float_fast(const g4_matrix *w, int x_aligned) {
    if (!float_format_known(w)) return 0;
    const int C = chunk_cols(w);
    if (w->cols % C != 0 || w->row_bytes != (size_t)(w->cols / C) * 16 || w->row_bytes % 16 != 0 ||
        !aligned16(w->data) || !x_aligned)
        return 0;
    if (is_quantised(w))
        return w->group_size > 0 && w->group_size % C == 0 && (w->format != G4_WEIGHT_MXFP4 || w->group_size == 32);
    return 1;
}

static int tokens_variant(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

/* the float32 GEMV (or the generic one); DECLINE for pairs it cannot form */
static g4_gemv_plan plan_float(const g4_cuda_caps *caps, const g4_cuda_tuning *t, const g4_gemv_shape *s) {
    g4_gemv_plan p = {G4_KERNEL_DECLINE, 0, 0, 0, 0, 0, 0, 1, 1};
    const g4_matrix *w = s->w;
    const int n = s->has_ids ? 1 : s->n_tokens, n_slots = s->has_ids ? s->n_slots : 1;
    const int fast = float_fast(w, s->x_aligned);
    const int aff2 = w->format == G4_WEIGHT_AFFINE && w->bits == 2;
    if (s->pair > 0 && (!fast || aff2)) return p; /* gated pairs need an even number of rows per warp */
    if (!fast) {
        p.kernel = G4_KERNEL_GEMV_GENERIC;
        p.tokens = n <= 1 ? 1 : n <= 4 ? 4 : 8;
        return p;
    }
    p.kernel = G4_KERNEL_GEMV_FLOAT;
    p.tokens = tokens_variant(n);
    p.rows = g4_gemv_float_rows(w, p.tokens);
    p.min_blocks = g4_gemv_float_min_blocks(w, p.tokens);
    /* columns over the whole block when whole-warp rows leave the GPU short of blocks */
    const int rows_out = s->pair > 0 ? p.rows / 2 : p.rows;
    const int quantised = is_quantised(w);
    if (t->gemv_split >= 0) {
        p.split = t->gemv_split;
    } else if (!quantised && n == 1 && w->cols >= 512) {
        p.split = 1;
    } else {
        const int64_t per_block = (int64_t)GEMV_WARPS * rows_out;
        const int64_t blocks = (w->rows + per_block - 1) / per_block * n_slots;
        p.split = blocks < (quantised ? 1 : 4) * (int64_t)caps->sm_count;
    }
    return p;
}

/* the tensor-core GEMVs; DECLINE where none takes the product */
static g4_gemv_plan plan_tensor_cores(const g4_cuda_caps *caps, const g4_cuda_tuning *t, const g4_gemv_shape *s) {
    g4_gemv_plan p = {G4_KERNEL_DECLINE, 0, 0, 0, 0, 0, 0, 1, 1};
    const g4_matrix *w = s->w;
    if (t->gemv == G4_CUDA_GEMV_FLOAT32 || (!s->has_ids && (s->n_tokens < 1 || s->n_tokens > 8))) return p;
    const int mx = w->format == G4_WEIGHT_MXFP4, bits = w->bits, gs = w->group_size;
    if (mx ? bits != 4 : !(w->format == G4_WEIGHT_AFFINE && (bits == 4 || bits == 8))) return p;
    if (mx ? gs != 32 : !(gs == 32 || gs == 64 || gs == 128)) return p;
    if (w->cols % 32 != 0 || w->cols % gs != 0 || w->row_bytes != (size_t)w->cols * bits / 8 ||
        !aligned16(w->data) || w->row_bytes % 16 != 0)
        return p;
    const int n_slots = s->has_ids ? s->n_slots : 1, n = s->has_ids ? 1 : s->n_tokens;
    /* one token of affine weights on integer tensor cores: 4 bits in groups
     * of 64 or 128 (32 would need 12 B columns), 8 bits in groups of 32 or 64
     * (128 spans two blocks) and only for large enough matrices */
    int i8 = n == 1 && !mx && t->gemv != G4_CUDA_GEMV_FP16;
    if (i8 && bits == 4) i8 = gs == 64 || gs == 128;
    if (i8 && bits == 8) i8 = (gs == 32 || gs == 64) && w->rows * w->cols * n_slots >= t->i8_min8;
    /* one token of 8 bits otherwise: the float32 GEMV is faster than fp16 tensor cores */
    if (bits == 8 && n == 1 && !i8) return p;
    const int k = s->combine_k;
    if (k > 0 && !((i8 || bits == 4) && s->has_ids && s->x_div <= 1 && s->pair == 0 && k <= TC_MOE_WARPS &&
                   n_slots % k == 0))
        return p;
    const int block_cols = bits == 8 ? 64 : 128;
    const int64_t n_blocks = (w->cols + block_cols - 1) / block_cols;
    p.bits = bits;
    p.tiles = (w->rows + (s->pair > 0 ? 7 : 15)) / (s->pair > 0 ? 8 : 16);
    /* the integer kernel's tiles read copies of the prepared activations (no more copies than tiles) */
    p.copies = i8 ? (int)(p.tiles < t->gemv_copies ? p.tiles : t->gemv_copies) : 1;
    /* columns in 2, 4 or 8 parts until four waves of blocks, each warp
     * keeping at least eight blocks of columns */
    const int per_sm = n == 1 ? 5 : 4; /* the kernels' launch bounds */
    p.parts = 1;
    while (p.parts < 8 && p.tiles * n_slots * p.parts < 4 * per_sm * (int64_t)caps->sm_count &&
           n_blocks >= 8 * TC_WARPS * p.parts * 2 && p.tiles * n_slots <= TC_MAX_COUNTERS)
        p.parts *= 2;
    p.tokens = tokens_variant(n);
    if (i8) p.rows = bits == 8 ? (gs == 32 ? 2 : 1) : (gs == 64 ? 2 : 1);
    if (k > 0)
        p.kernel = i8 ? G4_KERNEL_MOE_DOWN_INT8 : G4_KERNEL_MOE_DOWN_FP16;
    else if (i8)
        p.kernel = G4_KERNEL_GEMV_INT8;
    else if (bits == 4 && n == 1)
        p.kernel = G4_KERNEL_GEMV_FP16;
    else
        p.kernel = G4_KERNEL_GEMV_FP16_TOKENS;
    return p;
}

/* the float MoE down projection with the tokens' sums; DECLINE otherwise */
static g4_gemv_plan plan_float_moe_down(const g4_gemv_shape *s) {
    g4_gemv_plan p = {G4_KERNEL_DECLINE, 0, 0, 0, 0, 0, 0, 1, 1};
    const g4_matrix *w = s->w;
    const int k = s->combine_k;
    if (!(w->format == G4_WEIGHT_BF16 || w->format == G4_WEIGHT_F16 || w->format == G4_WEIGHT_F32)) return p;
    if (k < 1 || k > GEMV_MOE_WARPS || s->n_slots % k != 0) return p;
    const int C = chunk_cols(w);
    if (w->cols % C != 0 || w->row_bytes != (size_t)(w->cols / C) * 16 || !aligned16(w->data) || !s->x_aligned)
        return p;
    p.kernel = G4_KERNEL_MOE_DOWN_FLOAT;
    p.tokens = 1;
    return p;
}

int g4_plan_wgmma_q4(const g4_cuda_caps *caps, const g4_cuda_tuning *t, const g4_matrix *w, int exact) {
    if (!caps->wgmma || !t->wgmma || exact) return 0;
    if (w->format != G4_WEIGHT_AFFINE || w->bits != 4) return 0;
    if (w->cols <= 0 || w->cols % 64 || w->row_bytes != (size_t)w->cols / 2 || !aligned16(w->data)) return 0;
    if (w->rows > INT32_MAX) return 0;
    const int gs = w->group_size;
    return gs == 16 || gs == 32 || (gs >= 64 && gs % 64 == 0);
}

static g4_gemv_plan plan_gemm(const g4_cuda_caps *caps, const g4_cuda_tuning *t, const g4_gemv_shape *s) {
    g4_gemv_plan p = {G4_KERNEL_GEMM_DEQUANT, 0, 0, 0, 0, 0, 0, 1, 1};
    const g4_matrix *w = s->w;
    if (w->format == G4_WEIGHT_F32 && w->row_bytes % 4 == 0) p.kernel = G4_KERNEL_GEMM_F32;
    else if (w->format == G4_WEIGHT_BF16 && w->row_bytes % 2 == 0) p.kernel = G4_KERNEL_GEMM_BF16;
    else if (t->wgmma == 2 && g4_plan_wgmma_q4(caps, t, w, s->exact)) p.kernel = G4_KERNEL_GEMM_WGMMA4;
    return p;
}

g4_gemv_plan g4_plan_gemv(const g4_cuda_caps *caps, const g4_cuda_tuning *t, const g4_gemv_shape *s) {
    g4_gemv_plan skip = {G4_KERNEL_SKIP, 0, 0, 0, 0, 0, 0, 1, 1};
    if (s->w->rows <= 0 || (s->has_ids ? s->n_slots <= 0 : s->n_tokens <= 0)) return skip;
    if (!s->has_ids && s->n_tokens > 8) return plan_gemm(caps, t, s);
    const g4_gemv_plan tc = plan_tensor_cores(caps, t, s);
    if (tc.kernel != G4_KERNEL_DECLINE) return tc;
    if (s->combine_k > 0) return plan_float_moe_down(s);
    return plan_float(caps, t, s);
}

const char *g4_kernel_name(g4_kernel k) {
    static const char *const names[G4_KERNEL_COUNT] = {
        "decline",        "skip",           "gemv_generic",   "gemv_float",     "gemv_fp16",
        "gemv_fp16_tokens", "gemv_int8",    "moe_down_float", "moe_down_fp16",  "moe_down_int8",
        "gemm_f32",       "gemm_bf16",      "gemm_dequant",   "gemm_wgmma4"};
    return k >= 0 && k < G4_KERNEL_COUNT ? names[k] : "?";
}
