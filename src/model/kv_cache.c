#include "model/kv_cache.h"

#include <stdlib.h>
#include <string.h>

int g4_kv_ring_blocks(int window, int chunk, int block_size) {
    /* positions [first - window + 1, first + chunk) must map to distinct slots */
    int span = window + chunk - 1;
    return (span + block_size - 1) / block_size + 1;
}

uint64_t g4_kv_row_bytes(g4_kv_type type, int head_dim) {
    switch (type) {
    case G4_KV_BF16: return 2 * (uint64_t)head_dim;
    case G4_KV_FP8: return (uint64_t)head_dim + 4;
    default: return 4 * (uint64_t)head_dim;
    }
}

uint64_t g4_kv_pool_bytes(const g4_kv_pool *p, const g4_model *m) {
    uint64_t total = 0;
    for (int i = 0; i < p->n_layers; i++) {
        const g4_layer_config *lc = &m->config.text.layers[i];
        if (!p->layer_kv[i]) continue;
        int blocks = lc->kind == G4_LAYER_SLIDING ? p->n_sliding_blocks : p->n_full_blocks;
        total += (uint64_t)blocks * p->block_size * lc->n_kv_heads * 2 * g4_kv_row_bytes(p->type, lc->head_dim);
    }
    return total;
}

uint64_t g4_kv_bytes_per_position(const g4_model *m, g4_kv_type type, g4_layer_kind kind) {
    const g4_text_config *tc = &m->config.text;
    uint64_t total = 0;
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_layer_config *lc = &tc->layers[i];
        if (lc->kv_donor >= 0 || lc->kind != kind) continue;
        total += (uint64_t)lc->n_kv_heads * 2 * g4_kv_row_bytes(type, lc->head_dim);
    }
    return total;
}

const char *g4_kv_type_name(g4_kv_type type) {
    switch (type) {
    case G4_KV_F32: return "f32";
    case G4_KV_BF16: return "bf16";
    case G4_KV_FP8: return "fp8";
    default: return "auto";
    }
}

int g4_kv_type_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "f32")) return G4_KV_F32;
    if (!strcmp(name, "bf16")) return G4_KV_BF16;
    if (!strcmp(name, "fp8")) return G4_KV_FP8;
    if (!strcmp(name, "auto")) return G4_KV_AUTO;
    return -1;
}

g4_kv_type g4_kv_type_resolve(g4_kv_type type, g4_precision precision, const g4_model *m) {
    if (type != G4_KV_AUTO) return type;
    if (precision == G4_PRECISION_EXACT) return G4_KV_F32;
    uint64_t total = 0;
    for (int f = 0; f < 5; f++) total += m->weight_bytes_by_format[f];
    return 2 * m->weight_bytes_by_format[G4_WEIGHT_F32] > total ? G4_KV_F32 : G4_KV_BF16;
}

int g4_kv_blocks_for(const g4_kv_pool *p, int length) { return (length + p->block_size - 1) / p->block_size; }

