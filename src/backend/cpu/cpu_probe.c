#include "backend/cpu/cpu_probe.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/file.h"

enum { BANDWIDTH_PASSES = 5, FLOP_PASSES = 5 };

double g4_measure_memory_bandwidth(void) {
    const cpu_kernel_table *k = cpu_kernels_for(cpu_isa_active());
    size_t bytes = (size_t)1 << 30;
    float *buf = NULL;
    while (bytes >= ((size_t)1 << 26) && !(buf = aligned_alloc(4096, bytes))) bytes /= 2;
    if (!buf) return 0.0;
    const int64_t n = (int64_t)(bytes / sizeof *buf);
    /* each thread touches (and so places) the pages it will read */
#pragma omp parallel
    {
        int64_t lo = n * omp_get_thread_num() / omp_get_num_threads();
        int64_t hi = n * (omp_get_thread_num() + 1) / omp_get_num_threads();
        memset(buf + lo, 0, (size_t)(hi - lo) * sizeof *buf);
    }
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int pass = 0; pass < BANDWIDTH_PASSES; pass++) {
        double t0 = g4_now_seconds();
        float total = 0.0f;
#pragma omp parallel reduction(+ : total)
        {
            int64_t lo = n * omp_get_thread_num() / omp_get_num_threads();
            int64_t hi = n * (omp_get_thread_num() + 1) / omp_get_num_threads();
            total += k->read_sum(buf + lo, hi - lo);
        }
        double dt = g4_now_seconds() - t0;
        sink += total;
        if (dt > 0 && (double)bytes / dt / 1e9 > best) best = (double)bytes / dt / 1e9;
    }
    (void)sink;
    free(buf);
    return best;
}

double g4_measure_cpu_flops(void) {
    const cpu_kernel_table *k = cpu_kernels_for(cpu_isa_active());
    const int64_t n_iter = k->isa == CPU_ISA_SCALAR ? (int64_t)1 << 24 : (int64_t)1 << 22;
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int pass = 0; pass < FLOP_PASSES; pass++) {
        double flops = 0.0;
        float s = 0.0f;
        double t0 = g4_now_seconds();
#pragma omp parallel reduction(+ : flops, s)
        {
            float v;
            flops += k->fma_burn(n_iter, &v);
            s += v;
        }
        double dt = g4_now_seconds() - t0;
        sink += s;
        if (dt > 0 && flops / dt / 1e9 > best) best = flops / dt / 1e9;
    }
    (void)sink;
    return best;
}
