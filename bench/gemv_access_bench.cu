/* How fast the H200 streams a 4-bit GEMV's weights under different access
 * patterns (no math: each lane folds what it loads into one word).
 *   nvcc -O3 -arch=sm_90a -o /tmp/access bench/gemv_access_bench.cu && /tmp/access
 * Patterns, for a 21504 x 5376 4-bit matrix (2688 bytes a row):
 *  quad64:  a warp owns 16 rows; per 128-column block lane (g, c) reads 16
 *           bytes of rows g and g + 8 (the tensor-core GEMV's fragments):
 *           64 bytes of each of 16 rows per step;
 *  run256:  a warp owns 16 rows; per step each load instruction reads 256
 *           contiguous bytes of two rows (4 blocks of a row at once);
 *  seq512:  a warp reads rows one after another, 512 contiguous bytes per
 *           load instruction (the bf16 GEMV's pattern).
 *  quad64x: quad64 plus what the integer GEMV loads beside the weights per
 *           step: 26 uint4 of prepared activations by cp.async into a
 *           shared-memory ring (L2 hits), and/or two 2-byte scales per lane.
 * U = loads in flight per lane; parts = column parts per row (more warps;
 * parts 4 is the GEMV's grid: a block's four warps split one tile). */
#include "cuda_bench_util.cuh"

/* N loaded vectors folded into one word (so that no load is dead code) */
template <int N> __device__ __forceinline__ unsigned fold(const uint4 *v) {
    unsigned f = 0;
#pragma unroll
    for (int i = 0; i < N; i++) f ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    return f;
}

/* a sink no run writes (acc never has this value), kept for the compiler */
__device__ __forceinline__ void keep(unsigned acc, unsigned *sink) {
    if (acc == 0x12345678u) sink[0] = acc;
}

/* quad64 (ACT, SC false), and with activations (ACT) and scales (SC)
 * streamed as the integer GEMV streams them: U steps in flight, a ring of U
 * activation stages. MODE 1: each tile its own copy of the activations
 * (tile % copies); 2: one copy, each tile starting at a rotated block; 3: both. */
template <int U, bool ACT, bool SC, int MODE = 0>
__global__ void quad64x(const uint8_t *w, size_t row_bytes, int tiles, int parts, const uint4 *act,
                        const uint16_t *scales, unsigned *sink, int copies = 64) {
    __shared__ uint4 ring[4][U][26];
    const int wib = threadIdx.x >> 5;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    const int tile = warp / parts, part = warp % parts;
    if (tile >= tiles) return;
    const int g = lane >> 2, c = lane & 3;
    const int nblk = (int)(row_bytes / 64), per = (nblk + parts - 1) / parts;
    const int b0 = part * per, b1 = min(nblk, b0 + per);
    const uint8_t *lo = w + (size_t)(tile * 16 + g) * row_bytes + 16 * c, *hi = lo + 8 * row_bytes;
    const uint16_t *slo = scales + (size_t)(tile * 16 + g) * nblk * 2 + (c >> 1), *shi = slo + 8 * nblk * 2;
    if (MODE == 1 || MODE == 3) act += (size_t)(tile % copies) * nblk * 26;
    const int len = max(1, b1 - b0), rot = MODE >= 2 ? (tile * 7) % len : 0;
    unsigned acc = 0;
    for (int bb = b0; bb < b1; bb += U) {
        uint4 v[2 * U];
        unsigned s[2 * U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const bool in = bb + u < b1;
            int b = bb + rot;
            if (b + u >= b1) b -= len;
            v[2 * u] = in ? ld_nc(lo + (size_t)(b + u) * 64) : make_uint4(0, 0, 0, 0);
            v[2 * u + 1] = in ? ld_nc(hi + (size_t)(b + u) * 64) : make_uint4(0, 0, 0, 0);
            if (SC) {
                s[2 * u] = in ? slo[(size_t)(b + u) * 2] : 0u;
                s[2 * u + 1] = in ? shi[(size_t)(b + u) * 2] : 0u;
            }
            if (ACT) {
                if (in && lane < 26) {
                    const unsigned d = (unsigned)__cvta_generic_to_shared(&ring[wib][u][lane]);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(act + (size_t)(b + u) * 26 + lane));
                }
                asm volatile("cp.async.commit_group;\n" ::);
            }
        }
        if (ACT) asm volatile("cp.async.wait_group 0;\n" ::);
        __syncwarp();
        acc ^= fold<2 * U>(v);
        if (SC)
#pragma unroll
            for (int i = 0; i < 2 * U; i++) acc ^= s[i];
        if (ACT) {
            const uint4 a = ring[wib][0][lane % 26];
            acc ^= a.x ^ a.w;
        }
        __syncwarp();
    }
    keep(acc, sink);
}

