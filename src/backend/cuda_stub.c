/* Built when the CUDA backend is not (no nvcc, or GEMMA4_CUDA=OFF): the
 * entry points exist and say there is no device. */
#include "backend/cuda/cuda_backend.h"

g4_status g4_backend_cuda_create(int device, g4_backend **out) {
    (void)device;
    *out = NULL;
    return g4_fail(G4_ERR_UNSUPPORTED, "this build of gemma4 has no CUDA backend (built without nvcc)");
}

g4_status g4_backend_cuda_create_tuned(int device, const char *tune, g4_backend **out) {
    (void)tune;
    return g4_backend_cuda_create(device, out);
}

int g4_backend_is_cuda(const g4_backend *be) {
    (void)be;
    return 0;
}

const char *g4_cuda_device_name(const g4_backend *be) {
    (void)be;
    return "";
}

g4_status g4_cuda_status(g4_backend *be) {
    (void)be;
    return g4_fail(G4_ERR_UNSUPPORTED, "no CUDA backend in this build");
}

int g4_cuda_compute_capability(const g4_backend *be) {
    (void)be;
    return 0;
}

int g4_cuda_has_wgmma(const g4_backend *be) {
    (void)be;
    return 0;
}

long g4_cuda_graph_launches(const g4_backend *be) {
    (void)be;
    return 0;
}

int g4_cuda_memory_info(g4_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = *total_bytes = 0;
    return 0;
}

size_t g4_cuda_memory_used(g4_backend *be) {
    (void)be;
    return 0;
}

double g4_cuda_probe_bandwidth(g4_backend *be) {
    (void)be;
    return 0;
}

double g4_cuda_probe_bf16_tflops(g4_backend *be) {
    (void)be;
    return 0;
}
