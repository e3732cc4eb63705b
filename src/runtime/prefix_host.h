/* The prefix cache's host-RAM tier (`--cache-ram MiB`): KV the pool had to
 * give back, kept in ordinary memory under the same chain hashes so that a
 * later prompt with that prefix copies it back instead of prefilling it.
 *
 * An entry holds a full block's KV over every full-attention layer with
 * storage, a sliding-window snapshot ending at that block, or both; bytes
 * are opaque here (the backend's kv_save_blocks layout). Entries are
 * evicted least recently used first to stay within the budget; pinned ones
 * (an admission in progress reads them) are never evicted. */
#ifndef G4_RUNTIME_PREFIX_HOST_H
#define G4_RUNTIME_PREFIX_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/block_index.h"

typedef struct {
    g4_block_hash hash;
    uint8_t *block;          /* full layers' KV of the block, or NULL */
    uint8_t *window;         /* sliding-window snapshot ending at the block, or NULL */
    int window_first, window_n; /* its logical blocks */
    int pinned;
    int32_t prev, next;      /* LRU list; -1 at the ends */
    int used;
} g4_host_entry;

typedef struct {
    g4_block_index index;
    g4_host_entry *entries;
    int cap;
    int32_t *free_slots;
    int n_free;
    int32_t lru_head, lru_tail; /* oldest, newest */
    uint64_t budget, bytes;
    size_t block_bytes;       /* one full block's entry */
    size_t window_block_bytes; /* one sliding block of a snapshot */
    uint64_t evicted;         /* entries dropped for room */
} g4_host_tier;

/* budget: bytes of host RAM; block_bytes, window_block_bytes > 0 as above. */
g4_status g4_host_tier_init(g4_host_tier *t, uint64_t budget, size_t block_bytes, size_t window_block_bytes);
void g4_host_tier_free(g4_host_tier *t);

/* The entry of a hash, or -1; a found entry becomes the most recently used. */
int32_t g4_host_tier_find(g4_host_tier *t, const g4_block_hash *h);

/* Room for the block's KV (block_bytes) under h: the caller fills it. NULL
 * when the entry has a block already or no room can be made. */
uint8_t *g4_host_tier_put_block(g4_host_tier *t, const g4_block_hash *h);
/* Room for a snapshot of n sliding blocks (logical first..) under h; NULL
 * when the entry has one already or no room can be made. */
uint8_t *g4_host_tier_put_window(g4_host_tier *t, const g4_block_hash *h, int first, int n);

/* Frees entry e's block (its window stays; the entry goes with neither). */
void g4_host_tier_drop_block(g4_host_tier *t, int32_t e);

#endif