/* quad64 with a block's four warps on four tiles over the same column part:
 * the part's activations are copied into shared memory once per block at
 * the start (cp.async, beside the first weight loads) and read from there */
template <int U>
__global__ void quad64y(const uint8_t *w, size_t row_bytes, int tiles, int parts, const uint4 *act, unsigned *sink) {
    extern __shared__ uint4 xs[];
    const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int part = blockIdx.x % parts, tile = (blockIdx.x / parts) * 4 + wib;
    const int g = lane >> 2, c = lane & 3;
    const int nblk = (int)(row_bytes / 64), per = (nblk + parts - 1) / parts;
    const int b0 = part * per, b1 = min(nblk, b0 + per);
    for (int i = threadIdx.x; i < (b1 - b0) * 26; i += blockDim.x) {
        const unsigned d = (unsigned)__cvta_generic_to_shared(&xs[i]);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(act + (size_t)b0 * 26 + i));
    }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (tile >= tiles) return;
    const uint8_t *lo = w + (size_t)(tile * 16 + g) * row_bytes + 16 * c, *hi = lo + 8 * row_bytes;
    unsigned acc = 0;
    for (int b = b0; b < b1; b += U) {
        uint4 v[2 * U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const bool in = b + u < b1;
            v[2 * u] = in ? ld_nc(lo + (size_t)(b + u) * 64) : make_uint4(0, 0, 0, 0);
            v[2 * u + 1] = in ? ld_nc(hi + (size_t)(b + u) * 64) : make_uint4(0, 0, 0, 0);
        }
        acc ^= fold<2 * U>(v);
        const uint4 a = xs[(b - b0) * 26 + lane % 26];
        acc ^= a.x ^ a.w;
    }
    keep(acc, sink);
}

/* per step: 16 rows x 256 bytes, 8 loads per lane (U steps in flight) */
template <int U>
__global__ void run256(const uint8_t *w, size_t row_bytes, int tiles, int parts, unsigned *sink) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    const int tile = warp / parts, part = warp % parts;
    if (tile >= tiles) return;
    const int nstep = (int)((row_bytes + 255) / 256), per = (nstep + parts - 1) / parts;
    const int s0 = part * per, s1 = min(nstep, s0 + per);
    const int chunk = lane & 15;
    unsigned acc = 0;
    for (int s = s0; s < s1; s += U) {
        uint4 v[8 * U];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const size_t off = (size_t)(s + u) * 256 + 16 * chunk;
                const int row = tile * 16 + 2 * i + (lane >> 4);
                v[8 * u + i] = s + u < s1 && off < row_bytes ? ld_nc(w + (size_t)row * row_bytes + off)
                                                             : make_uint4(0, 0, 0, 0);
            }
        acc ^= fold<8 * U>(v);
    }
    keep(acc, sink);
}

/* a warp per row group of rows_per_warp rows, 512 bytes per instruction */
template <int U>
__global__ void seq512(const uint8_t *w, size_t row_bytes, int rows, int rows_per_warp, unsigned *sink) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    const int r0 = warp * rows_per_warp;
    if (r0 >= rows) return;
    unsigned acc = 0;
    for (int r = r0; r < min(rows, r0 + rows_per_warp); r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (size_t off = 16 * lane; off < row_bytes; off += 512 * U) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                v[u] = off + 512 * u < row_bytes ? ld_nc(row + off + 512 * u) : make_uint4(0, 0, 0, 0);
            acc ^= fold<U>(v);
        }
    }
    keep(acc, sink);
}

template <typename K> static double time_kernel(K launch, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    launch();
    cudaEventRecord(a);
    for (int i = 0; i < reps; i++) launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms * 1e3 / reps;
}

