/* CUDA-only entry points beside the op table: what the device is, whether
 * something failed on it, and the machine limits `gemma4 bench` prints.
 * Built without CUDA (cuda_stub.c) they report "no device". */
#ifndef G4_BACKEND_CUDA_BACKEND_H
#define G4_BACKEND_CUDA_BACKEND_H

#include <stddef.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest step (tokens) run_step records: decode steps and small
 * batches. Larger ones always run their ops directly. */
enum { G4_CUDA_RECORD_MAX_TOKENS = 64 };

/* g4_backend_cuda_create with tuning overrides: tune is "key=value,..."
 * (README.md, "CUDA tuning"; NULL or "" for none), applied after the
 * device's measured defaults and the G4_CUDA_TUNE environment variable.
 * G4_ERR_INVALID_ARGUMENT naming the key or value when one is wrong. */
g4_status g4_backend_cuda_create_tuned(int device, const char *tune, g4_backend **out);
/* Whether be is a CUDA backend. */
int g4_backend_is_cuda(const g4_backend *be);
/* The device's name ("" when not CUDA). */
const char *g4_cuda_device_name(const g4_backend *be);
/* G4_OK, or the first failure of a CUDA call since creation (its message
 * becomes the current error). Ops cannot return errors themselves. */
g4_status g4_cuda_status(g4_backend *be);
/* The device's compute capability as 10 major + minor (90 for Hopper), and
 * whether this build's sm_90a kernels (the warpgroup GEMM) run on it; 0
 * when not CUDA. */
int g4_cuda_compute_capability(const g4_backend *be);
int g4_cuda_has_wgmma(const g4_backend *be);
/* How many recorded steps (CUDA graphs) this backend has launched. */
long g4_cuda_graph_launches(const g4_backend *be);
/* Device memory in use, in bytes (all processes). */
size_t g4_cuda_memory_used(g4_backend *be);
/* The device's free and total memory (cudaMemGetInfo); 0 when not CUDA. */
int g4_cuda_memory_info(g4_backend *be, size_t *free_bytes, size_t *total_bytes);
/* Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes
 * written (median of timed 1 GiB copies); 0 on failure. */
double g4_cuda_probe_bandwidth(g4_backend *be);
/* bf16 matrix product rate in TFLOP/s through cuBLAS (8192^3, float32
 * accumulation, random inputs, median of timed runs); 0 on failure. */
double g4_cuda_probe_bf16_tflops(g4_backend *be);

#ifdef __cplusplus
}
#endif
#endif
