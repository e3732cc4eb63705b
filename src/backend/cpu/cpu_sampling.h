/* CPU top_logits: the k largest logits of each row and its log-sum-exp
 * (top_logits_masked: of the rows a token mask leaves). */
#ifndef G4_BACKEND_CPU_SAMPLING_H
#define G4_BACKEND_CPU_SAMPLING_H

#include "backend/backend.h"

void cpu_top_logits(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                    int vocab, int k);
/* The same through a token mask per row (backend.h, top_logits_masked). */
void cpu_top_logits_masked(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                           int vocab, int k, const uint32_t *masks, int mask_words, const int32_t *slot);

#endif
