/* A hash table from block hashes (SHA-256 chain hashes of KV blocks) to
 * small integers, by open addressing with linear probing; the prefix cache
 * keeps one for the blocks in the KV pool and one for those in host RAM. */
#ifndef G4_RUNTIME_BLOCK_INDEX_H
#define G4_RUNTIME_BLOCK_INDEX_H

#include <stdint.h>

#include "base/status.h"

typedef struct {
    uint8_t bytes[32];
} g4_block_hash;

typedef struct {
    g4_block_hash key;
    int32_t value; /* -1: empty */
} g4_block_index_slot;

typedef struct {
    g4_block_index_slot *slots;
    uint32_t mask;
} g4_block_index;

/* Room for `capacity` keys at most half full. */
g4_status g4_block_index_init(g4_block_index *ix, int capacity);
void g4_block_index_free(g4_block_index *ix);
/* The key's value, or -1. */
int32_t g4_block_index_find(const g4_block_index *ix, const g4_block_hash *key);
/* The key must be absent and the table below capacity. */
void g4_block_index_insert(g4_block_index *ix, const g4_block_hash *key, int32_t value);
/* Removes the key (present). */
void g4_block_index_remove(g4_block_index *ix, const g4_block_hash *key);

#endif
