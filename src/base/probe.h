/* Measured machine limits, printed beside benchmark figures: decode is bound
 * by memory bandwidth, prefill by arithmetic throughput. */
#ifndef G4_BASE_PROBE_H
#define G4_BASE_PROBE_H

/* Read bandwidth of main memory in GB/s (threaded sum over a 1 GiB buffer,
 * best of several passes). */
double g4_probe_memory_bandwidth(void);
/* Peak float32 FMA throughput of all threads in GFLOP/s, with the widest
 * vector unit present. */
double g4_probe_cpu_gflops(void);

#endif
