/* The integer tensor-core GEMV (cuda_gemv_i8.cu): one token of affine
 * weights, 4 bits in groups of 64 or 128 columns, 8 bits in groups of 32 or
 * 64; cuda_gemv_tc_launch runs it where g4_plan_gemv planned it. */
#pragma once

#include "backend/cuda/cuda_gemv_tc.cuh"

/* uint4 of prepared activations per activation row (blocks of 128 columns
 * for 4 bits, 64 for 8) */
size_t cuda_gemv_i8_prepared_uint4(int n_blocks, int bits);
/* the pre-pass: n_x rows of x (x_stride apart) into prepared, `copies` times
 * (n_x rows apart), with route's MoE routing in an extra block when route.n > 0 */
void cuda_gemv_i8_prepare(cuda_ctx *c, uint4 *prepared, const float *x, size_t x_stride, int64_t cols, int n_blocks,
                          int n_x, int group_cols, int copies, int bits, const cuda_moe_route_job &route);
/* the GEMV over a's tiles and parts, one grid row per MoE slot */
void cuda_gemv_i8_launch(cuda_ctx *c, const gemv_tc_args &a, int n_slots, int scale_dtype);
/* the MoE down projection with each token's weighted sum of its k experts
 * (gemv_i8_moe_down_kernel; k <= TC_MOE_WARPS) */
void cuda_gemv_i8_moe_down_launch(cuda_ctx *c, const gemv_tc_args &a, int n_tokens, const float *weights, int k,
                                  int scale_dtype);