int main() {
    const int rows_list[] = {21504, 43008, 5376, 5376, 5376};
    const size_t row_bytes_list[] = {2688, 2688, 10752, 4096, 4160};
    uint8_t *w;
    unsigned *sink;
    const size_t max_bytes = (size_t)43008 * 2688;
    cudaMalloc(&w, max_bytes);
    cudaMemset(w, 1, max_bytes);
    cudaMalloc(&sink, 4);
    uint4 *act;
    uint16_t *scales;
    const size_t act_bytes = (size_t)64 * 168 * 26 * 16; /* 64 private copies of 168 blocks */
    cudaMalloc(&act, act_bytes);
    cudaMemset(act, 1, act_bytes);
    cudaMalloc(&scales, (size_t)43008 * 42 * 2 * 2 * 4);
    cudaMemset(scales, 1, (size_t)43008 * 42 * 2 * 2 * 4);
    for (int m = 0; m < 5; m++) {
        const int rows = rows_list[m];
        const size_t rb = row_bytes_list[m];
        const double bytes = (double)rows * rb;
        const int tiles = rows / 16;
        printf("%d x %zu bytes (%.1f MB)\n", rows, rb, bytes / 1e6);
        for (int parts = 1; parts <= 8; parts *= 2) {
            const int warps = tiles * parts, blocks = (warps + 3) / 4;
            double t;
            t = time_kernel([&] { quad64x<3, false, false><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64x U=3 weights only parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { quad64x<3, true, false><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64x U=3 +activations parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { quad64x<3, false, true><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64x U=3 +scales parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { quad64x<3, true, true><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64x U=3 +both parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { quad64x<3, true, false, 1><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64x U=3 +private activations parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            for (int copies = 2; copies <= 32; copies *= 2) {
                t = time_kernel([&] { quad64x<3, true, true, 1><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink, copies); }, 20);
                printf("  quad64x U=3 +scales +activations in %d copies parts %d: %6.1f us %5.0f GB/s\n", copies, parts, t, bytes / t / 1e3);
                t = time_kernel([&] { quad64x<3, true, true, 3><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink, copies); }, 20);
                printf("  quad64x U=3 +scales +activations in %d copies, rotated parts %d: %6.1f us %5.0f GB/s\n", copies, parts, t, bytes / t / 1e3);
            }
            t = time_kernel([&] { quad64x<3, true, false, 2><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64x U=3 +activations, rotated start parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            {
                const int yblocks = (tiles + 3) / 4 * parts, nb = (int)(rb / 64);
                const size_t smem = (size_t)((nb + parts - 1) / parts) * 26 * 16;
                cudaFuncSetAttribute(quad64y<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
                t = time_kernel([&] { quad64y<3><<<yblocks, 128, smem>>>(w, rb, tiles, parts, act, sink); }, 20);
                printf("  quad64y U=3 4 tiles/block, activations once parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            }
            t = time_kernel([&] { quad64x<2, false, false><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64 U=2 parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { quad64x<4, false, false><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64 U=4 parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { quad64x<8, false, false><<<blocks, 128>>>(w, rb, tiles, parts, act, scales, sink); }, 20);
            printf("  quad64 U=8 parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { run256<1><<<blocks, 128>>>(w, rb, tiles, parts, sink); }, 20);
            printf("  run256 U=1 parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
            t = time_kernel([&] { run256<2><<<blocks, 128>>>(w, rb, tiles, parts, sink); }, 20);
            printf("  run256 U=2 parts %d: %6.1f us %5.0f GB/s\n", parts, t, bytes / t / 1e3);
        }
        for (int rpw = 1; rpw <= 4; rpw *= 2) {
            const int warps = (rows + rpw - 1) / rpw, blocks = (warps + 3) / 4;
            double t = time_kernel([&] { seq512<4><<<blocks, 128>>>(w, rb, rows, rpw, sink); }, 20);
            printf("  seq512 U=4 rows/warp %d: %6.1f us %5.0f GB/s\n", rpw, t, bytes / t / 1e3);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("%s\n", cudaGetErrorString(e));
    return 0;
}
