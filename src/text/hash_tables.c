#include "text/hash_tables.h"

#include <stdlib.h>

static uint64_t table_size(size_t expected) {
    uint64_t n = 16;
    while (n < expected * 2) n *= 2; /* load factor at most 1/2 */
    return n;
}

int g4_strmap_init(g4_strmap *m, size_t expected) {
    uint64_t n = table_size(expected);
    m->slots = calloc(n, sizeof *m->slots);
    m->mask = (uint32_t)(n - 1);
    m->count = 0;
    return m->slots != NULL;
}

void g4_strmap_free(g4_strmap *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

static void strmap_insert_slot(g4_strmap *m, const g4_strmap_slot *src, uint64_t h64) {
    for (uint32_t i = g4_strmap_index(m, h64);; i = (i + 1) & m->mask) {
        if (!m->slots[i].len) {
            m->slots[i] = *src;
            m->count++;
            return;
        }
    }
}

int32_t g4_strmap_put(g4_strmap *m, const char *key, size_t len, int32_t value) {
    if (!len) return -3;
    if (!m->slots && !g4_strmap_init(m, 16)) return -2;
    uint64_t h64 = g4_hash_bytes(key, len);
    int32_t old = g4_strmap_get_hashed(m, key, len, h64);
    if (old >= 0) return old;
    if ((uint64_t)(m->count + 1) * 2 > (uint64_t)m->mask + 1) {
        g4_strmap bigger;
        if (!g4_strmap_init(&bigger, (size_t)m->count + 1)) return -2;
        for (uint32_t i = 0; i <= m->mask; i++)
            if (m->slots[i].len) strmap_insert_slot(&bigger, &m->slots[i], g4_hash_bytes(m->slots[i].key, m->slots[i].len));
        free(m->slots);
        *m = bigger;
    }
    g4_strmap_slot s = {g4_key_head(key, len), key, (uint32_t)len, value};
    strmap_insert_slot(m, &s, h64);
    return -1;
}

int g4_merge_map_init(g4_merge_map *m, size_t expected) {
    uint64_t n = table_size(expected);
    m->slots = malloc(n * sizeof *m->slots);
    if (!m->slots) return 0;
    for (uint64_t i = 0; i < n; i++) m->slots[i].key = UINT64_MAX;
    m->mask = n - 1;
    m->count = 0;
    return 1;
}

void g4_merge_map_free(g4_merge_map *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

void g4_merge_map_put(g4_merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t k = g4_merge_key(a, b);
    for (uint64_t i = g4_merge_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        g4_merge_slot *s = &m->slots[i];
        if (s->key == k || s->key == UINT64_MAX) {
            if (s->key == UINT64_MAX) m->count++;
            s->key = k;
            s->rank = rank;
            s->new_id = new_id;
            return;
        }
    }
}
