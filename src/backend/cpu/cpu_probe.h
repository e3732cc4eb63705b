/* Physical limits of this machine, measured, so that benchmarks can print
 * each speed beside the figure it is bounded by. Each call takes a fraction
 * of a second; callers measure once and keep the value. */
#ifndef G4_BACKEND_CPU_PROBE_H
#define G4_BACKEND_CPU_PROBE_H

/* Memory read bandwidth in GB/s (1e9 bytes): every OpenMP thread sums its
 * share of a 1 GiB buffer (smaller if that cannot be had), best of several
 * passes. 0 if no buffer could be allocated. */
double g4_measure_memory_bandwidth(void);

/* Peak float32 FMA throughput of all OpenMP threads in GFLOP/s (an FMA counts
 * as two), at the SIMD level cpu_isa_active() picks. */
double g4_measure_cpu_flops(void);

#endif
