#include "base/probe.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

double g4_probe_memory_bandwidth(void) {
    const size_t bytes = (size_t)1 << 30, n = bytes / sizeof(uint64_t);
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    double best = 0;
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        uint64_t total = 0;
        double t0 = g4_now_seconds();
#pragma omp parallel for schedule(static) reduction(^ : total)
        for (size_t i = 0; i < n; i += 8) {
            /* 8 independent xors per 64-byte line keep the loads streaming */
            total ^= buf[i] ^ buf[i + 1] ^ buf[i + 2] ^ buf[i + 3] ^ buf[i + 4] ^ buf[i + 5] ^ buf[i + 6] ^ buf[i + 7];
        }
        double dt = g4_now_seconds() - t0;
        sink ^= total;
        if (dt > 0 && bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
    (void)sink;
    free(buf);
    return best;
}

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

#define FMA_CHAINS 12
__attribute__((target("avx512f"))) static double fma_loop_avx512(long iters) {
    v16f acc[FMA_CHAINS], a, b;
    for (int k = 0; k < 16; k++) a[k] = 1.0000001f, b[k] = 0.9999999f;
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = a * (float)c;
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = acc[c] * a + b;
    float s = 0;
    for (int c = 0; c < FMA_CHAINS; c++) s += acc[c][0];
    return s;
}

__attribute__((target("avx2,fma"))) static double fma_loop_avx2(long iters) {
    v8f acc[FMA_CHAINS], a, b;
    for (int k = 0; k < 8; k++) a[k] = 1.0000001f, b[k] = 0.9999999f;
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = a * (float)c;
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = acc[c] * a + b;
    float s = 0;
    for (int c = 0; c < FMA_CHAINS; c++) s += acc[c][0];
    return s;
}

double g4_probe_cpu_gflops(void) {
    int lanes = 1;
    if (__builtin_cpu_supports("avx512f"))
        lanes = 16;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        lanes = 8;
    if (lanes == 1) return 0; /* no vector FMA: report unknown */
    const long iters = 20000000;
    double best = 0;
    volatile double sink = 0;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = g4_now_seconds();
#pragma omp parallel reduction(+ : sink)
        sink += lanes == 16 ? fma_loop_avx512(iters) : fma_loop_avx2(iters);
        double dt = g4_now_seconds() - t0;
        double flops = 2.0 * lanes * FMA_CHAINS * (double)iters * omp_get_max_threads();
        if (dt > 0 && flops / dt / 1e9 > best) best = flops / dt / 1e9;
    }
    return best;
}
