/* Can weights be pulled into L2 while a decode step's latency-bound kernels
 * run, so that the GEMV after them reads from L2 instead of device memory?
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/l2pf bench/l2_prefetch_bench.cu && /tmp/l2pf
 * Each "layer" is a chain of short kernels that use no bandwidth (spinning
 * on the global timer, as norms and attention nearly do) followed by a read
 * of that layer's own buffer (a GEMV's weights, streamed once). Variants
 * fork a prefetch of the buffer onto a second stream at the layer's start:
 *   bulk N:  N threads issue cp.async.bulk.prefetch.L2 of 64 KB pieces;
 *   line:    one prefetch.global.L2 per 128-byte line, many threads;
 *   last:    the same with the evict_last hint.
 * Everything is captured as one CUDA graph and replayed; time per layer. */
#include "cuda_bench_util.cuh"

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin(uint64_t ns) {
    const uint64_t t0 = now_ns();
    while (now_ns() - t0 < ns) {
    }
}

/* a GEMV-like stream: each thread 4 x 16 bytes in flight per step */
__global__ void read_all(const uint4 *w, size_t n, unsigned *sink) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = i + u * stride < n ? ld_nc(w + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

#define PIECE (64 * 1024)

__global__ void prefetch_bulk(const uint8_t *p, size_t bytes) {
    const size_t pieces = (bytes + PIECE - 1) / PIECE;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < pieces; i += (size_t)gridDim.x * blockDim.x) {
        const size_t off = i * PIECE;
        const unsigned size = (unsigned)(bytes - off < PIECE ? bytes - off : PIECE);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(size) : "memory");
    }
}

template <bool LAST> __global__ void prefetch_line(const uint8_t *p, size_t bytes) {
    for (size_t off = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 128; off < bytes;
         off += (size_t)gridDim.x * blockDim.x * 128) {
        if (LAST)
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + off));
        else
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
    }
}

struct variant {
    const char *name;
    int kind; /* 0 none, 1 bulk, 2 line, 3 line evict_last */
    int blocks, threads;
};

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s: %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const int layers = 16, spins = 5;
    const size_t sizes[] = {8u << 20, 19u << 20, 38u << 20};
    const uint64_t spin_ns[] = {0, 2000, 4000};
    const variant vars[] = {{"none", 0, 0, 0},      {"bulk 1x32", 1, 1, 32},   {"bulk 8x32", 1, 8, 32},
                            {"bulk 32x32", 1, 32, 32}, {"line 132x256", 2, 132, 256}, {"last 132x256", 3, 132, 256}};
    uint8_t *buf;
    unsigned *sink;
    const size_t max_bytes = 38u << 20;
    CHECK(cudaMalloc(&buf, max_bytes * layers));
    CHECK(cudaMemset(buf, 1, max_bytes * layers));
    CHECK(cudaMalloc(&sink, 4));
    cudaStream_t s0, s1;
    CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    cudaEvent_t fork[layers], join, t0, t1;
    for (int i = 0; i < layers; i++) CHECK(cudaEventCreateWithFlags(&fork[i], cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    const int read_blocks = prop.multiProcessorCount * 4;
    for (size_t bytes : sizes) {
        for (uint64_t ns : spin_ns) {
            printf("buffer %zu MB, %d spins of %llu ns before each read:\n", bytes >> 20, spins, (unsigned long long)ns);
            for (const variant &v : vars) {
                if (ns == 0 && v.kind != 0) continue;
                cudaGraph_t graph;
                CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
                for (int l = 0; l < layers; l++) {
                    const uint8_t *w = buf + (size_t)l * max_bytes;
                    if (v.kind) {
                        CHECK(cudaEventRecord(fork[l], s0));
                        CHECK(cudaStreamWaitEvent(s1, fork[l], 0));
                        if (v.kind == 1) prefetch_bulk<<<v.blocks, v.threads, 0, s1>>>(w, bytes);
                        if (v.kind == 2) prefetch_line<false><<<v.blocks, v.threads, 0, s1>>>(w, bytes);
                        if (v.kind == 3) prefetch_line<true><<<v.blocks, v.threads, 0, s1>>>(w, bytes);
                    }
                    for (int k = 0; k < spins && ns; k++) spin<<<1, 32, 0, s0>>>(ns);
                    read_all<<<read_blocks, 256, 0, s0>>>((const uint4 *)w, bytes / 16, sink);
                }
                if (v.kind) {
                    CHECK(cudaEventRecord(join, s1));
                    CHECK(cudaStreamWaitEvent(s0, join, 0));
                }
                CHECK(cudaStreamEndCapture(s0, &graph));
                cudaGraphExec_t exec;
                CHECK(cudaGraphInstantiate(&exec, graph, 0));
                float best = 1e30f;
                for (int rep = 0; rep < 6; rep++) {
                    CHECK(cudaEventRecord(t0, s0));
                    CHECK(cudaGraphLaunch(exec, s0));
                    CHECK(cudaEventRecord(t1, s0));
                    CHECK(cudaEventSynchronize(t1));
                    float ms;
                    CHECK(cudaEventElapsedTime(&ms, t0, t1));
                    if (rep > 0 && ms < best) best = ms;
                }
                const double per_layer_us = best * 1000.0 / layers;
                printf("  %-14s %7.2f us per layer  (read at %.0f GB/s if the spins took their time)\n", v.name,
                       per_layer_us, bytes / ((per_layer_us - spins * (ns / 1000.0)) * 1e3));
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
            }
        }
    }
    /* the read alone from L2: the same 19 / 8 MB twice in a row, time the second */
    for (size_t bytes : {8u << 20, 19u << 20}) {
        float best = 1e30f;
        for (int rep = 0; rep < 6; rep++) {
            read_all<<<read_blocks, 256, 0, s0>>>((const uint4 *)buf, bytes / 16, sink);
            CHECK(cudaEventRecord(t0, s0));
            read_all<<<read_blocks, 256, 0, s0>>>((const uint4 *)buf, bytes / 16, sink);
            CHECK(cudaEventRecord(t1, s0));
            CHECK(cudaEventSynchronize(t1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, t0, t1));
            if (ms < best) best = ms;
        }
        printf("read of %zu MB already in L2: %.2f us (%.0f GB/s)\n", bytes >> 20, best * 1000, bytes / (best * 1e6));
    }
    CHECK(cudaDeviceSynchronize());
    return 0;
}
