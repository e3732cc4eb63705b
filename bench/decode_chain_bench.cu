/* What a kernel boundary costs in a decode step, and what a persistent
 * kernel with grid barriers would cost instead.
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/chain bench/decode_chain_bench.cu && /tmp/chain
 * A "layer" imitates E2B's: reads of 8, 6, 38, 19, 1 and 1 MB (q|k|v, o,
 * gate|up, down and the two per-layer-embedding GEMVs: streamed weights)
 * with six one-block "norms" between them (1536 floats read, reduced,
 * normalised, written), 72 MB a layer, 16 layers with their own buffers.
 *  graph:      each piece its own kernel, recorded as a CUDA graph;
 *  graph+pdl:  the same launched with programmatic dependent launch: every
 *              kernel waits (griddepcontrol.wait) at its start; norms let
 *              the next kernel launch at their start, reads after their loop;
 *  persistent: one kernel, one block per SM x 2; each piece a phase ended by
 *              a grid barrier; a read phase's first loads are issued before
 *              the barrier that precedes it (weights never depend on it);
 *              the norm is recomputed by every block from the vector in L2;
 *  persistent deep: the same, but each thread copies its first slots of the
 *              NEXT piece into shared memory (cp.async, up to ~200 KB per
 *              SM, ~26 MB over the GPU) as soon as it has read its part of
 *              this one, before the barrier: weights never depend on the
 *              activations, so the memory stream need not stop at a phase
 *              boundary (the question: does that close the gap to the
 *              copy-rate floor that kernel boundaries and barriers leave?). */
#include "cuda_bench_util.cuh"

#define HIDDEN 1536
#define LAYERS 16
#define PIECES 6
static const size_t piece_mb[PIECES] = {8, 6, 38, 19, 1, 1};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }

__device__ __forceinline__ float block_sum(float v, float *red) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < nw; w++) s += red[w];
    return s;
}

/* normalise x into y (HIDDEN floats); every thread of the block */
__device__ __forceinline__ void norm_body(const float *x, float *y, float *red) {
    float v[HIDDEN / 256], ss = 0.0f;
    for (int i = 0; i < HIDDEN / 256; i++) {
        v[i] = __ldcg(x + threadIdx.x + 256 * i);
        ss += v[i] * v[i];
    }
    const float r = rsqrtf(block_sum(ss, red) / HIDDEN + 1e-6f);
    if (y)
        for (int i = 0; i < HIDDEN / 256; i++) y[threadIdx.x + 256 * i] = v[i] * r;
}

template <bool PDL> __global__ void __launch_bounds__(256) norm_kernel(const float *x, float *y) {
    __shared__ float red[8];
    if (PDL) {
        pdl_wait();
        pdl_trigger();
    }
    norm_body(x, y, red);
}

/* each thread 4 x 16 bytes in flight per step; the folded result into x[0]'s
 * neighbourhood only if impossible (keeps the loads alive) */
