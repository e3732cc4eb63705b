/* What a model's serving takes in memory, from the sizes the allocations
 * themselves use (kv_cache.h, text_decoder.h): KV bytes per position of
 * the full and the sliding layers, the sliding rings' fixed cost per
 * sequence, the weights and the working memory, and from those the largest
 * context that n sequences can hold within a byte budget. `gemma4 info`,
 * the server's start line and its pool sizing read it. */
#ifndef G4_RUNTIME_MEMORY_PLAN_H
#define G4_RUNTIME_MEMORY_PLAN_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    g4_kv_type kv_type;
    int block_size;                  /* positions per KV block */
    int chunk;                       /* tokens per forward pass (the rings hold window + chunk) */
    int max_seqs;                    /* sequences the working memory is sized for */
    uint64_t full_bytes_per_token;   /* K and V of one position over the full layers with storage */
    uint64_t sliding_bytes_per_token; /* the same over the sliding layers */
    int ring_tokens;                 /* positions of one sequence's sliding ring */
    uint64_t ring_bytes;             /* its bytes: the fixed cost of a sequence, whatever its length */
    uint64_t snapshot_bytes;         /* one prefix-cache snapshot of the sliding window (an engine keeps
                                      * cache_snapshots of them beyond the rings) */
    uint64_t weight_bytes;           /* the model's weights (text, vision, audio) */
    uint64_t scratch_bytes;          /* the decoder's working memory for chunk tokens, max_seqs logit rows */
    uint64_t reserve_bytes;          /* backend work buffers (CUDA: a prefill's bf16 copy of the largest
                                      * weight and the cuBLAS workspace), an estimate */
} g4_memory_plan;

void g4_memory_plan_make(const g4_model *m, g4_kv_type type, int block_size, int chunk, int max_seqs,
                         g4_memory_plan *out);
/* KV bytes one sequence of n_ctx positions holds (the session's and the
 * engine's sizing: whole blocks; the ring no longer than the context). */
uint64_t g4_memory_plan_seq_bytes(const g4_memory_plan *p, int n_ctx);
/* The largest context (a multiple of the block size, at most max_position)
 * for which n_seqs sequences fit in `budget` bytes with the weights, the
 * working memory and the reserve; 0 when not even one block does. */
int g4_memory_plan_max_ctx(const g4_memory_plan *p, uint64_t budget, int n_seqs, int max_position);
/* The same with every fixed cost taken: how many full-layer blocks a pool
 * gets from `budget` for n_seqs sequences (their rings taken first). */
int64_t g4_memory_plan_full_blocks(const g4_memory_plan *p, uint64_t budget, int n_seqs);

/* The budget the plan's sizes are measured against, for a model already
 * loaded: on CUDA `fraction` of the device's memory less what other
 * allocations than the weights already hold there (vLLM's
 * --gpu-memory-utilization); on the CPU `fraction` of the memory Linux
 * reports available now plus the weights (already mapped). 0 when unknown. */
uint64_t g4_memory_budget(const g4_memory_plan *p, g4_backend *be, double fraction);

/* G4_ERR_LIMIT, saying what to change, when a CPU pool of full_blocks and
 * sliding_blocks blocks of `block_size` would take more than the memory
 * available now (calloc could succeed and the process be killed later as
 * the pages fill); G4_OK otherwise and on other backends, whose allocation
 * fails cleanly. */
g4_status g4_memory_check_kv(const g4_model *m, g4_kv_type type, int block_size, int64_t full_blocks,
                             int64_t sliding_blocks, int n_ctx);

/* Bytes the system could give this process now (Linux MemAvailable; 0 when
 * unknown). */
uint64_t g4_memory_available(void);

#endif
