/* MoE routing of one token by one warp, shared by moe_route_kernel
 * (cuda_moe.cu) and the GEMV pre-passes that run it in a block of their
 * own (cuda_moe_route_job): the same code, the same bits. */
#ifndef G4_CUDA_MOE_ROUTE_CUH
#define G4_CUDA_MOE_ROUTE_CUH

#include "backend/cuda/cuda_internal.cuh"

/* A float as an unsigned key with the same order (NaN lowest: it never wins,
 * as in the CPU's comparisons). */
__device__ __forceinline__ unsigned route_key(float v) {
    const unsigned u = __float_as_uint(v);
    if (v != v) return 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* One warp per token: top-k of the router logits (ties to the lower index),
 * softmax over the chosen (the full normaliser cancels), times the
 * per-expert scale; in double like the host, its sum in the host's order.
 * Lane l holds experts l + 32 i (i < NV) in registers; each choice is the
 * warp's largest key (one redux) and the lowest index holding it (another).
 * The exponentials run after the choices, one per lane (inside each
 * round of shuffles they serialised the choices). */
template <int NV>
__device__ __forceinline__ void moe_route_token(int32_t *ids, float *weights, const float *logits,
                                                const float *expert_scale, int t, int n_experts, int k) {
    const int lane = threadIdx.x & 31;
    const float *z = logits + (size_t)t * n_experts;
    unsigned key[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int e = lane + 32 * i;
        key[i] = e < n_experts ? route_key(z[e]) : 0u;
    }
    uint32_t taken = 0; /* bit i: expert lane + 32 i chosen */
    int my_e = -1;      /* lane j < k: choice j */
    for (int j = 0; j < k; j++) {
        unsigned best = 0u;
        int best_e = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int e = lane + 32 * i;
            if (e < n_experts && !(taken >> i & 1u) && (best_e == 0x7fffffff || key[i] > best)) {
                best = key[i];
                best_e = e;
            }
        }
        const unsigned top = __reduce_max_sync(0xffffffffu, best);
        const int e = (int)__reduce_min_sync(0xffffffffu, (unsigned)(best == top ? best_e : 0x7fffffff));
        if ((e & 31) == lane) taken |= 1u << (e >> 5);
        if (lane == j) my_e = e;
    }
    /* the chosen logits' exponentials relative to the first (largest), summed in choice order */
    const int e0 = __shfl_sync(0xffffffffu, my_e, 0);
    const double max_z = (double)z[e0];
    const double p = lane < k ? exp((double)z[my_e] - max_z) : 0.0;
    double total = 0;
    for (int j = 0; j < k && j < 32; j++) total += __shfl_sync(0xffffffffu, p, j);
    if (lane < k) {
        ids[(size_t)t * k + lane] = my_e;
        weights[(size_t)t * k + lane] = (float)(p / total) * expert_scale[my_e];
    }
}

/* A routing of n tokens (E <= 128 experts, 32 per lane x 4) for a
 * pre-pass's extra block: its warps take tokens warp, warp + warps, ... */
__device__ __forceinline__ void moe_route_job_run(const cuda_moe_route_job &j) {
    const int warps = (int)(blockDim.x >> 5);
    for (int t = (int)(threadIdx.x >> 5); t < j.n; t += warps)
        moe_route_token<4>(j.ids, j.weights, j.logits, j.expert_scale, t, j.n_experts, j.k);
}

#endif
