/* cuBLAS is opened with dlopen when the first CUDA backend is created, not
 * linked: loading libcublas (and the libcublasLt it pulls in) costs ~210 MB
 * of resident memory at program start, which every CPU-only run would pay. */
#include "backend/cuda/cuda_blas.cuh"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define G4_STRINGIFY_VALUE(x) #x
#define G4_STRINGIFY(x) G4_STRINGIFY_VALUE(x)

static cuda_blas_api blas_api;
static char blas_error[512];
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

/* cublas_v2.h maps cublasCreate to cublasCreate_v2 and so on; the exported
 * names are the _v2 ones. */
static int find(void *lib, const char *name, void **fn) {
    *fn = dlsym(lib, name);
    if (*fn) return 1;
    snprintf(blas_error, sizeof blas_error, "cuBLAS has no symbol %s", name);
    return 0;
}

static void load_blas(void) {
    const char *candidates[] = {"libcublas.so." G4_STRINGIFY(CUBLAS_VER_MAJOR),
#ifdef G4_CUBLAS_PATH
                                G4_CUBLAS_PATH,
#endif
                                "libcublas.so"};
    void *lib = NULL;
    for (size_t i = 0; !lib && i < sizeof candidates / sizeof candidates[0]; i++)
        lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(blas_error, sizeof blas_error, "cannot load cuBLAS (%s): %s", candidates[0], dlerror());
        return;
    }
    cuda_blas_api a;
    if (find(lib, "cublasCreate_v2", (void **)&a.create) && find(lib, "cublasDestroy_v2", (void **)&a.destroy) &&
        find(lib, "cublasSetStream_v2", (void **)&a.set_stream) &&
        find(lib, "cublasSetWorkspace_v2", (void **)&a.set_workspace) &&
        find(lib, "cublasSetMathMode", (void **)&a.set_math_mode) && find(lib, "cublasGemmEx", (void **)&a.gemm_ex) &&
        find(lib, "cublasSgemm_v2", (void **)&a.sgemm)) {
        a.gemm_batched = (decltype(a.gemm_batched))dlsym(lib, "cublasGemmBatchedEx");
        blas_api = a;
    }
}

const cuda_blas_api *cuda_blas(const char **error) {
    pthread_once(&blas_once, load_blas);
    if (blas_api.create) return &blas_api;
    if (error) *error = blas_error;
    return NULL;
}
