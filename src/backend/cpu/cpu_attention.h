/* CPU KV cache pool and attention over it (see backend.h). */
#ifndef G4_BACKEND_CPU_ATTENTION_H
#define G4_BACKEND_CPU_ATTENTION_H

#include <stddef.h>

#include "backend/backend.h"

void *cpu_kv_alloc(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim, g4_kv_type type);
void cpu_kv_free(g4_backend *be, void *kv);
void cpu_kv_store(g4_backend *be, void *kv, const float *k, const float *v, const g4_attn_batch *b, int sliding);
void cpu_kv_read(g4_backend *be, const void *kv, float *k, float *v, const g4_attn_batch *b, int sliding);
/* Copies whole blocks src[i] -> dst[i] of both halves (and fp8 scales). */
void cpu_kv_copy_blocks(g4_backend *be, void *kv, const int32_t *src, const int32_t *dst, int n);
void cpu_kv_save_blocks(g4_backend *be, const void *kv, const int32_t *blocks, int n, void *host);
void cpu_kv_load_blocks(g4_backend *be, void *kv, const int32_t *blocks, int n, const void *host);
/* Stores one KV head's k and v rows ([head_dim] floats) of token t of b,
 * rounded to the pool's type (kv_store is this for every head). */
void cpu_kv_put(void *kv, const g4_attn_batch *b, int t, int sliding, int head, const float *k, const float *v);
/* Bytes the pool's arrays took (what calloc was asked for). */
size_t cpu_kv_allocated_bytes(const void *kv);
/* Bytes of one stored value of `type` (F32, BF16 or FP8). */
size_t cpu_kv_value_bytes(g4_kv_type type);
void cpu_attention(g4_backend *be, float *out, const float *q, const void *kv, const g4_attn_batch *b,
                   int sliding, int n_heads, float scale);

#endif