g4_status g4_kv_pool_create(const g4_model *m, int block_size, int n_full_blocks, int n_sliding_blocks,
                            int ring_blocks, g4_kv_type type, g4_kv_pool **out) {
    *out = NULL;
    if (type == G4_KV_AUTO) type = G4_KV_F32;
    if (type != G4_KV_F32 && type != G4_KV_BF16 && type != G4_KV_FP8)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "unknown KV cache type %d", (int)type);
    const g4_text_config *tc = &m->config.text;
    if (block_size <= 0 || n_full_blocks < 0 || n_sliding_blocks < 0 || ring_blocks <= 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "invalid KV cache geometry");
    g4_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    p->be = m->backend;
    p->type = type;
    p->block_size = block_size;
    p->n_layers = tc->n_layers;
    p->n_full_blocks = n_full_blocks;
    p->n_sliding_blocks = n_sliding_blocks;
    p->ring_blocks = ring_blocks;
    p->layer_kv = calloc((size_t)tc->n_layers, sizeof *p->layer_kv);
    p->free_full = malloc((size_t)(n_full_blocks + 1) * sizeof *p->free_full);
    p->free_sliding = malloc((size_t)(n_sliding_blocks + 1) * sizeof *p->free_sliding);
    if (!p->layer_kv || !p->free_full || !p->free_sliding) {
        g4_kv_pool_free(p);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* hand out low block numbers first */
    for (int i = 0; i < n_full_blocks; i++) p->free_full[i] = n_full_blocks - 1 - i;
    for (int i = 0; i < n_sliding_blocks; i++) p->free_sliding[i] = n_sliding_blocks - 1 - i;
    p->n_free_full = n_full_blocks;
    p->n_free_sliding = n_sliding_blocks;
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_layer_config *lc = &tc->layers[i];
        if (lc->kv_donor >= 0) continue;
        int blocks = lc->kind == G4_LAYER_SLIDING ? n_sliding_blocks : n_full_blocks;
        p->layer_kv[i] = p->be->ops->kv_alloc(p->be, blocks, block_size, lc->n_kv_heads, lc->head_dim, type);
        if (!p->layer_kv[i]) {
            g4_kv_pool_free(p);
            return g4_fail(G4_ERR_OUT_OF_MEMORY,
                           "out of memory allocating the %s KV cache (%d blocks of %d positions, layer %d)",
                           g4_kv_type_name(type), blocks, block_size, i);
        }
    }
    *out = p;
    return G4_OK;
}

void g4_kv_pool_free(g4_kv_pool *p) {
    if (!p) return;
    if (p->layer_kv)
        for (int i = 0; i < p->n_layers; i++)
            if (p->layer_kv[i]) p->be->ops->kv_free(p->be, p->layer_kv[i]);
    free(p->layer_kv);
    free(p->free_full);
    free(p->free_sliding);
    free(p);
}

g4_status g4_kv_seq_init(g4_kv_pool *p, g4_kv_seq *s) {
    memset(s, 0, sizeof *s);
    if (p->n_free_sliding < p->ring_blocks)
        return g4_fail(G4_ERR_LIMIT, "KV cache full: no room for another sequence's sliding window");
    s->ring = malloc((size_t)p->ring_blocks * sizeof *s->ring);
    if (!s->ring) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < p->ring_blocks; i++) s->ring[i] = p->free_sliding[--p->n_free_sliding];
    return G4_OK;
}

g4_status g4_kv_seq_grow_table(g4_kv_seq *s, int need) {
    if (need <= s->cap_full) return G4_OK;
    int cap = s->cap_full ? s->cap_full : 16;
    while (cap < need) cap *= 2;
    int32_t *grown = realloc(s->full_blocks, (size_t)cap * sizeof *grown);
    if (!grown) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    /* entries past n_full are read as table padding, never as blocks */
    memset(grown + s->cap_full, 0, (size_t)(cap - s->cap_full) * sizeof *grown);
    s->full_blocks = grown;
    s->cap_full = cap;
    return G4_OK;
}

g4_status g4_kv_seq_reserve(g4_kv_pool *p, g4_kv_seq *s, int new_length) {
    int need = g4_kv_blocks_for(p, new_length);
    if (need <= s->n_full) return G4_OK;
    if (need - s->n_full > p->n_free_full)
        return g4_fail(G4_ERR_LIMIT, "KV cache full: %d positions need %d blocks, %d free", new_length,
                       need - s->n_full, p->n_free_full);
    g4_status st = g4_kv_seq_grow_table(s, need);
    if (st != G4_OK) return st;
    while (s->n_full < need) s->full_blocks[s->n_full++] = p->free_full[--p->n_free_full];
    return G4_OK;
}

void g4_kv_seq_truncate(g4_kv_seq *s, int length) {
    if (length < s->length) s->length = length;
}

void g4_kv_seq_release(g4_kv_pool *p, g4_kv_seq *s) {
    for (int i = s->n_full - 1; i >= 0; i--) p->free_full[p->n_free_full++] = s->full_blocks[i];
    if (s->ring)
        for (int i = p->ring_blocks - 1; i >= 0; i--) p->free_sliding[p->n_free_sliding++] = s->ring[i];
    free(s->full_blocks);
    free(s->ring);
    memset(s, 0, sizeof *s);
}
