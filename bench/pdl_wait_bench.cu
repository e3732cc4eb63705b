/* Does griddepcontrol.wait wait for the thread's loads already in flight?
 * (Session 11: row norms that loaded their weights before pdl_wait ran ~4%
 * slower per decode step when launched after their predecessor had ended.)
 *   nvcc -O3 -arch=sm_90a -o /tmp/pdlwait bench/pdl_wait_bench.cu && /tmp/pdlwait
 * A pair of kernels, the second launched with programmatic dependent launch:
 *  producer: one block, calls launch_dependents at once, then spins SPIN_NS
 *            (0: returns at once);
 *  consumer: one block per SM, each thread loads COLD (weights-like, a fresh
 *            slice of a 1 GB buffer each launch: DRAM) and HOT (an 8 KB row
 *            every block reads: L2) values, either all after the wait
 *            (mode 0) or the cold ones before it (mode 1).
 * If the wait does not hold the cold loads, mode 1 with a spinning producer
 * hides them, and with an idle one costs nothing against mode 0. */
#include "cuda_bench_util.cuh"

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

__global__ void producer(long long spin_ns, unsigned *sink) {
    pdl_launch();
    const long long t0 = clock64();
    const long long cycles = spin_ns * 2; /* ~2 GHz */
    while (clock64() - t0 < cycles) {
    }
    if (threadIdx.x == 0 && spin_ns < 0) sink[0] = 1;
}

template <int N>
__global__ void consumer(const uint4 *cold, const uint4 *hot, int mode, unsigned *sink) {
    uint4 c[N], h[N];
    const size_t base = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * N;
    if (mode == 1)
#pragma unroll
        for (int i = 0; i < N; i++) c[i] = ld_nc(cold + base + i);
    pdl_wait();
    if (mode == 0)
#pragma unroll
        for (int i = 0; i < N; i++) c[i] = ld_nc(cold + base + i);
#pragma unroll
    for (int i = 0; i < N; i++) h[i] = hot[(threadIdx.x * N + i) % 512];
    unsigned acc = 0;
#pragma unroll
    for (int i = 0; i < N; i++) acc ^= c[i].x ^ c[i].w ^ h[i].y;
    if (acc == 0x12345678u) sink[1] = acc;
}

static void launch_pair(long long spin_ns, int mode, const uint4 *cold, const uint4 *hot, unsigned *sink, int sms) {
    producer<<<1, 32>>>(spin_ns, sink);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sms);
    cfg.blockDim = dim3(256);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, consumer<4>, cold, hot, mode, sink);
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t slice = (size_t)sms * 256 * 4; /* uint4 per consumer launch */
    const size_t n_slices = ((size_t)1 << 30) / (slice * 16);
    uint4 *cold, *hot;
    unsigned *sink;
    CHECK(cudaMalloc(&cold, n_slices * slice * 16));
    CHECK(cudaMalloc(&hot, 512 * 16));
    CHECK(cudaMalloc(&sink, 8));
    CHECK(cudaMemset(cold, 1, n_slices * slice * 16));
    CHECK(cudaMemset(hot, 2, 512 * 16));
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    const long long spins[] = {0, 2000, 5000};
    for (long long spin : spins)
        for (int mode = 0; mode < 2; mode++) {
            const int reps = 200;
            for (int r = 0; r < 10; r++) launch_pair(spin, mode, cold + (r % n_slices) * slice, hot, sink, sms);
            cudaEventRecord(a);
            for (int r = 0; r < reps; r++) launch_pair(spin, mode, cold + (r % n_slices) * slice, hot, sink, sms);
            cudaEventRecord(b);
            CHECK(cudaEventSynchronize(b));
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            printf("producer spin %5lld ns, cold loads %s the wait: %.2f us per pair\n", spin,
                   mode ? "before" : "after ", ms * 1e3 / reps);
        }
    CHECK(cudaDeviceSynchronize());
    return 0;
}
