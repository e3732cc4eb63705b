/* Could cuBLAS run the MoE experts' prefill products faster than our grouped
 * kernel (moe_gemm_kernel: the 26B-A4B's bf16 experts take ~0.96 ms per layer
 * at 512 tokens, ~50 TFLOP/s of useful work)? Times, for one projection of
 * E experts over slots sorted by expert (out_e = X_e W_e^T, bf16 operands,
 * float32 results, as cuda_matmul's gemm_bf16):
 *   loop     one cublasGemmEx per expert (m = weight rows, n = its slots)
 *   grouped  cublasGemmGroupedBatchedEx, one group per expert (cuBLAS 13
 *            refuses it with float32 output: status 15, NOT_SUPPORTED)
 *   grouped, bf16 out  the same with bf16 results (not float32-accurate)
 *   padded   cublasGemmStridedBatchedEx with every expert padded to the
 *            largest expert's slot count
 *   dense    one GEMM of all slots against a single expert's weights: the
 *            rate cuBLAS reaches at this shape when nothing is grouped
 * with uniform routing (every expert ~slots / E) and skewed routing (expert
 * e drawn with weight 1 / (e + 1)). "parts 2" stacks each expert's hi and lo
 * activation rows (the float32-accurate split), doubling its n.
 *   nvcc -O3 -arch=sm_90a -o /tmp/moecublas bench/moe_cublas_bench.cu -lcublas && /tmp/moecublas
 * Prints µs per call (median of 20 after 3 warm-ups) and useful TFLOP/s. */
#include <algorithm>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <random>
#include <vector>

#include "cuda_bench_util.cuh"

#define BLAS_CHECK(x)                                                                                              \
    do {                                                                                                           \
        cublasStatus_t s_ = (x);                                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                         \
            printf("%s: cuBLAS status %d\n", #x, (int)s_);                                                         \
            return 1;                                                                                              \
        }                                                                                                          \
    } while (0)
/* in the timed loop: a variant cuBLAS refuses is reported and skipped */
#define VARIANT_CHECK(x)                                                                                           \
    do {                                                                                                           \
        cublasStatus_t s_ = (x);                                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) failed = (int)s_;                                                         \
    } while (0)

__global__ void fill(__nv_bfloat16 *p, size_t n, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(scale * (float)((i * 2654435761u) % 1000) / 1000.0f - scale / 2);
}

