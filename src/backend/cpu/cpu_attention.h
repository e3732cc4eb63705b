/* CPU KV cache pool and attention over it (see backend.h). */
#ifndef G4_BACKEND_CPU_ATTENTION_H
#define G4_BACKEND_CPU_ATTENTION_H

#include "backend/backend.h"

void *cpu_kv_alloc(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim);
void cpu_kv_free(g4_backend *be, void *kv);
void cpu_kv_store(g4_backend *be, void *kv, const float *k, const float *v, const g4_attn_batch *b, int sliding);
void cpu_kv_read(g4_backend *be, const void *kv, float *k, float *v, const g4_attn_batch *b, int sliding);
/* Where token t of b is stored: its K and V rows ([n_kv_heads][head_dim]). */
void cpu_kv_copy_blocks(g4_backend *be, void *kv, const int32_t *src, const int32_t *dst, int n);
void cpu_kv_slot_rows(void *kv, const g4_attn_batch *b, int t, int sliding, float **k, float **v);
void cpu_attention(g4_backend *be, float *out, const float *q, const void *kv, const g4_attn_batch *b,
                   int sliding, int n_heads, float scale);

#endif
