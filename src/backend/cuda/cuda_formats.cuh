/* Weight formats as the CUDA kernels take them: the format codes, which
 * ones carry affine scales and biases, and the decoding of 16 weights of a
 * row for the tensor-core GEMMs (mma_gemm_kernel in cuda_matmul.cu, the
 * MoE experts' grouped GEMM in cuda_moe_gemm.cu). */
#ifndef G4_BACKEND_CUDA_FORMATS_CUH
#define G4_BACKEND_CUDA_FORMATS_CUH

#include "backend/cuda/cuda_internal.cuh"

enum fast_format { FF_F32, FF_BF16, FF_F16, FF_AFF2, FF_AFF4, FF_AFF8, FF_MXFP4, FF_NONE };

template <int F> __host__ __device__ constexpr bool is_affine() { return F == FF_AFF2 || F == FF_AFF4 || F == FF_AFF8; }

/* Whether every decoded weight of the format is exactly a bf16 value, so that
 * a float32-accurate product needs no lo part of the weights: bf16 itself,
 * and MXFP4 (an E2M1 value has at most two significant bits, its E8M0 scale
 * is a power of two; their float32 product is exact, subnormals included). */
template <int F> __host__ __device__ constexpr bool exact_in_bf16() { return F == FF_BF16 || F == FF_MXFP4; }

static inline int fast_format_of(const g4_matrix *w) {
    switch (w->format) {
    case G4_WEIGHT_F32: return FF_F32;
    case G4_WEIGHT_BF16: return FF_BF16;
    case G4_WEIGHT_F16: return FF_F16;
    case G4_WEIGHT_AFFINE:
        return w->bits == 2 ? FF_AFF2 : w->bits == 4 ? FF_AFF4 : w->bits == 8 ? FF_AFF8 : FF_NONE;
    case G4_WEIGHT_MXFP4: return w->bits == 4 ? FF_MXFP4 : FF_NONE;
    }
    return FF_NONE;
}

static inline int weights_exact_in_bf16(const g4_matrix *w) {
    const int f = fast_format_of(w);
    return f == FF_BF16 || f == FF_MXFP4;
}

/* x = hi + lo with both halves bf16: 16 significant bits instead of 8. */
__device__ __forceinline__ void split_pack(float a, float b, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    hi = *reinterpret_cast<uint32_t *>(&h);
    lo = *reinterpret_cast<uint32_t *>(&l);
}

/* bytes of weights one thread loads per k tile: 16 columns of one row */
template <int F> __host__ __device__ constexpr int mma_raw_bytes() {
    return F == FF_F32 ? 64 : F == FF_BF16 || F == FF_F16 ? 32 : F == FF_AFF8 ? 16 : F == FF_AFF2 ? 4 : 8;
}

/* 16 weights of a row (from 16-byte-aligned raw words) as floats (not bf16). */
template <int F>
__device__ __forceinline__ void dequant16(const uint32_t *w, float s, float b, float *v, const float *lut) {
    const float magic = 8388608.0f;
    if constexpr (F == FF_F32) {
#pragma unroll
        for (int i = 0; i < 16; i++) v[i] = __uint_as_float(w[i]);
    } else if constexpr (F == FF_F16) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
            v[2 * i] = f.x;
            v[2 * i + 1] = f.y;
        }
    } else if constexpr (F == FF_AFF8) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                v[4 * i + k] = fmaf(s, __uint_as_float(__byte_perm(w[i], 0x4B000000u, 0x7440u | (uint32_t)k)) - magic, b);
    } else if constexpr (F == FF_AFF4) {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[8 * i + k] = fmaf(s, __uint_as_float(((w[i] >> (4 * k)) & 15u) | 0x4B000000u) - magic, b);
    } else if constexpr (F == FF_AFF2) {
#pragma unroll
        for (int k = 0; k < 16; k++) v[k] = fmaf(s, __uint_as_float(((w[0] >> (2 * k)) & 3u) | 0x4B000000u) - magic, b);
    } else if constexpr (F == FF_MXFP4) {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int k = 0; k < 8; k++) v[8 * i + k] = lut[(w[i] >> (4 * k)) & 15u] * s;
    }
}

/* 16 codes of an affine row (from 16-byte-aligned raw words) as bf16 pairs
 * of the codes themselves, not yet scaled: every integer up to 256 is a bf16
 * value, so these are exact. */
template <int F> __device__ __forceinline__ void codes16_bf16(const uint32_t *w, uint32_t *pairs) {
    static_assert(F == FF_AFF4 || F == FF_AFF8, "4- and 8-bit codes");
    const float magic = 8388608.0f; /* 2^23: (2^23 + q) is exact in float32 */
    float v[16];
    if constexpr (F == FF_AFF8) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int k = 0; k < 4; k++) v[4 * i + k] = __uint_as_float(__byte_perm(w[i], 0x4B000000u, 0x7440u | (uint32_t)k)) - magic;
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int k = 0; k < 8; k++) v[8 * i + k] = __uint_as_float(((w[i] >> (4 * k)) & 15u) | 0x4B000000u) - magic;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        pairs[i] = *reinterpret_cast<uint32_t *>(&h);
    }
}

#endif
