/* The warpgroup (wgmma) GEMM of 4-bit affine weights for prefill
 * (cuda_wgmma.cu); g4_plan_gemv plans it (G4_KERNEL_GEMM_WGMMA4) where
 * g4_cuda_caps.wgmma says this build's sm_90a code runs on the device. */
#pragma once

#include "backend/cuda/cuda_internal.cuh"

/* whether the kernel has sm_90a machine code in this build that the current device runs */
int cuda_wgmma_available(void);
/* out[t * ldo + r] = sum_c W[r][c] x[t][c] for n_tokens rows of bf16 x (w->cols apart) */
void cuda_wgmma_q4_gemm(cuda_ctx *c, float *out, size_t ldo, const __nv_bfloat16 *x, int n_tokens,
                        const g4_matrix *w);
/* The MoE experts' grouped product (cuda_mma_gemm's operands, the activations already bf16): for each slot s of
 * g's tiles, out[s * ldo + r] = sum_c W_e[r][c] x[s / x_div][c], r < rows, W_e's row r being w's row
 * e * expert_stride + row_offset + r for the slot's expert e. */
void cuda_wgmma_q4_grouped(cuda_ctx *c, float *out, size_t ldo, const __nv_bfloat16 *x, int x_div,
                           const g4_matrix *w, int64_t rows, int64_t expert_stride, int64_t row_offset,
                           const cuda_groups *g);
