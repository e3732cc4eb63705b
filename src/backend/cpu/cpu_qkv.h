/* The fused attention input of a layer on the CPU (qkv_prepare, backend.h). */
#ifndef G4_BACKEND_CPU_QKV_H
#define G4_BACKEND_CPU_QKV_H

#include "backend/backend.h"

void cpu_qkv_prepare(g4_backend *be, float *q, const float *qkv, const g4_qkv_params *p, void *kv,
                     const g4_attn_batch *b, int sliding);

#endif
