/* Opening the GPU in the CUDA tests of whole models and the engine
 * (test_cuda_fixtures, test_cuda_replay, test_cuda_masked_top), which take
 * the backend's defaults (the op tests' harness, cuda_harness.h, sets
 * tuning of its own). */
#ifndef G4_TESTS_SUPPORT_CUDA_DEVICE_H
#define G4_TESTS_SUPPORT_CUDA_DEVICE_H

#include <stdio.h>

#include "backend/cuda/cuda_backend.h"
#include "test_util.h"

/* The CUDA backend on device 0 in *gpu: 0 when ready (its name printed),
 * 77 (the test's skip status) without a usable GPU, 1 after a failed check. */
static inline int cuda_device_open(g4_backend **gpu) {
    const g4_status st = g4_backend_cuda_create(0, gpu);
    if (st == G4_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", g4_error_message());
        return 77;
    }
    CHECK(st == G4_OK, "CUDA backend: %s", g4_error_message());
    if (st != G4_OK) return 1;
    printf("CUDA device: %s\n", g4_cuda_device_name(*gpu));
    return 0;
}

#endif
