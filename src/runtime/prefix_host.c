#include "runtime/prefix_host.h"

#include <stdlib.h>
#include <string.h>

g4_status g4_host_tier_init(g4_host_tier *t, uint64_t budget, size_t block_bytes, size_t window_block_bytes) {
    memset(t, 0, sizeof *t);
    t->budget = budget;
    t->block_bytes = block_bytes;
    t->window_block_bytes = window_block_bytes;
    t->lru_head = t->lru_tail = -1;
    /* every entry holds at least a block or a window of one block */
    const size_t smallest = block_bytes < window_block_bytes || !window_block_bytes ? block_bytes : window_block_bytes;
    const uint64_t most = budget / (smallest ? smallest : 1) + 1;
    t->cap = most > (1u << 24) ? 1 << 24 : (int)most;
    t->entries = calloc((size_t)t->cap, sizeof *t->entries);
    t->free_slots = malloc((size_t)t->cap * sizeof *t->free_slots);
    if (!t->entries || !t->free_slots || g4_block_index_init(&t->index, t->cap) != G4_OK) {
        g4_host_tier_free(t);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the host-RAM prefix tier");
    }
    for (int i = t->cap - 1; i >= 0; i--) t->free_slots[t->n_free++] = i;
    return G4_OK;
}

void g4_host_tier_free(g4_host_tier *t) {
    if (t->entries)
        for (int i = 0; i < t->cap; i++) {
            free(t->entries[i].block);
            free(t->entries[i].window);
        }
    free(t->entries);
    free(t->free_slots);
    g4_block_index_free(&t->index);
    memset(t, 0, sizeof *t);
}

static void lru_unlink(g4_host_tier *t, int32_t i) {
    g4_host_entry *e = &t->entries[i];
    if (e->prev >= 0) t->entries[e->prev].next = e->next;
    else t->lru_head = e->next;
    if (e->next >= 0) t->entries[e->next].prev = e->prev;
    else t->lru_tail = e->prev;
    e->prev = e->next = -1;
}

static void lru_push_newest(g4_host_tier *t, int32_t i) {
    g4_host_entry *e = &t->entries[i];
    e->prev = t->lru_tail;
    e->next = -1;
    if (t->lru_tail >= 0) t->entries[t->lru_tail].next = i;
    else t->lru_head = i;
    t->lru_tail = i;
}

static size_t window_bytes(const g4_host_tier *t, const g4_host_entry *e) {
    return (size_t)e->window_n * t->window_block_bytes;
}

static void entry_remove(g4_host_tier *t, int32_t i) {
    g4_host_entry *e = &t->entries[i];
    lru_unlink(t, i);
    g4_block_index_remove(&t->index, &e->hash);
    if (e->block) t->bytes -= t->block_bytes;
    if (e->window) t->bytes -= window_bytes(t, e);
    free(e->block);
    free(e->window);
    memset(e, 0, sizeof *e);
    t->free_slots[t->n_free++] = i;
}

/* Evicts the oldest unpinned entries (never `keep`) until `need` more bytes
 * fit; 0 when they cannot. */
static int make_room(g4_host_tier *t, uint64_t need, int32_t keep) {
    if (need > t->budget) return 0;
    int32_t i = t->lru_head;
    while (t->bytes + need > t->budget && i >= 0) {
        int32_t next = t->entries[i].next;
        if (!t->entries[i].pinned && i != keep) {
            entry_remove(t, i);
            t->evicted++;
        }
        i = next;
    }
    return t->bytes + need <= t->budget;
}

int32_t g4_host_tier_find(g4_host_tier *t, const g4_block_hash *h) {
    if (!t->entries) return -1;
    int32_t i = g4_block_index_find(&t->index, h);
    if (i >= 0) {
        lru_unlink(t, i);
        lru_push_newest(t, i);
    }
    return i;
}

/* The entry of h, made (empty, newest) when absent; -1 when no slot. */
static int32_t entry_for(g4_host_tier *t, const g4_block_hash *h) {
    int32_t i = g4_host_tier_find(t, h);
    if (i >= 0) return i;
    if (t->n_free == 0 && t->lru_head >= 0 && !t->entries[t->lru_head].pinned) {
        entry_remove(t, t->lru_head);
        t->evicted++;
    }
    if (t->n_free == 0) return -1;
    i = t->free_slots[--t->n_free];
    t->entries[i] = (g4_host_entry){.hash = *h, .prev = -1, .next = -1, .used = 1};
    g4_block_index_insert(&t->index, h, i);
    lru_push_newest(t, i);
    return i;
}

/* Removes an entry left with neither part. */
static void drop_if_empty(g4_host_tier *t, int32_t i) {
    if (!t->entries[i].block && !t->entries[i].window) entry_remove(t, i);
}

uint8_t *g4_host_tier_put_block(g4_host_tier *t, const g4_block_hash *h) {
    if (!t->entries || !t->block_bytes) return NULL;
    int32_t i = entry_for(t, h);
    if (i < 0) return NULL;
    g4_host_entry *e = &t->entries[i];
    if (e->block || !make_room(t, t->block_bytes, i) || !(e->block = malloc(t->block_bytes))) {
        drop_if_empty(t, i);
        return NULL;
    }
    t->bytes += t->block_bytes;
    return e->block;
}

uint8_t *g4_host_tier_put_window(g4_host_tier *t, const g4_block_hash *h, int first, int n) {
    if (!t->entries || !t->window_block_bytes || n <= 0) return NULL;
    int32_t i = entry_for(t, h);
    if (i < 0) return NULL;
    g4_host_entry *e = &t->entries[i];
    const size_t bytes = (size_t)n * t->window_block_bytes;
    if (e->window || !make_room(t, bytes, i) || !(e->window = malloc(bytes))) {
        drop_if_empty(t, i);
        return NULL;
    }
    e->window_first = first;
    e->window_n = n;
    t->bytes += bytes;
    return e->window;
}

void g4_host_tier_drop_block(g4_host_tier *t, int32_t i) {
    g4_host_entry *e = &t->entries[i];
    if (!e->block) return;
    free(e->block);
    e->block = NULL;
    t->bytes -= t->block_bytes;
    drop_if_empty(t, i);
}
