/* CPU implementations of the vision tower's ops (see backend.h). */
#ifndef G4_BACKEND_CPU_VISION_OPS_H
#define G4_BACKEND_CPU_VISION_OPS_H

#include "backend/backend.h"

void cpu_affine(g4_backend *be, float *out, const float *a, float s, float b, size_t n);
void cpu_rope_2d(g4_backend *be, float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, float theta);
void cpu_pool_rows(g4_backend *be, float *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim,
                   float scale);

#endif
