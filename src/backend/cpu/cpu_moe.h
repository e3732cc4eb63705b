/* CPU mixture-of-experts: router top-k and the routed expert MLPs. */
#ifndef G4_BACKEND_CPU_MOE_H
#define G4_BACKEND_CPU_MOE_H

#include "backend/backend.h"

void cpu_moe_route(g4_backend *be, int32_t *ids, float *weights, const float *logits, const float *expert_scale,
                   int n, int n_experts, int k);
void cpu_moe_experts(g4_backend *be, float *out, const float *x, int n, const int32_t *ids, const float *weights,
                     int k, const g4_expert_matrix *gate, const g4_expert_matrix *up,
                     const g4_expert_matrix *down);

#endif
