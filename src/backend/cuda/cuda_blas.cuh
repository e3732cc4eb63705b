/* The few cuBLAS entry points the CUDA backend uses, resolved at run time
 * (cuda_blas.cu says why). */
#ifndef G4_BACKEND_CUDA_BLAS_CUH
#define G4_BACKEND_CUDA_BLAS_CUH

#include <cublas_v2.h>

struct cuda_blas_api {
    decltype(&cublasCreate) create;
    decltype(&cublasDestroy) destroy;
    decltype(&cublasSetStream) set_stream;
    decltype(&cublasSetWorkspace) set_workspace;
    decltype(&cublasSetMathMode) set_math_mode;
    /* the C entry point (cublas_api.h overloads the name for C++) */
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k,
                              const void *alpha, const void *a, cudaDataType a_type, int lda, const void *b,
                              cudaDataType b_type, int ldb, const void *beta, void *c, cudaDataType c_type, int ldc,
                              cublasComputeType_t compute, cublasGemmAlgo_t algo);
    decltype(&cublasSgemm) sgemm;
    /* the C entry point, as for gemm_ex; optional: NULL when the library lacks it */
    cublasStatus_t (*gemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k,
                                   const void *alpha, const void *const a[], cudaDataType a_type, int lda,
                                   const void *const b[], cudaDataType b_type, int ldb, const void *beta,
                                   void *const c[], cudaDataType c_type, int ldc, int batch_count,
                                   cublasComputeType_t compute, cublasGemmAlgo_t algo);
};

/* The loaded library's functions (loaded once, thread-safe), or NULL with
 * *error saying why it could not be loaded. */
const cuda_blas_api *cuda_blas(const char **error);

#endif
