/* The CUDA backend's kernel planner (backend/cuda_plan.h), no GPU needed:
 * a table of products (format, shape, tokens, MoE slots, pairs, the MoE
 * down projection's sums, device, tuning) and the kernel each must get,
 * with its template parameters, column parts and copies. The expectations
 * are the choices the dispatch made before it became a planner (main at
 * e8444e9: cuda_matmul.cu -> cuda_gemv_tc.cu -> cuda_gemv_i8.cu with the
 * default knobs), worked out case by case from that code; the comment on
 * each row says which rule decides it. */
#include <stdint.h>
#include <string.h>

#include "backend/cuda_plan.h"
#include "test_util.h"

enum { ANY = -1 };

typedef struct {
    const char *what;
    g4_weight_format f;
    int bits, group;
    int64_t rows, cols;
    int misaligned; /* weights 8 bytes off a 16-byte boundary */
    int x_aligned;
    int n_tokens, has_ids, n_slots, x_div;
    int64_t pair;
    int combine_k;
    const char *tune; /* overrides, or NULL */
    int sm_count;     /* 0: the H200's 132 */
    /* expected; ANY: not checked */
    g4_kernel kernel;
    int tokens, rows_per, split, min_blocks, tc_bits;
    int64_t tiles;
    int parts, copies;
} plan_case;

#define DENSE(n) n, 0, 1, 1
#define SLOTS(s, div) 1, 1, s, div

