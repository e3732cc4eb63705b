/* Which CUDA kernel multiplies a matrix, decided before anything runs: a
 * pure function of the weights' format and shape, the tokens, the device's
 * capabilities and the tuning (cuda_tuning.h). The CUDA backend plans, then
 * launches exactly the planned kernel (cuda_matmul.cu); tests check the
 * plans from a table without a GPU (tests/unit/test_cuda_plan.c). Plain C. */
#ifndef G4_BACKEND_CUDA_PLAN_H
#define G4_BACKEND_CUDA_PLAN_H

#include <stdint.h>

#include "backend/cuda_tuning.h"
#include "tensor/matrix.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    G4_KERNEL_DECLINE = 0, /* no kernel takes the product as asked: the caller runs it another way */
    G4_KERNEL_SKIP,        /* nothing to compute (no rows or no slots) */
    /* decode, 1..8 tokens or one token per MoE slot */
    G4_KERNEL_GEMV_GENERIC, /* gemv_generic_kernel<tokens>: any format and alignment, element by element */
    G4_KERNEL_GEMV_FLOAT,   /* gemv_kernel<format, tokens, rows, split, min_blocks>: float32 math */
    G4_KERNEL_GEMV_FP16,    /* gemv_tc_pipe_kernel: one token of 4 bits on fp16 tensor cores */
    G4_KERNEL_GEMV_FP16_TOKENS, /* gemv_tc_tokens_kernel<bits, tokens>: 2..8 tokens of 4 or 8 bits */
    G4_KERNEL_GEMV_INT8,        /* gemv_i8_kernel<bits, slots>: one token of affine weights, integer mma */
    /* the MoE down projection with each token's weighted sum of its k slots */
    G4_KERNEL_MOE_DOWN_FLOAT, /* gemv_moe_down_kernel: bf16, f16, f32 */
    G4_KERNEL_MOE_DOWN_FP16,  /* gemv_tc_moe_down_kernel: 4 bits */
    G4_KERNEL_MOE_DOWN_INT8,  /* gemv_i8_moe_down_kernel */
    /* prefill, more than 8 tokens */
    G4_KERNEL_GEMM_F32,     /* cuBLAS float32 GEMM */
    G4_KERNEL_GEMM_BF16,    /* activations split into bf16 parts, cuBLAS bf16 GEMMs */
    G4_KERNEL_GEMM_DEQUANT, /* weights dequantised to bf16 in row chunks, then as GEMM_BF16 */
    G4_KERNEL_GEMM_WGMMA4,  /* wgmma_q4_kernel: 4-bit affine codes decoded in the warpgroup GEMM's main loop
                               (dense: only with wgmma=2, measured slower than GEMM_DEQUANT; the MoE experts' default) */
    G4_KERNEL_COUNT
} g4_kernel;

/* One product: out = W x for n_tokens tokens, or with ids one token per
 * MoE slot (expert ids on the device). */
typedef struct {
    const g4_matrix *w; /* with ids: one expert's rows */
    int n_tokens;       /* tokens of dense weights (1 with ids) */
    int has_ids;        /* MoE slots */
    int n_slots;        /* with ids */
    int x_div;          /* with ids: slot s reads activation row s / x_div */
    int x_aligned;      /* the activations are 16-byte aligned, their stride a multiple of 4 floats */
    int64_t pair;       /* > 0: gated pairs, up rows this many rows past the gate rows */
    int combine_k;      /* > 0: the MoE down projection with the tokens' sums over k slots each */
    int exact;          /* prefill in the exact precision (split bf16 products) */
} g4_gemv_shape;

typedef struct {
    g4_kernel kernel;
    int tokens;     /* the kernel's token count (template): 1, 2, 4 or 8 */
    int rows;       /* GEMV_FLOAT: rows per warp; GEMV_INT8: groups per block (1 or 2) */
    int split;      /* GEMV_FLOAT: columns split over the block's threads */
    int min_blocks; /* GEMV_FLOAT: blocks per multiprocessor it is compiled for (0: the compiler's) */
    int bits;       /* tensor-core kernels: 4 or 8 */
    int64_t tiles;  /* tensor-core kernels: 16-row tiles (8 with pairs) */
    int parts;      /* tensor-core kernels: column parts per tile */
    int copies;     /* tensor-core kernels: copies of the prepared activations */
} g4_gemv_plan;

g4_gemv_plan g4_plan_gemv(const g4_cuda_caps *caps, const g4_cuda_tuning *t, const g4_gemv_shape *s);

/* Whether the warpgroup GEMM of 4-bit weights (G4_KERNEL_GEMM_WGMMA4) takes
 * prefill products of w: the device runs this build's sm_90a code, the
 * tuning allows it, the fast precision (not exact), and w's layout suits it
 * (4-bit affine codes in whole rows of 64-column tiles, 16-byte aligned,
 * groups of 16, 32 or a multiple of 64 columns). The MoE experts' grouped
 * product asks it; the dense plan only with wgmma=2. */
int g4_plan_wgmma_q4(const g4_cuda_caps *caps, const g4_cuda_tuning *t, const g4_matrix *w, int exact);


/* The kernel's name as above ("gemv_float", ...). */
const char *g4_kernel_name(g4_kernel k);

/* Rows per warp and launch bound of the float32 GEMV for `tokens` tokens of
 * this format (the instantiations cuda_matmul.cu compiles). */
int g4_gemv_float_rows(const g4_matrix *w, int tokens);
int g4_gemv_float_min_blocks(const g4_matrix *w, int tokens);

#ifdef __cplusplus
}
#endif
#endif
