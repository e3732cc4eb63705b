#include "runtime/block_index.h"

#include <stdlib.h>
#include <string.h>

g4_status g4_block_index_init(g4_block_index *ix, int capacity) {
    uint32_t size = 16;
    while (size < 2u * (uint32_t)(capacity > 0 ? capacity : 1)) size *= 2;
    ix->slots = malloc((size_t)size * sizeof *ix->slots);
    ix->mask = size - 1;
    if (!ix->slots) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for a block index of %d entries", capacity);
    for (uint32_t i = 0; i < size; i++) ix->slots[i].value = -1;
    return G4_OK;
}

void g4_block_index_free(g4_block_index *ix) {
    free(ix->slots);
    ix->slots = NULL;
}

/* A SHA-256 hash is uniform: its first bytes are the slot. */
static uint32_t home_of(const g4_block_index *ix, const g4_block_hash *key) {
    uint32_t x;
    memcpy(&x, key->bytes, sizeof x);
    return x & ix->mask;
}

static int same(const g4_block_hash *a, const g4_block_hash *b) { return !memcmp(a->bytes, b->bytes, sizeof a->bytes); }

int32_t g4_block_index_find(const g4_block_index *ix, const g4_block_hash *key) {
    for (uint32_t i = home_of(ix, key);; i = (i + 1) & ix->mask) {
        const g4_block_index_slot *s = &ix->slots[i];
        if (s->value < 0) return -1;
        if (same(&s->key, key)) return s->value;
    }
}

void g4_block_index_insert(g4_block_index *ix, const g4_block_hash *key, int32_t value) {
    uint32_t i = home_of(ix, key);
    while (ix->slots[i].value >= 0) i = (i + 1) & ix->mask;
    ix->slots[i] = (g4_block_index_slot){*key, value};
}

/* Linear probing's deletion: later entries of the cluster move back so that
 * no lookup stops early at the hole. */
void g4_block_index_remove(g4_block_index *ix, const g4_block_hash *key) {
    uint32_t i = home_of(ix, key);
    while (!same(&ix->slots[i].key, key) || ix->slots[i].value < 0) i = (i + 1) & ix->mask; /* present: found before a hole */
    ix->slots[i].value = -1;
    for (uint32_t j = (i + 1) & ix->mask; ix->slots[j].value >= 0; j = (j + 1) & ix->mask) {
        const uint32_t home = home_of(ix, &ix->slots[j].key);
        /* the entry at j may move to i when its home is not in (i, j] cyclically */
        const int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            ix->slots[i] = ix->slots[j];
            ix->slots[j].value = -1;
            i = j;
        }
    }
}