__device__ __forceinline__ unsigned read_range(const uint4 *w, size_t n, size_t first, size_t stride) {
    unsigned acc = 0;
    for (size_t i = first; i < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = i + u * stride < n ? ld_nc(w + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    return acc;
}

template <bool PDL> __global__ void __launch_bounds__(256) read_kernel(const uint4 *w, size_t n, unsigned *sink) {
    if (PDL) pdl_wait();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const unsigned acc = read_range(w, n, (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride);
    if (PDL) pdl_trigger();
    if (acc == 0x12345678u) sink[0] = acc;
}

/* grid barrier: a monotonic counter; target advances by gridDim.x per use */
__device__ __forceinline__ void grid_barrier(unsigned *count, unsigned &target) {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        } while ((int)(v - target) < 0);
    }
    __syncthreads();
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

struct persist_args {
    const uint8_t *buf;
    size_t layer_bytes;
    size_t piece_off[PIECES], piece_n[PIECES]; /* offsets in bytes, sizes in uint4 */
    float *vec;                                /* 2 x HIDDEN ping-pong */
    unsigned *count, *sink;
    int early; /* issue a read phase's first loads before the barrier */
    int slots; /* persistent_deep_kernel: uint4 of the next piece each thread stages in shared memory */
};

/* the first `slots` of a thread's share of piece (w, n) into its shared slots */
__device__ __forceinline__ void stage_piece(uint4 *pre, int slots, const uint4 *w, size_t n, size_t first,
                                            size_t stride) {
    for (int k = 0; k < slots; k++) {
        const size_t i = first + (size_t)k * stride;
        if (i >= n) break;
        cp_async16(pre + (size_t)k * blockDim.x + threadIdx.x, w + i);
    }
    cp_async_commit();
}

__global__ void __launch_bounds__(256) persistent_deep_kernel(persist_args a) {
    extern __shared__ uint4 pre[]; /* [slots][blockDim.x] */
    __shared__ float red[8];
    __shared__ float xs[HIDDEN];
    unsigned target = 0, acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x, first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    stage_piece(pre, a.slots, (const uint4 *)(a.buf + a.piece_off[0]), a.piece_n[0], first, stride);
    for (int l = 0; l < LAYERS; l++) {
        const uint8_t *base = a.buf + (size_t)l * a.layer_bytes;
        for (int p = 0; p < PIECES; p++) {
            const uint4 *w = (const uint4 *)(base + a.piece_off[p]);
            const size_t n = a.piece_n[p];
            grid_barrier(a.count, target);
            norm_body(a.vec + (p & 1) * HIDDEN, xs, red);
            if (blockIdx.x == 0)
                for (int i = threadIdx.x; i < HIDDEN; i += 256) __stcg(a.vec + ((p + 1) & 1) * HIDDEN + i, xs[i] * 0.5f + 1.0f);
            /* the staged part, then the rest from memory */
            cp_async_wait_all();
            int k = 0;
            for (; k < a.slots && first + (size_t)k * stride < n; k++) {
                const uint4 v = pre[(size_t)k * blockDim.x + threadIdx.x];
                acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
            acc ^= read_range(w, n, first + (size_t)k * stride, stride);
            acc ^= __float_as_uint(xs[threadIdx.x]);
            /* the next piece's first slots while others finish this one */
            const int q = (p + 1) % PIECES, lq = p + 1 < PIECES ? l : l + 1;
            if (lq < LAYERS)
                stage_piece(pre, a.slots, (const uint4 *)(a.buf + (size_t)lq * a.layer_bytes + a.piece_off[q]),
                            a.piece_n[q], first, stride);
        }
    }
    if (acc == 0x12345678u) a.sink[0] = acc;
}

__global__ void __launch_bounds__(256) persistent_kernel(persist_args a) {
    __shared__ float red[8];
    __shared__ float xs[HIDDEN];
    unsigned target = 0, acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x, first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int l = 0; l < LAYERS; l++) {
        const uint8_t *base = a.buf + (size_t)l * a.layer_bytes;
        for (int p = 0; p < PIECES; p++) {
            const uint4 *w = (const uint4 *)(base + a.piece_off[p]);
            const size_t n = a.piece_n[p];
            /* the piece's first step of loads, before waiting on the norm's input */
            uint4 v0[4];
            if (a.early)
#pragma unroll
                for (int u = 0; u < 4; u++) v0[u] = first + u * stride < n ? ld_nc(w + first + u * stride) : make_uint4(0, 0, 0, 0);
            grid_barrier(a.count, target);
            /* the norm: every block from the vector the last phase left */
            norm_body(a.vec + (p & 1) * HIDDEN, xs, red);
            if (blockIdx.x == 0)
                for (int i = threadIdx.x; i < HIDDEN; i += 256) __stcg(a.vec + ((p + 1) & 1) * HIDDEN + i, xs[i] * 0.5f + 1.0f);
            if (a.early) {
#pragma unroll
                for (int u = 0; u < 4; u++) acc ^= v0[u].x ^ v0[u].y ^ v0[u].z ^ v0[u].w;
                acc ^= read_range(w, n, first + 4 * stride, stride);
            } else {
                acc ^= read_range(w, n, first, stride);
            }
            acc ^= __float_as_uint(xs[threadIdx.x]);
        }
    }
    if (acc == 0x12345678u) a.sink[0] = acc;
}

/* kernel k on grid blocks of 256 threads, with programmatic dependent launch if pdl */
template <typename... Params, typename... Args>
static cudaError_t launch(bool pdl, void (*k)(Params...), int grid, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = 256, cfg.stream = s;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr, cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, args...);
}

static float time_graph(cudaGraphExec_t exec, cudaStream_t s) {
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0), cudaEventCreate(&t1);
    float best = 1e30f;
    for (int rep = 0; rep < 8; rep++) {
        cudaEventRecord(t0, s);
        cudaGraphLaunch(exec, s);
        cudaEventRecord(t1, s);
        cudaEventSynchronize(t1);
        float ms;
        cudaEventElapsedTime(&ms, t0, t1);
        if (rep > 0 && ms < best) best = ms;
    }
    return best;
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    size_t off[PIECES], layer_bytes = 0;
    for (int p = 0; p < PIECES; p++) off[p] = layer_bytes, layer_bytes += piece_mb[p] << 20;
    uint8_t *buf;
    float *vec;
    unsigned *sink, *count;
    CHECK(cudaMalloc(&buf, layer_bytes * LAYERS));
    CHECK(cudaMemset(buf, 1, layer_bytes * LAYERS));
    CHECK(cudaMalloc(&vec, 2 * HIDDEN * sizeof(float)));
    CHECK(cudaMemset(vec, 0, 2 * HIDDEN * sizeof(float)));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMalloc(&count, 4));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const double bytes_total = (double)layer_bytes * LAYERS;
    printf("%d layers x %zu MB, %d reads + %d norms a layer; copy-rate floor at 4.18 TB/s: %.2f us a layer\n", LAYERS,
           layer_bytes >> 20, PIECES, PIECES, layer_bytes / 4.18e6);
    for (int mode = 0; mode < 2; mode++) {
        for (int read_grid : {sms * 4, sms * 8}) {
            cudaGraph_t graph;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < LAYERS; l++)
                for (int p = 0; p < PIECES; p++) {
                    const float *x = vec + (p & 1) * HIDDEN;
                    float *y = vec + ((p + 1) & 1) * HIDDEN;
                    const uint4 *w = (const uint4 *)(buf + (size_t)l * layer_bytes + off[p]);
                    const size_t n = (piece_mb[p] << 20) / 16;
                    if (mode == 0) {
                        CHECK(launch(false, norm_kernel<false>, 1, s, x, y));
                        CHECK(launch(false, read_kernel<false>, read_grid, s, w, n, sink));
                    } else {
                        CHECK(launch(true, norm_kernel<true>, 1, s, x, y));
                        CHECK(launch(true, read_kernel<true>, read_grid, s, w, n, sink));
                    }
                }
            CHECK(cudaStreamEndCapture(s, &graph));
            cudaGraphExec_t exec;
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            const float ms = time_graph(exec, s);
            printf("%-11s read grid %4d: %7.2f us a layer (%.0f GB/s)\n", mode ? "graph+pdl" : "graph", read_grid,
                   ms * 1000 / LAYERS, bytes_total / (ms * 1e6));
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
    }
    /* read kernels alone (no norms) for reference */
    {
        cudaGraph_t graph;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < LAYERS; l++)
            for (int p = 0; p < PIECES; p++)
                CHECK(launch(true, read_kernel<true>, sms * 4, s, (const uint4 *)(buf + (size_t)l * layer_bytes + off[p]),
                             (size_t)((piece_mb[p] << 20) / 16), sink));
        CHECK(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec;
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        const float ms = time_graph(exec, s);
        printf("reads only (pdl): %7.2f us a layer (%.0f GB/s)\n", ms * 1000 / LAYERS, bytes_total / (ms * 1e6));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    for (int per_sm : {1, 2, 4})
        for (int early = 0; early < 2; early++) {
            int fit = 0;
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persistent_kernel, 256, 0));
            if (fit < per_sm) continue;
            persist_args a;
            a.buf = buf, a.layer_bytes = layer_bytes, a.vec = vec, a.count = count, a.sink = sink, a.early = early;
            for (int p = 0; p < PIECES; p++) a.piece_off[p] = off[p], a.piece_n[p] = (piece_mb[p] << 20) / 16;
            cudaGraph_t graph;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            CHECK(cudaMemsetAsync(count, 0, 4, s));
            persistent_kernel<<<sms * per_sm, 256, 0, s>>>(a);
            CHECK(cudaStreamEndCapture(s, &graph));
            cudaGraphExec_t exec;
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            const float ms = time_graph(exec, s);
            CHECK(cudaGetLastError());
            printf("persistent %d/SM early %d: %7.2f us a layer (%.0f GB/s)\n", per_sm, early, ms * 1000 / LAYERS,
                   bytes_total / (ms * 1e6));
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
    for (int per_sm : {1, 2}) {
        const int slots = (int)((200u << 10) / per_sm / (256 * 16));
        const size_t smem = (size_t)slots * 256 * 16;
        CHECK(cudaFuncSetAttribute(persistent_deep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int fit = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persistent_deep_kernel, 256, smem));
        if (fit < per_sm) {
            printf("persistent deep %d/SM: does not fit (%d)\n", per_sm, fit);
            continue;
        }
        persist_args a;
        a.buf = buf, a.layer_bytes = layer_bytes, a.vec = vec, a.count = count, a.sink = sink, a.early = 0;
        a.slots = slots;
        for (int p = 0; p < PIECES; p++) a.piece_off[p] = off[p], a.piece_n[p] = (piece_mb[p] << 20) / 16;
        cudaGraph_t graph;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CHECK(cudaMemsetAsync(count, 0, 4, s));
        persistent_deep_kernel<<<sms * per_sm, 256, smem, s>>>(a);
        CHECK(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec;
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        const float ms = time_graph(exec, s);
        CHECK(cudaGetLastError());
        printf("persistent deep %d/SM (%zu KB staged a block, %.1f MB over the GPU): %7.2f us a layer (%.0f GB/s)\n",
               per_sm, smem >> 10, (double)smem * sms * per_sm / 1e6, ms * 1000 / LAYERS, bytes_total / (ms * 1e6));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    /* the barrier alone */
    {
        persist_args a = {};
        a.buf = buf, a.layer_bytes = 0, a.vec = vec, a.count = count, a.sink = sink;
        cudaGraph_t graph;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CHECK(cudaMemsetAsync(count, 0, 4, s));
        persistent_kernel<<<sms * 2, 256, 0, s>>>(a);
        CHECK(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec;
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        const float ms = time_graph(exec, s);
        printf("persistent, no reads (barrier + norm per phase): %.3f us a phase\n", ms * 1000 / (LAYERS * PIECES));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    CHECK(cudaDeviceSynchronize());
    return 0;
}
