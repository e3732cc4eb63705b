/* Open-addressing hash tables for the tokenizer: byte string -> id (vocab,
 * added tokens) and id pair -> merge (BPE ranks). Built once at load time,
 * read-only afterwards (so safe to share between threads). */
#ifndef G4_TEXT_HASH_TABLES_H
#define G4_TEXT_HASH_TABLES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t g4_hash_bytes(const void *data, size_t n) {
    const unsigned char *s = data;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8, n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ v) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

/* Keys are not copied: they must outlive the table. The first 8 bytes are
 * kept in the slot, so short keys compare without touching the key. */
typedef struct {
    uint64_t head; /* first 8 bytes of the key, zero-padded */
    const char *key;
    uint32_t len;  /* 0 marks an empty slot (the empty key is never stored) */
    int32_t value;
} g4_strmap_slot;

static inline uint64_t g4_key_head(const char *key, size_t len) {
    uint64_t v = 0;
    if (len >= 8) memcpy(&v, key, 8);
    else
        for (size_t i = 0; i < len; i++) v |= (uint64_t)(unsigned char)key[i] << (8 * i);
    return v;
}

typedef struct {
    g4_strmap_slot *slots;
    uint32_t mask, count;
} g4_strmap;

/* Sized for `expected` keys; 0 on allocation failure. */
int g4_strmap_init(g4_strmap *m, size_t expected);
void g4_strmap_free(g4_strmap *m);
/* Inserts key -> value; returns the existing value if the key was present
 * (leaving it unchanged), else -1. Grows as needed; -2 on allocation
 * failure; -3 for the empty key, which is not stored. */
int32_t g4_strmap_put(g4_strmap *m, const char *key, size_t len, int32_t value);

static inline uint32_t g4_strmap_index(const g4_strmap *m, uint64_t hash) { return (uint32_t)(hash >> 40) & m->mask; }

/* Lookup with a precomputed g4_hash_bytes(key, len). */
static inline int32_t g4_strmap_get_hashed(const g4_strmap *m, const char *key, size_t len, uint64_t hash) {
    if (!m->slots || !len) return -1;
    uint64_t head = g4_key_head(key, len);
    for (uint32_t i = g4_strmap_index(m, hash);; i = (i + 1) & m->mask) {
        const g4_strmap_slot *s = &m->slots[i];
        if (!s->len) return -1;
        if (s->head == head && s->len == len && (len <= 8 || !memcmp(s->key + 8, key + 8, len - 8))) return s->value;
    }
}

static inline int32_t g4_strmap_get(const g4_strmap *m, const char *key, size_t len) {
    return g4_strmap_get_hashed(m, key, len, g4_hash_bytes(key, len));
}

/* (left id, right id) -> (rank, merged id). */
typedef struct {
    uint64_t key; /* UINT64_MAX marks an empty slot */
    uint32_t rank;
    int32_t new_id;
} g4_merge_slot;

typedef struct {
    g4_merge_slot *slots;
    uint64_t mask, count;
} g4_merge_map;

int g4_merge_map_init(g4_merge_map *m, size_t expected);
void g4_merge_map_free(g4_merge_map *m);
/* Inserts or overwrites (a later duplicate merge wins, as in `tokenizers`). */
void g4_merge_map_put(g4_merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id);

static inline uint64_t g4_merge_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static inline uint64_t g4_merge_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return k;
}

static inline const g4_merge_slot *g4_merge_map_get(const g4_merge_map *m, int32_t a, int32_t b) {
    if (!m->slots) return NULL;
    uint64_t k = g4_merge_key(a, b);
    for (uint64_t i = g4_merge_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        const g4_merge_slot *s = &m->slots[i];
        if (s->key == k) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

#endif
