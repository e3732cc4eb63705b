/* CPU top_logits: the k largest logits of each row and its log-sum-exp. */
#ifndef G4_BACKEND_CPU_SAMPLING_H
#define G4_BACKEND_CPU_SAMPLING_H

#include "backend/backend.h"

void cpu_top_logits(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                    int vocab, int k);

#endif