static const plan_case cases[] = {
    /* ---- float formats, dense ---- */
    /* one token of bf16: two rows per warp; 512+ columns always split */
    {"bf16 E2B q", G4_WEIGHT_BF16, 0, 0, 2048, 1536, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 1, 0, 0, 0, 1, 1},
    /* under 512 columns: split when whole-warp rows give fewer than 4 blocks per SM (192 < 528) */
    {"bf16 1536x256", G4_WEIGHT_BF16, 0, 0, 1536, 256, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 1, 0, 0, 0, 1, 1},
    /* two tokens: four rows per warp, 16384 blocks: no split */
    {"bf16 head n=2", G4_WEIGHT_BF16, 0, 0, 262144, 1536, 0, 1, DENSE(2), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 2, 4, 0, 0, 0, 0, 1, 1},
    /* 256 blocks < 528: split; on 16 SMs (256 >= 64) not */
    {"bf16 n=2 split", G4_WEIGHT_BF16, 0, 0, 4096, 1536, 0, 1, DENSE(2), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 2, 4, 1, 0, 0, 0, 1, 1},
    {"bf16 n=2 16 SMs", G4_WEIGHT_BF16, 0, 0, 4096, 1536, 0, 1, DENSE(2), 0, 0, NULL, 16, G4_KERNEL_GEMV_FLOAT, 2, 4, 0, 0, 0, 0, 1, 1},
    /* exactly 512 columns: split although the rows alone give plenty of blocks */
    {"bf16 x512 split", G4_WEIGHT_BF16, 0, 0, 262144, 512, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 1, 0, 0, 0, 1, 1},
    {"f32 n=3", G4_WEIGHT_F32, 0, 0, 100, 64, 0, 1, DENSE(3), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 4, 4, 1, 0, 0, 0, 1, 1},
    {"f16 n=5", G4_WEIGHT_F16, 0, 0, 16384, 4096, 0, 1, DENSE(5), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 8, 4, 0, 0, 0, 0, 1, 1},
    {"f16 n=1", G4_WEIGHT_F16, 0, 0, 16384, 4096, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 4, 1, 0, 0, 0, 1, 1},
    /* ---- 4 bits, dense ---- */
    /* affine groups of 64 / 128, one token: integer mma; groups per block 2 / 1; copies min(tiles, 4) */
    {"aff4 g64 E2B q", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 128, 1, 4},
    {"aff4 g128 31B", G4_WEIGHT_AFFINE, 4, 128, 21504, 5376, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 1, 0, 0, 4, 1344, 1, 4},
    /* wide rows: column parts until 4 waves or fewer than 8 blocks per warp (168 blocks: 4 parts) */
    {"aff4 g64 wide", G4_WEIGHT_AFFINE, 4, 64, 72, 21504, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 5, 4, 4},
    /* one tile: one copy */
    {"aff4 g64 16 rows", G4_WEIGHT_AFFINE, 4, 64, 16, 1536, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 1, 1, 1},
    /* groups of 32 and MXFP4: the pipelined fp16 kernel, one copy */
    {"aff4 g32", G4_WEIGHT_AFFINE, 4, 32, 2048, 1536, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16, 1, 0, 0, 0, 4, 128, 1, 1},
    {"mxfp4", G4_WEIGHT_MXFP4, 4, 32, 2048, 1536, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16, 1, 0, 0, 0, 4, 128, 1, 1},
    {"mxfp4 wide", G4_WEIGHT_MXFP4, 4, 32, 72, 21504, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16, 1, 0, 0, 0, 4, 5, 4, 1},
    /* several tokens: the fp16 tokens kernel (2, 4, 8) */
    {"mxfp4 n=3", G4_WEIGHT_MXFP4, 4, 32, 2048, 1536, 0, 1, DENSE(3), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16_TOKENS, 4, 0, 0, 0, 4, 128, 1, 1},
    {"aff4 g64 n=2", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(2), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16_TOKENS, 2, 0, 0, 0, 4, 128, 1, 1},
    {"aff4 g128 n=8", G4_WEIGHT_AFFINE, 4, 128, 72, 21504, 0, 1, DENSE(8), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16_TOKENS, 8, 0, 0, 0, 4, 5, 4, 1},
    /* several tokens: 4 blocks per SM count the waves (1100 tiles x 2 parts >= 4 x 4 x 132: no third doubling) */
    {"mxfp4 n=2 parts", G4_WEIGHT_MXFP4, 4, 32, 17600, 16384, 0, 1, DENSE(2), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16_TOKENS, 2, 0, 0, 0, 4, 1100, 2, 1},
    /* ... and 5 for one token (2200 < 4 x 5 x 132: 4 parts) */
    {"mxfp4 n=1 parts", G4_WEIGHT_MXFP4, 4, 32, 17600, 16384, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16, 1, 0, 0, 0, 4, 1100, 4, 1},
    /* ---- 8 bits, dense ---- */
    /* one token under 2^25 weights: the float32 GEMV, four rows, 6 blocks per SM (128 blocks < 132: split) */
    {"aff8 g64 small", G4_WEIGHT_AFFINE, 8, 64, 2048, 1536, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 4, 1, 6, 0, 0, 1, 1},
    {"aff8 g64 small min8=0", G4_WEIGHT_AFFINE, 8, 64, 2048, 1536, 0, 1, DENSE(1), 0, 0, "i8_min8=0", 0, G4_KERNEL_GEMV_INT8, 1, 1, 0, 0, 8, 128, 1, 4},
    /* from 2^25 weights: integer mma (84 blocks of 64 columns: 2 parts) */
    {"aff8 g64 31B", G4_WEIGHT_AFFINE, 8, 64, 21504, 5376, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 1, 0, 0, 8, 1344, 2, 4},
    {"aff8 g32 31B", G4_WEIGHT_AFFINE, 8, 32, 21504, 5376, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 8, 1344, 2, 4},
    /* groups of 128 never on the integer kernel: float32, no split (1344 blocks) */
    {"aff8 g128 31B", G4_WEIGHT_AFFINE, 8, 128, 21504, 5376, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 4, 0, 6, 0, 0, 1, 1},
    /* several tokens: the fp16 tokens kernel */
    {"aff8 g64 n=2", G4_WEIGHT_AFFINE, 8, 64, 2048, 1536, 0, 1, DENSE(2), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16_TOKENS, 2, 0, 0, 0, 8, 128, 1, 1},
    {"aff8 g128 n=6", G4_WEIGHT_AFFINE, 8, 128, 21504, 5376, 0, 1, DENSE(6), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16_TOKENS, 8, 0, 0, 0, 8, 1344, 2, 1},
    /* ---- other formats and layouts ---- */
    /* 2 bits: float32, one row per warp */
    {"aff2 n=1", G4_WEIGHT_AFFINE, 2, 64, 1000, 2048, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 1, 0, 0, 0, 0, 1, 1},
    {"aff2 n=4", G4_WEIGHT_AFFINE, 2, 64, 100, 2048, 0, 1, DENSE(4), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 4, 1, 1, 0, 0, 0, 1, 1},
    /* 2 bits in groups of 32 (shorter than a 16-byte chunk), 3 bits, columns not a multiple of a chunk, unaligned data or activations: element by element */
    {"aff2 g32", G4_WEIGHT_AFFINE, 2, 32, 100, 2048, 0, 1, DENSE(4), 0, 0, NULL, 0, G4_KERNEL_GEMV_GENERIC, 4, 0, 0, 0, 0, 0, 1, 1},
    {"aff3", G4_WEIGHT_AFFINE, 3, 64, 100, 256, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_GENERIC, 1, 0, 0, 0, 0, 0, 1, 1},
    {"bf16 odd cols", G4_WEIGHT_BF16, 0, 0, 24, 70, 0, 1, DENSE(3), 0, 0, NULL, 0, G4_KERNEL_GEMV_GENERIC, 4, 0, 0, 0, 0, 0, 1, 1},
    {"bf16 x unaligned", G4_WEIGHT_BF16, 0, 0, 2048, 1536, 0, 0, DENSE(6), 0, 0, NULL, 0, G4_KERNEL_GEMV_GENERIC, 8, 0, 0, 0, 0, 0, 1, 1},
    {"aff4 w unaligned", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 1, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_GENERIC, 1, 0, 0, 0, 0, 0, 1, 1},
    /* x alignment does not matter to the tensor-core kernels */
    {"aff4 x unaligned", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 0, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 128, 1, 4},
    /* ---- gated pairs ---- */
    {"bf16 pairs", G4_WEIGHT_BF16, 0, 0, 2048, 1536, 0, 1, DENSE(1), 2048, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 1, 0, 0, 0, 1, 1},
    /* pairs: 8-row tiles */
    {"aff4 pairs", G4_WEIGHT_AFFINE, 4, 64, 2112, 2816, 0, 1, DENSE(1), 2112, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 264, 1, 4},
    {"aff8 pairs small", G4_WEIGHT_AFFINE, 8, 64, 128, 256, 0, 1, DENSE(1), 128, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 4, 1, 6, 0, 0, 1, 1},
    /* one row per warp cannot pair; nor can the generic kernel: the caller runs both halves */
    {"aff2 pairs", G4_WEIGHT_AFFINE, 2, 64, 1000, 2048, 0, 1, DENSE(1), 1000, 0, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"bf16 odd pairs", G4_WEIGHT_BF16, 0, 0, 24, 70, 0, 1, DENSE(1), 24, 0, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    /* ---- MoE slots (26B-A4B widths: 704 x 2816 gate/up, 2816 x 704 down) ---- */
    {"aff4 g64 slots", G4_WEIGHT_AFFINE, 4, 64, 704, 2816, 0, 1, SLOTS(8, 8), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 44, 1, 4},
    {"mxfp4 slots", G4_WEIGHT_MXFP4, 4, 32, 704, 2816, 0, 1, SLOTS(8, 8), 0, 0, NULL, 0, G4_KERNEL_GEMV_FP16, 1, 0, 0, 0, 4, 44, 1, 1},
    /* slots of 8 bits below 2^25 weights (rows x columns x slots): float32; 352 blocks: no split */
    {"aff8 slots 8", G4_WEIGHT_AFFINE, 8, 64, 704, 2816, 0, 1, SLOTS(8, 8), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 4, 0, 6, 0, 0, 1, 1},
    {"aff8 slots 32", G4_WEIGHT_AFFINE, 8, 64, 704, 2816, 0, 1, SLOTS(32, 8), 0, 0, NULL, 0, G4_KERNEL_GEMV_INT8, 1, 1, 0, 0, 8, 44, 1, 4},
    {"bf16 slots", G4_WEIGHT_BF16, 0, 0, 704, 2816, 0, 1, SLOTS(8, 8), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 1, 0, 0, 0, 1, 1},
    {"bf16 slots narrow", G4_WEIGHT_BF16, 0, 0, 2816, 256, 0, 1, SLOTS(8, 1), 0, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 0, 0, 0, 0, 1, 1},
    {"bf16 stacked slots", G4_WEIGHT_BF16, 0, 0, 704, 2816, 0, 1, SLOTS(8, 8), 704, 0, NULL, 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 1, 0, 0, 0, 1, 1},
    /* ---- the MoE down projection with the tokens' sums ---- */
    {"aff4 g64 down", G4_WEIGHT_AFFINE, 4, 64, 2816, 704, 0, 1, SLOTS(8, 1), 0, 8, NULL, 0, G4_KERNEL_MOE_DOWN_INT8, 1, 2, 0, 0, 4, 176, 1, 4},
    {"aff4 g32 down", G4_WEIGHT_AFFINE, 4, 32, 2816, 704, 0, 1, SLOTS(24, 1), 0, 8, NULL, 0, G4_KERNEL_MOE_DOWN_FP16, 1, 0, 0, 0, 4, 176, 1, 1},
    {"mxfp4 down", G4_WEIGHT_MXFP4, 4, 32, 2816, 704, 0, 1, SLOTS(8, 1), 0, 8, NULL, 0, G4_KERNEL_MOE_DOWN_FP16, 1, 0, 0, 0, 4, 176, 1, 1},
    {"aff8 down 32 slots", G4_WEIGHT_AFFINE, 8, 64, 2816, 704, 0, 1, SLOTS(32, 1), 0, 8, NULL, 0, G4_KERNEL_MOE_DOWN_INT8, 1, 1, 0, 0, 8, 176, 1, 4},
    {"bf16 down", G4_WEIGHT_BF16, 0, 0, 2816, 704, 0, 1, SLOTS(8, 1), 0, 8, NULL, 0, G4_KERNEL_MOE_DOWN_FLOAT, 1, 0, 0, 0, 0, 0, 1, 1},
    {"f32 down k=3", G4_WEIGHT_F32, 0, 0, 130, 96, 0, 1, SLOTS(9, 1), 0, 3, NULL, 0, G4_KERNEL_MOE_DOWN_FLOAT, 1, 0, 0, 0, 0, 0, 1, 1},
    /* no kernel sums: more than 8 slots a token, slots not a multiple of k, 8 bits under 2^25, odd widths */
    {"aff4 down k=10", G4_WEIGHT_AFFINE, 4, 64, 256, 512, 0, 1, SLOTS(10, 1), 0, 10, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"bf16 down k=10", G4_WEIGHT_BF16, 0, 0, 256, 512, 0, 1, SLOTS(10, 1), 0, 10, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"bf16 down 9 of k=2", G4_WEIGHT_BF16, 0, 0, 256, 512, 0, 1, SLOTS(9, 1), 0, 2, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff4 down x_div=2", G4_WEIGHT_AFFINE, 4, 64, 2816, 704, 0, 1, SLOTS(8, 2), 0, 8, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff8 down 8 slots", G4_WEIGHT_AFFINE, 8, 64, 2816, 704, 0, 1, SLOTS(8, 1), 0, 8, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"bf16 down odd", G4_WEIGHT_BF16, 0, 0, 72, 24, 0, 1, SLOTS(4, 1), 0, 2, NULL, 0, G4_KERNEL_MOE_DOWN_FLOAT, 1, 0, 0, 0, 0, 0, 1, 1},
    {"bf16 down odd cols", G4_WEIGHT_BF16, 0, 0, 72, 20, 0, 1, SLOTS(4, 1), 0, 2, NULL, 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    /* ---- prefill: more than 8 tokens ---- */
    {"bf16 pp", G4_WEIGHT_BF16, 0, 0, 2048, 1536, 0, 1, DENSE(512), 0, 0, NULL, 0, G4_KERNEL_GEMM_BF16, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"f32 pp", G4_WEIGHT_F32, 0, 0, 100, 64, 0, 1, DENSE(9), 0, 0, NULL, 0, G4_KERNEL_GEMM_F32, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"f16 pp", G4_WEIGHT_F16, 0, 0, 100, 64, 0, 1, DENSE(9), 0, 0, NULL, 0, G4_KERNEL_GEMM_DEQUANT, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    /* 4 bits: the warpgroup GEMM where the build's sm_90a code runs (these caps say it does), whole 64-column k tiles, groups of 16, 32 or a multiple of 64 */
    /*     dense 4 bits: the dequantising pass by default (the warpgroup GEMM measured slower there: 31B pp512 4,074 vs 5,092 t/s), the warpgroup GEMM with wgmma=2 where it fits (whole 64-column tiles, aligned) */
    {"aff4 pp 31B gate|up", G4_WEIGHT_AFFINE, 4, 64, 43008, 5376, 0, 1, DENSE(512), 0, 0, NULL, 0, G4_KERNEL_GEMM_DEQUANT, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff4 pp", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(64), 0, 0, NULL, 0, G4_KERNEL_GEMM_DEQUANT, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff4 pp wgmma=2", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(64), 0, 0, "wgmma=2", 0, G4_KERNEL_GEMM_WGMMA4, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff4 g128 pp wgmma=2", G4_WEIGHT_AFFINE, 4, 128, 21504, 5376, 0, 1, DENSE(512), 0, 0, "wgmma=2", 0, G4_KERNEL_GEMM_WGMMA4, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff4 pp 96 cols wgmma=2", G4_WEIGHT_AFFINE, 4, 32, 100, 96, 0, 1, DENSE(9), 0, 0, "wgmma=2", 0, G4_KERNEL_GEMM_DEQUANT, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff4 pp unaligned wgmma=2", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 1, 1, DENSE(64), 0, 0, "wgmma=2", 0, G4_KERNEL_GEMM_DEQUANT, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"aff8 pp", G4_WEIGHT_AFFINE, 8, 64, 2048, 1536, 0, 1, DENSE(64), 0, 0, NULL, 0, G4_KERNEL_GEMM_DEQUANT, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"mxfp4 pp", G4_WEIGHT_MXFP4, 4, 32, 2048, 1536, 0, 1, DENSE(300), 0, 0, NULL, 0, G4_KERNEL_GEMM_DEQUANT, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    /* ---- nothing to do ---- */
    {"no rows", G4_WEIGHT_BF16, 0, 0, 0, 1536, 0, 1, DENSE(1), 0, 0, NULL, 0, G4_KERNEL_SKIP, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    {"no slots", G4_WEIGHT_AFFINE, 4, 64, 704, 2816, 0, 1, SLOTS(0, 8), 0, 0, NULL, 0, G4_KERNEL_SKIP, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    /* ---- test hooks and thresholds ---- */
    /* everything on float32: one token of 4 bits four rows per warp, 5 blocks per SM */
    {"aff4 gemv=float32", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(1), 0, 0, "gemv=float32", 0, G4_KERNEL_GEMV_FLOAT, 1, 4, 1, 5, 0, 0, 1, 1},
    {"mxfp4 gemv=float32 n=2", G4_WEIGHT_MXFP4, 4, 32, 21504, 5376, 0, 1, DENSE(2), 0, 0, "gemv=float32", 0, G4_KERNEL_GEMV_FLOAT, 2, 2, 0, 0, 0, 0, 1, 1},
    {"aff4 down gemv=float32", G4_WEIGHT_AFFINE, 4, 64, 2816, 704, 0, 1, SLOTS(8, 1), 0, 8, "gemv=float32", 0, G4_KERNEL_DECLINE, ANY, ANY, ANY, ANY, ANY, ANY, ANY, ANY},
    /* no integer kernel: 4 bits on the fp16 one, 8 bits float32 */
    {"aff4 gemv=fp16", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(1), 0, 0, "gemv=fp16", 0, G4_KERNEL_GEMV_FP16, 1, 0, 0, 0, 4, 128, 1, 1},
    {"aff4 down gemv=fp16", G4_WEIGHT_AFFINE, 4, 64, 2816, 704, 0, 1, SLOTS(8, 1), 0, 8, "gemv=fp16", 0, G4_KERNEL_MOE_DOWN_FP16, 1, 0, 0, 0, 4, 176, 1, 1},
    {"aff8 gemv=fp16", G4_WEIGHT_AFFINE, 8, 64, 21504, 5376, 0, 1, DENSE(1), 0, 0, "gemv=fp16", 0, G4_KERNEL_GEMV_FLOAT, 1, 4, 0, 6, 0, 0, 1, 1},
    {"bf16 gemv_split=0", G4_WEIGHT_BF16, 0, 0, 2048, 1536, 0, 1, DENSE(1), 0, 0, "gemv_split=0", 0, G4_KERNEL_GEMV_FLOAT, 1, 2, 0, 0, 0, 0, 1, 1},
    {"bf16 gemv_split=1", G4_WEIGHT_BF16, 0, 0, 262144, 1536, 0, 1, DENSE(2), 0, 0, "gemv_split=1", 0, G4_KERNEL_GEMV_FLOAT, 2, 4, 1, 0, 0, 0, 1, 1},
    {"aff4 gemv_copies=1", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(1), 0, 0, "gemv_copies=1", 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 128, 1, 1},
    {"aff4 gemv_copies=64", G4_WEIGHT_AFFINE, 4, 64, 2048, 1536, 0, 1, DENSE(1), 0, 0, "gemv_copies=64", 0, G4_KERNEL_GEMV_INT8, 1, 2, 0, 0, 4, 128, 1, 64},
};

static int64_t row_bytes_of(g4_weight_format f, int bits, int64_t cols) {
    switch (f) {
    case G4_WEIGHT_F32: return cols * 4;
    case G4_WEIGHT_BF16:
    case G4_WEIGHT_F16: return cols * 2;
    case G4_WEIGHT_AFFINE: return (cols * bits + 7) / 8;
    case G4_WEIGHT_MXFP4: return cols / 2;
    }
    return 0;
}

static void check_field(const plan_case *c, const char *name, int64_t got, int64_t want) {
    if (want == ANY) return;
    CHECK(got == want, "%s: %s %lld, expected %lld", c->what, name, (long long)got, (long long)want);
}

static void check_case(const plan_case *c) {
    g4_matrix w;
    memset(&w, 0, sizeof w);
    w.format = c->f;
    w.rows = c->rows;
    w.cols = c->cols;
    w.bits = c->f == G4_WEIGHT_MXFP4 ? 4 : c->bits;
    w.group_size = c->group;
    w.row_bytes = (size_t)row_bytes_of(c->f, w.bits, c->cols);
    w.data = (const void *)(uintptr_t)(c->misaligned ? 0x10008 : 0x10000); /* never read */
    w.scale_dtype = c->f == G4_WEIGHT_MXFP4 ? G4_DTYPE_U8 : G4_DTYPE_BF16;
    const g4_cuda_caps caps = {c->sm_count ? c->sm_count : 132, 9, 0, 232448, 1};
    g4_cuda_tuning t = g4_cuda_tuning_defaults(&caps);
    char err[256];
    CHECK(g4_cuda_tuning_parse(&t, c->tune, err, sizeof err), "%s: %s", c->what, err);
    g4_gemv_shape s = {&w, c->n_tokens, c->has_ids, c->n_slots, c->x_div, c->x_aligned, c->pair, c->combine_k, 0};
    const g4_gemv_plan p = g4_plan_gemv(&caps, &t, &s);
    CHECK(p.kernel == c->kernel, "%s: kernel %s, expected %s", c->what, g4_kernel_name(p.kernel),
          g4_kernel_name(c->kernel));
    if (p.kernel != c->kernel) return;
    check_field(c, "tokens", p.tokens, c->tokens);
    check_field(c, "rows", p.rows, c->rows_per);
    check_field(c, "split", p.split, c->split);
    check_field(c, "min_blocks", p.min_blocks, c->min_blocks);
    check_field(c, "bits", p.bits, c->tc_bits);
    check_field(c, "tiles", p.tiles, c->tiles);
    check_field(c, "parts", p.parts, c->parts);
    check_field(c, "copies", p.copies, c->copies);
}

/* the float32 GEMV's instantiations per format: what cuda_matmul.cu compiles */
static void test_float_variants(void) {
    g4_matrix w;
    memset(&w, 0, sizeof w);
    const struct {
        g4_weight_format f;
        int bits, rows1, minb1, rows_n;
    } v[] = {{G4_WEIGHT_F32, 0, 4, 0, 4},     {G4_WEIGHT_BF16, 0, 2, 0, 4},   {G4_WEIGHT_F16, 0, 4, 0, 4},
             {G4_WEIGHT_AFFINE, 2, 1, 0, 1},  {G4_WEIGHT_AFFINE, 4, 4, 5, 2}, {G4_WEIGHT_AFFINE, 8, 4, 6, 2},
             {G4_WEIGHT_MXFP4, 4, 4, 5, 2}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        w.format = v[i].f;
        w.bits = v[i].bits;
        CHECK(g4_gemv_float_rows(&w, 1) == v[i].rows1 && g4_gemv_float_min_blocks(&w, 1) == v[i].minb1,
              "format %d/%d, one token: rows %d, min blocks %d", (int)v[i].f, v[i].bits, g4_gemv_float_rows(&w, 1),
              g4_gemv_float_min_blocks(&w, 1));
        for (int nt = 2; nt <= 8; nt *= 2)
            CHECK(g4_gemv_float_rows(&w, nt) == v[i].rows_n && g4_gemv_float_min_blocks(&w, nt) == 0,
                  "format %d/%d, %d tokens", (int)v[i].f, v[i].bits, nt);
    }
    CHECK(strcmp(g4_kernel_name(G4_KERNEL_GEMV_INT8), "gemv_int8") == 0 &&
              strcmp(g4_kernel_name(G4_KERNEL_GEMM_DEQUANT), "gemm_dequant") == 0 &&
              strcmp(g4_kernel_name(G4_KERNEL_COUNT), "?") == 0,
          "kernel names");
}

/* the warpgroup GEMM is planned only in the fast precision, where the device
 * runs this build's sm_90a code, for the experts by default and for dense
 * products only with wgmma=2 */
static void test_wgmma_conditions(void) {
    g4_matrix w;
    memset(&w, 0, sizeof w);
    w.format = G4_WEIGHT_AFFINE;
    w.bits = 4;
    w.group_size = 64;
    w.rows = 43008;
    w.cols = 5376;
    w.row_bytes = 2688;
    w.data = (const void *)(uintptr_t)0x10000;
    w.scale_dtype = G4_DTYPE_BF16;
    g4_cuda_caps caps = {132, 9, 0, 232448, 1};
    g4_cuda_tuning t = g4_cuda_tuning_defaults(&caps);
    /* the MoE experts' question: yes by default in the fast precision, no when exact, without sm_90a or wgmma=0 */
    CHECK(g4_plan_wgmma_q4(&caps, &t, &w, 0), "experts, fast precision, sm_90a: the warpgroup GEMM");
    CHECK(!g4_plan_wgmma_q4(&caps, &t, &w, 1), "experts, exact precision: not the warpgroup GEMM");
    /* dense: only with wgmma=2 */
    g4_gemv_shape s = {&w, 512, 0, 1, 1, 1, 0, 0, 0};
    CHECK(g4_plan_gemv(&caps, &t, &s).kernel == G4_KERNEL_GEMM_DEQUANT, "dense by default: the dequantising path");
    t.wgmma = 2;
    CHECK(g4_plan_gemv(&caps, &t, &s).kernel == G4_KERNEL_GEMM_WGMMA4, "dense, wgmma=2: the warpgroup GEMM");
    s.exact = 1;
    CHECK(g4_plan_gemv(&caps, &t, &s).kernel == G4_KERNEL_GEMM_DEQUANT, "exact precision: the dequantising path");
    s.exact = 0;
    caps.wgmma = 0;
    CHECK(g4_plan_gemv(&caps, &t, &s).kernel == G4_KERNEL_GEMM_DEQUANT, "no sm_90a code: the dequantising path");
    CHECK(!g4_plan_wgmma_q4(&caps, &t, &w, 0), "experts without sm_90a code: not the warpgroup GEMM");
    caps.wgmma = 1;
    t.wgmma = 0;
    CHECK(!g4_plan_wgmma_q4(&caps, &t, &w, 0), "experts, wgmma=0: not the warpgroup GEMM");
    w.group_size = 48;
    t.wgmma = 1;
    CHECK(!g4_plan_wgmma_q4(&caps, &t, &w, 0), "groups of 48 columns: not the warpgroup GEMM");
    CHECK(!strcmp(g4_kernel_name(G4_KERNEL_GEMM_WGMMA4), "gemm_wgmma4"), "kernel name %s",
          g4_kernel_name(G4_KERNEL_GEMM_WGMMA4));
}

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
    test_float_variants();
    test_wgmma_conditions();
    return test_finish();
}
