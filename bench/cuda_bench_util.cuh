/* What the standalone CUDA microbenchmarks in bench/ share: a check that
 * prints the failing call and returns 1 from main, and a streaming 16-byte
 * load that bypasses L1 (as the engine's GEMVs read weights). */
#pragma once
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (x);                                                                                      \
        if (e_ != cudaSuccess) {                                                                                   \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                                                        \
            return 1;                                                                                              \
        }                                                                                                          \
    } while (0)

__device__ __forceinline__ uint4 ld_nc(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