/* slots per expert for T tokens choosing k distinct experts of E */
static std::vector<int> route(int T, int k, int E, bool skewed, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<double> w(E);
    for (int e = 0; e < E; e++) w[e] = skewed ? 1.0 / (e + 1) : 1.0;
    std::vector<int> count(E, 0);
    for (int t = 0; t < T; t++) {
        std::vector<double> left = w;
        for (int j = 0; j < k; j++) {
            std::discrete_distribution<int> pick(left.begin(), left.end());
            const int e = pick(rng);
            count[e]++;
            left[e] = 0.0;
        }
    }
    return count;
}

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main() {
    const int E = 128, k = 8, T = 512;
    const struct {
        const char *name;
        int N, K;
    } proj[] = {{"gate|up 1408 x 2816", 1408, 2816}, {"down 2816 x 704", 2816, 704}};
    cublasHandle_t h;
    BLAS_CHECK(cublasCreate(&h));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    printf("E = %d experts, top-%d of %d tokens; us per call (median of 20) and useful TFLOP/s\n", E, k, T);
    for (int skewed = 0; skewed < 2; skewed++)
        for (int parts = 1; parts <= 2; parts++)
            for (const auto &p : proj) {
                std::vector<int> count = route(T, k, E, skewed, 7);
                for (int &c : count) c *= parts;
                int slots = 0, most = 0;
                for (int c : count) slots += c, most = std::max(most, c);
                const int N = p.N, K = p.K;
                __nv_bfloat16 *w, *x, *xpad;
                float *out, *outpad;
                CHECK(cudaMalloc(&w, (size_t)E * N * K * 2));
                CHECK(cudaMalloc(&x, (size_t)slots * K * 2));
                CHECK(cudaMalloc(&xpad, (size_t)E * most * K * 2));
                CHECK(cudaMalloc(&out, (size_t)slots * N * 4));
                CHECK(cudaMalloc(&outpad, (size_t)E * most * N * 4));
                fill<<<1024, 256>>>(w, (size_t)E * N * K, 0.1f);
                fill<<<1024, 256>>>(x, (size_t)slots * K, 2.0f);
                fill<<<1024, 256>>>(xpad, (size_t)E * most * K, 2.0f);
                /* the grouped call's arrays: per expert with slots, one group of one problem */
                std::vector<cublasOperation_t> ta, tb;
                std::vector<int> m_arr, n_arr, k_arr, lda, ldb, ldc, gsize;
                std::vector<float> alpha, beta;
                std::vector<const void *> A, B;
                std::vector<void *> C;
                size_t row = 0;
                for (int e = 0; e < E; e++) {
                    if (count[e] == 0) continue;
                    ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N);
                    m_arr.push_back(N), n_arr.push_back(count[e]), k_arr.push_back(K);
                    lda.push_back(K), ldb.push_back(K), ldc.push_back(N), gsize.push_back(1);
                    alpha.push_back(1.0f), beta.push_back(0.0f);
                    A.push_back(w + (size_t)e * N * K), B.push_back(x + row * K), C.push_back(out + row * N);
                    row += count[e];
                }
                const int groups = (int)A.size();
                const void **dA;
                const void **dB;
                void **dC;
                CHECK(cudaMalloc(&dA, groups * sizeof(void *)));
                CHECK(cudaMalloc(&dB, groups * sizeof(void *)));
                CHECK(cudaMalloc(&dC, groups * sizeof(void *)));
                CHECK(cudaMemcpy(dA, A.data(), groups * sizeof(void *), cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(dB, B.data(), groups * sizeof(void *), cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(dC, C.data(), groups * sizeof(void *), cudaMemcpyHostToDevice));
                /* the same problems writing bf16 (cuBLAS's grouped GEMM takes bf16 inputs only with bf16 output) */
                __nv_bfloat16 *outbf;
                void **dCbf;
                CHECK(cudaMalloc(&outbf, (size_t)slots * N * 2));
                CHECK(cudaMalloc(&dCbf, groups * sizeof(void *)));
                std::vector<void *> Cbf;
                for (void *c : C) Cbf.push_back(outbf + ((float *)c - out));
                CHECK(cudaMemcpy(dCbf, Cbf.data(), groups * sizeof(void *), cudaMemcpyHostToDevice));
                const float one = 1.0f, zero = 0.0f;
                double us[5];
                for (int variant = 0; variant < 5; variant++) {
                    std::vector<float> times;
                    int failed = 0;
                    for (int it = 0; it < 23 && !failed; it++) {
                        CHECK(cudaEventRecord(e0));
                        if (variant == 0) {
                            for (int g = 0; g < groups; g++)
                                VARIANT_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, n_arr[g], K, &one, A[g], CUDA_R_16BF,
                                                        K, B[g], CUDA_R_16BF, K, &zero, C[g], CUDA_R_32F, N,
                                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                        } else if (variant == 1) {
                            VARIANT_CHECK(cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m_arr.data(), n_arr.data(),
                                                                  k_arr.data(), alpha.data(), dA, CUDA_R_16BF, lda.data(),
                                                                  dB, CUDA_R_16BF, ldb.data(), beta.data(), dC,
                                                                  CUDA_R_32F, ldc.data(), groups, gsize.data(),
                                                                  CUBLAS_COMPUTE_32F));
                        } else if (variant == 2) {
                            VARIANT_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, most, K, &one, w,
                                                                  CUDA_R_16BF, K, (long long)N * K, xpad, CUDA_R_16BF, K,
                                                                  (long long)most * K, &zero, outpad, CUDA_R_32F, N,
                                                                  (long long)most * N, E, CUBLAS_COMPUTE_32F,
                                                                  CUBLAS_GEMM_DEFAULT));
                        } else if (variant == 4) {
                            VARIANT_CHECK(cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m_arr.data(), n_arr.data(),
                                                                     k_arr.data(), alpha.data(), dA, CUDA_R_16BF, lda.data(),
                                                                     dB, CUDA_R_16BF, ldb.data(), beta.data(), dCbf,
                                                                     CUDA_R_16BF, ldc.data(), groups, gsize.data(),
                                                                     CUBLAS_COMPUTE_32F));
                        } else {
                            VARIANT_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, slots, K, &one, w, CUDA_R_16BF, K, x,
                                                    CUDA_R_16BF, K, &zero, out, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                                    CUBLAS_GEMM_DEFAULT));
                        }
                        CHECK(cudaEventRecord(e1));
                        CHECK(cudaEventSynchronize(e1));
                        float ms;
                        CHECK(cudaEventElapsedTime(&ms, e0, e1));
                        if (it >= 3) times.push_back(ms * 1000.0f);
                    }
                    us[variant] = failed ? -1.0 : median(times);
                    if (failed) printf("  (variant %d: cuBLAS status %d)\n", variant, failed);
                }
                const double flop = 2.0 * slots * (double)N * K;
                printf("%s parts %d %-20s slots %5d, most %4d | loop %8.1f (%5.0f) | grouped %8.1f (%5.0f) | padded %8.1f "
                       "(%5.0f) | dense %8.1f (%5.0f) | grouped, bf16 out %8.1f (%5.0f)\n",
                       skewed ? "skewed " : "uniform", parts, p.name, slots, most, us[0], flop / us[0] / 1e6, us[1],
                       flop / us[1] / 1e6, us[2], flop / us[2] / 1e6, us[3], flop / us[3] / 1e6, us[4], flop / us[4] / 1e6);
                CHECK(cudaFree(w));
                CHECK(cudaFree(x));
                CHECK(cudaFree(xpad));
                CHECK(cudaFree(out));
                CHECK(cudaFree(outpad));
                CHECK(cudaFree(dA));
                CHECK(cudaFree(dB));
                CHECK(cudaFree(dC));
                CHECK(cudaFree(dCbf));
                CHECK(cudaFree(outbf));
            }
    return 0;
}
