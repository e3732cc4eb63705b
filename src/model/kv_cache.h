/* The KV cache: per-layer pools of fixed-size blocks, shared by sequences.
 *
 * Layers of one kind (sliding or full) share one block numbering, so a
 * sequence needs one block table per kind, not per layer. Full layers map
 * logical block b = pos / block_size through a growing table; sliding layers
 * keep a ring of `ring_blocks` blocks per sequence, enough for the window
 * plus one prefill chunk. KV-shared layers have no storage of their own: they
 * read their donor layer's pool. */
#ifndef G4_MODEL_KV_CACHE_H
#define G4_MODEL_KV_CACHE_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    g4_backend *be;
    g4_kv_type type;        /* of every layer's K and V (never AUTO) */
    int block_size;
    int n_layers;
    void **layer_kv;        /* [n_layers]: backend KV storage, NULL on KV-shared layers */
    int n_full_blocks, n_sliding_blocks;
    int ring_blocks;        /* sliding blocks per sequence */
    int32_t *free_full, *free_sliding;
    int n_free_full, n_free_sliding;
} g4_kv_pool;

typedef struct {
    int32_t *full_blocks;   /* logical block -> pool block (full layers) */
    int n_full, cap_full;
    int32_t *ring;          /* [ring_blocks] (sliding layers) */
    int length;             /* positions stored so far */
} g4_kv_seq;

/* Ring size (in blocks) so that a sliding window of `window` plus a chunk of
 * `chunk` new positions never overwrite a position still visible. */
int g4_kv_ring_blocks(int window, int chunk, int block_size);

/* type: F32, BF16 or FP8 (AUTO: F32, the verification path's). */
g4_status g4_kv_pool_create(const g4_model *m, int block_size, int n_full_blocks, int n_sliding_blocks,
                            int ring_blocks, g4_kv_type type, g4_kv_pool **out);
void g4_kv_pool_free(g4_kv_pool *p);

/* Takes the sequence's ring blocks (G4_ERR_LIMIT when the pool is full). */
g4_status g4_kv_seq_init(g4_kv_pool *p, g4_kv_seq *s);
/* Room in the sequence's full-layer table for `need` logical blocks (no
 * blocks taken). */
g4_status g4_kv_seq_grow_table(g4_kv_seq *s, int need);
/* Ensures full-layer blocks exist for positions < new_length. */
g4_status g4_kv_seq_reserve(g4_kv_pool *p, g4_kv_seq *s, int new_length);
/* Forgets positions >= length (keeps blocks). */
void g4_kv_seq_truncate(g4_kv_seq *s, int length);
void g4_kv_seq_release(g4_kv_pool *p, g4_kv_seq *s);

/* Bytes the pool's K and V storage takes (what kv_alloc allocated, FP8's
 * row scales included). */
uint64_t g4_kv_pool_bytes(const g4_kv_pool *p, const g4_model *m);

/* KV types by name: "f32", "bf16", "fp8" (g4_kv_type_parse: G4_KV_AUTO
 * for "auto", -1 for anything else). */
const char *g4_kv_type_name(g4_kv_type type);
int g4_kv_type_parse(const char *name);
/* What AUTO means: F32 on the exact path (the verification path); on the
 * fast path BF16 (CUDA and CPU alike: README, "Precision"), unless the
 * model's weights are mostly float32 (the fixtures): the fast path keeps
 * float32 products for those, and so keeps their cache float32 too. */
g4_kv_type g4_kv_type_resolve(g4_kv_type type, g4_precision precision, const g4_model *m);
/* Bytes one stored row of head_dim values of `type` takes (FP8: its scale too). */
uint64_t g4_kv_row_bytes(g4_kv_type type, int head_dim);
/* Bytes of K and V per position over the layers of one kind (sliding or
 * full) that hold storage (KV-shared layers hold none). */
uint64_t g4_kv_bytes_per_position(const g4_model *m, g4_kv_type type, g4_layer_kind kind);

/* Full-layer blocks a sequence of `length` positions needs. */
int g4_kv_blocks_for(const g4_kv_pool *p, int length);

#endif
