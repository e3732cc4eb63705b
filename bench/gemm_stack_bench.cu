/* Prefill products with split activations: is one cuBLAS GEMM over the hi and
 * lo parts stacked as 2T rows (then a sum of the two halves) faster than two
 * GEMMs of T rows, the second accumulating into the first (what
 * cuda_matmul does)? The weight is read once instead of twice and the GEMM
 * is twice as tall, against an extra pass over the float32 output.
 *   nvcc -O3 -arch=sm_90a -o /tmp/gemmstack bench/gemm_stack_bench.cu -lcublas && /tmp/gemmstack [T]
 * Shapes: the 31B's projections (N weight rows x K columns). Prints µs per
 * call (median of 20 after 3 warm-ups) and the TFLOP/s of one T-row product. */
#include <algorithm>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <vector>

#include "cuda_bench_util.cuh"

__global__ void sum_halves(float *out, const float *two, size_t n) {
    const size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    const float4 a = *reinterpret_cast<const float4 *>(two + i);
    const float4 b = *reinterpret_cast<const float4 *>(two + n + i);
    *reinterpret_cast<float4 *>(out + i) = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__global__ void fill(__nv_bfloat16 *p, size_t n, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(scale * (float)((i * 2654435761u) % 1000) / 1000.0f - scale / 2);
}

static cublasStatus_t gemm(cublasHandle_t h, float *out, int ldo, const __nv_bfloat16 *x, int n, const __nv_bfloat16 *w,
                           int rows, int cols, float beta) {
    const float alpha = 1.0f;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha, w, CUDA_R_16BF, cols, x, CUDA_R_16BF, cols,
                        &beta, out, CUDA_R_32F, ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 512;
    const int shapes[][2] = {{16384, 5376}, {18432, 5376}, {5376, 8192}, {5376, 16384}, {43008, 5376}, {5376, 21504}};
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    printf("T = %d tokens; us per call (median of 20)\n", T);
    printf("%7s %6s | %9s %9s %9s %9s %9s | %s\n", "N", "K", "two T", "stack 2T", "2T only", "sum", "one T",
           "TFLOP/s of one T");
    for (auto &s : shapes) {
        const int N = s[0], K = s[1];
        __nv_bfloat16 *w, *x;
        float *out, *two;
        CHECK(cudaMalloc(&w, (size_t)N * K * 2));
        CHECK(cudaMalloc(&x, (size_t)2 * T * K * 2));
        CHECK(cudaMalloc(&out, (size_t)T * N * 4));
        CHECK(cudaMalloc(&two, (size_t)2 * T * N * 4));
        fill<<<1024, 256>>>(w, (size_t)N * K, 0.1f);
        fill<<<1024, 256>>>(x, (size_t)2 * T * K, 2.0f);
        const size_t n_out = (size_t)T * N;
        const unsigned sum_blocks = (unsigned)((n_out / 4 + 255) / 256);
        double us[5];
        for (int variant = 0; variant < 5; variant++) {
            std::vector<float> times;
            for (int it = 0; it < 23; it++) {
                CHECK(cudaEventRecord(e0));
                cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
                if (variant == 0) {
                    st = gemm(h, out, N, x, T, w, N, K, 0.0f);
                    if (st == CUBLAS_STATUS_SUCCESS) st = gemm(h, out, N, x + (size_t)T * K, T, w, N, K, 1.0f);
                } else if (variant == 1) {
                    st = gemm(h, two, N, x, 2 * T, w, N, K, 0.0f);
                    sum_halves<<<sum_blocks, 256>>>(out, two, n_out);
                } else if (variant == 2) {
                    st = gemm(h, two, N, x, 2 * T, w, N, K, 0.0f);
                } else if (variant == 3) {
                    sum_halves<<<sum_blocks, 256>>>(out, two, n_out);
                } else {
                    st = gemm(h, out, N, x, T, w, N, K, 0.0f);
                }
                CHECK(cudaEventRecord(e1));
                CHECK(cudaEventSynchronize(e1));
                if (st != CUBLAS_STATUS_SUCCESS) {
                    printf("cublasGemmEx failed (%d)\n", (int)st);
                    return 1;
                }
                float ms;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= 3) times.push_back(ms * 1000.0f);
            }
            std::sort(times.begin(), times.end());
            us[variant] = times[times.size() / 2];
        }
        const double flop = 2.0 * T * (double)N * K;
        printf("%7d %6d | %9.1f %9.1f %9.1f %9.1f %9.1f | %.0f\n", N, K, us[0], us[1], us[2], us[3], us[4],
               flop / us[4] / 1e6);
        CHECK(cudaFree(w));
        CHECK(cudaFree(x));
        CHECK(cudaFree(out));
        CHECK(cudaFree(two));
    }
    return 0;
}
