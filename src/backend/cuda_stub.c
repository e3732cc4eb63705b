/* Builds without the CUDA backend still offer its constructor, so callers can
 * ask for a GPU and get a clear answer. */
#include "backend/backend.h"

g4_status g4_backend_cuda_create(int device, g4_backend **out) {
    (void)device;
    *out = NULL;
    return g4_fail(G4_ERR_UNSUPPORTED, "this build of gemma4 has no CUDA backend (rebuild with nvcc present)");
}
