#include "runtime/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

/* One full pool block's cache state; indexed by the block's number. */
typedef struct {
    g4_block_hash hash;
    int cached;             /* registered in the table */
    int refs;               /* sequences holding the block */
    int32_t prev, next;     /* LRU list of idle cached blocks (refs == 0) */
    int32_t snapshot;       /* index into snaps, or -1 */
} node;

/* The sliding window ending at its node's block: ring blocks of logical
 * blocks [first, first + n) copied into sliding pool blocks. */
typedef struct {
    int32_t owner;          /* full block of the node; -1 = unused slot */
    int first, n;
    uint64_t last_use;
} snapshot;

struct g4_prefix_cache {
    const g4_model *model;
    g4_kv_pool *pool;
    int snap_blocks;        /* blocks per snapshot (0: model without sliding layers) */
    node *nodes;            /* [n_full_blocks] */
    int32_t lru_head, lru_tail; /* oldest, newest idle block */
    int n_idle, n_cached, n_held;
    int32_t *table;         /* open addressing: block numbers, -1 = empty */
    uint32_t table_mask;
    snapshot *snaps;
    int32_t *snap_pool;     /* [max_snaps][snap_blocks] sliding blocks */
    int max_snaps, n_snaps;
    uint64_t clock;
    uint64_t full_block_bytes, sliding_block_bytes;
    g4_prefix_stats stats;
    int32_t *match;         /* blocks of the last lookup's match */
    int match_cap;
    int32_t *copy_src, *copy_dst; /* [snap_blocks] */
};

int g4_prefix_snapshot_blocks(const g4_model *m, int block_size) {
    const g4_text_config *tc = &m->config.text;
    int any = 0;
    for (int i = 0; i < tc->n_layers; i++)
        any |= tc->layers[i].kind == G4_LAYER_SLIDING && tc->layers[i].kv_donor < 0;
    if (!any || tc->sliding_window <= 0) return 0;
    return (tc->sliding_window + block_size - 1) / block_size;
}

/* KV bytes one block of each kind takes over all layers with storage, at
 * the pool's element type. */
static uint64_t block_bytes(const g4_model *m, const g4_kv_pool *pool, int sliding) {
    return (uint64_t)pool->block_size *
           g4_kv_bytes_per_position(m, pool->type, sliding ? G4_LAYER_SLIDING : G4_LAYER_FULL);
}

g4_status g4_prefix_cache_create(const g4_model *m, g4_kv_pool *pool, g4_prefix_cache **out) {
    *out = NULL;
    g4_prefix_cache *c = calloc(1, sizeof *c);
    if (!c) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    c->model = m;
    c->pool = pool;
    c->snap_blocks = g4_prefix_snapshot_blocks(m, pool->block_size);
    c->lru_head = c->lru_tail = -1;
    const int nb = pool->n_full_blocks;
    uint32_t size = 16;
    while (size < 2u * (uint32_t)nb) size *= 2;
    c->table_mask = size - 1;
    c->nodes = calloc((size_t)nb + 1, sizeof *c->nodes);
    c->table = malloc((size_t)size * sizeof *c->table);
    c->max_snaps = c->snap_blocks ? pool->n_sliding_blocks / c->snap_blocks + 1 : 1;
    c->snaps = calloc((size_t)c->max_snaps, sizeof *c->snaps);
    c->snap_pool = malloc(((size_t)c->max_snaps * c->snap_blocks + 1) * sizeof *c->snap_pool);
    c->copy_src = malloc(((size_t)c->snap_blocks + 1) * sizeof *c->copy_src);
    c->copy_dst = malloc(((size_t)c->snap_blocks + 1) * sizeof *c->copy_dst);
    if (!c->nodes || !c->table || !c->snaps || !c->snap_pool || !c->copy_src || !c->copy_dst) {
        g4_prefix_cache_free(c);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the prefix cache");
    }
    for (uint32_t i = 0; i < size; i++) c->table[i] = -1;
    for (int i = 0; i < nb; i++) c->nodes[i].prev = c->nodes[i].next = c->nodes[i].snapshot = -1;
    for (int i = 0; i < c->max_snaps; i++) c->snaps[i].owner = -1;
    c->full_block_bytes = block_bytes(m, pool, 0);
    c->sliding_block_bytes = block_bytes(m, pool, 1);
    *out = c;
    return G4_OK;
}

void g4_prefix_cache_free(g4_prefix_cache *c) {
    if (!c) return;
    free(c->nodes);
    free(c->table);
    free(c->snaps);
    free(c->snap_pool);
    free(c->match);
    free(c->copy_src);
    free(c->copy_dst);
    free(c);
}

/* ---- hashing ---- */

static void sha256(const void *data, size_t n, g4_block_hash *out) {
    unsigned int len = 0;
    if (!EVP_Digest(data, n, out->bytes, &len, EVP_sha256(), NULL)) memset(out->bytes, 0, sizeof out->bytes);
}

void g4_prefix_media_keys(const int32_t *rows, const float *embeds, int n, int dim, g4_block_hash *keys) {
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && rows[j] == rows[j - 1] + 1) j++;
        g4_block_hash run;
        sha256(embeds + (size_t)i * dim, (size_t)(j - i) * dim * sizeof(float), &run);
        for (int k = i; k < j; k++) keys[k] = run;
        i = j;
    }
}

void g4_prefix_hash_blocks(const g4_prefix_cache *c, const int32_t *ids, const int32_t *media_rows,
                           const g4_block_hash *media_keys, int n_media, int from, int to, g4_block_hash *hashes) {
    const int bs = c->pool->block_size;
    /* parent hash | ids | (row, key) of each soft token in the block */
    size_t cap = sizeof(g4_block_hash) + (size_t)bs * (sizeof(int32_t) + sizeof(int32_t) + sizeof(g4_block_hash));
    uint8_t *buf = malloc(cap);
    if (!buf) {
        /* no hashes: zeroed ones could collide, so make them unique to nothing */
        for (int b = from; b < to; b++) memset(hashes[b].bytes, 0xff, sizeof hashes[b].bytes);
        return;
    }
    int m = 0;
    for (int b = from; b < to; b++) {
        size_t len = 0;
        if (b > 0) memcpy(buf, hashes[b - 1].bytes, sizeof(g4_block_hash));
        else memset(buf, 0, sizeof(g4_block_hash));
        len += sizeof(g4_block_hash);
        memcpy(buf + len, ids + (size_t)b * bs, (size_t)bs * sizeof(int32_t));
        len += (size_t)bs * sizeof(int32_t);
        while (m < n_media && media_rows[m] < b * bs) m++;
        for (int k = m; k < n_media && media_rows[k] < (b + 1) * bs; k++) {
            memcpy(buf + len, &media_rows[k], sizeof(int32_t));
            len += sizeof(int32_t);
            memcpy(buf + len, media_keys[k].bytes, sizeof(g4_block_hash));
            len += sizeof(g4_block_hash);
        }
        sha256(buf, len, &hashes[b]);
    }
    free(buf);
}

/* ---- the table: hash -> block ---- */

static uint32_t slot_of(const g4_prefix_cache *c, const g4_block_hash *h) {
    uint32_t x;
    memcpy(&x, h->bytes, sizeof x);
    return x & c->table_mask;
}

static int32_t table_find(const g4_prefix_cache *c, const g4_block_hash *h) {
    for (uint32_t i = slot_of(c, h);; i = (i + 1) & c->table_mask) {
        int32_t b = c->table[i];
        if (b < 0) return -1;
        if (!memcmp(c->nodes[b].hash.bytes, h->bytes, sizeof h->bytes)) return b;
    }
}

static void table_insert(g4_prefix_cache *c, int32_t block) {
    uint32_t i = slot_of(c, &c->nodes[block].hash);
    while (c->table[i] >= 0) i = (i + 1) & c->table_mask;
    c->table[i] = block;
}

/* Linear probing's deletion: later entries of the cluster move back so
 * that no lookup stops early at the hole. */
static void table_remove(g4_prefix_cache *c, int32_t block) {
    uint32_t i = slot_of(c, &c->nodes[block].hash);
    while (c->table[i] != block) i = (i + 1) & c->table_mask;
    c->table[i] = -1;
    for (uint32_t j = (i + 1) & c->table_mask; c->table[j] >= 0; j = (j + 1) & c->table_mask) {
        int32_t b = c->table[j];
        uint32_t home = slot_of(c, &c->nodes[b].hash);
        /* b may move to i when its home is not in (i, j] cyclically */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            c->table[i] = b;
            c->table[j] = -1;
            i = j;
        }
    }
}

/* ---- LRU of idle cached blocks ---- */

static void lru_unlink(g4_prefix_cache *c, int32_t b) {
    node *n = &c->nodes[b];
    if (n->prev >= 0) c->nodes[n->prev].next = n->next;
    else c->lru_head = n->next;
    if (n->next >= 0) c->nodes[n->next].prev = n->prev;
    else c->lru_tail = n->prev;
    n->prev = n->next = -1;
    c->n_idle--;
}

static void lru_push_newest(g4_prefix_cache *c, int32_t b) {
    node *n = &c->nodes[b];
    n->prev = c->lru_tail;
    n->next = -1;
    if (c->lru_tail >= 0) c->nodes[c->lru_tail].next = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_idle++;
}

/* ---- snapshots ---- */

static void snapshot_drop(g4_prefix_cache *c, int idx) {
    snapshot *sn = &c->snaps[idx];
    g4_kv_pool *p = c->pool;
    const int32_t *blocks = c->snap_pool + (size_t)idx * c->snap_blocks;
    for (int i = sn->n - 1; i >= 0; i--) p->free_sliding[p->n_free_sliding++] = blocks[i];
    c->nodes[sn->owner].snapshot = -1;
    sn->owner = -1;
    c->n_snaps--;
}

/* Drops the least recently used snapshot other than `keep`; 0 when none. */
static int snapshot_evict_one(g4_prefix_cache *c, int keep) {
    int oldest = -1;
    for (int i = 0; i < c->max_snaps; i++)
        if (c->snaps[i].owner >= 0 && i != keep &&
            (oldest < 0 || c->snaps[i].last_use < c->snaps[oldest].last_use))
            oldest = i;
    if (oldest < 0) return 0;
    snapshot_drop(c, oldest);
    c->stats.snapshots_evicted++;
    return 1;
}

/* Copies blocks between the sliding pools of every sliding layer with storage. */
static void copy_sliding(g4_prefix_cache *c, const int32_t *src, const int32_t *dst, int n) {
    const g4_text_config *tc = &c->model->config.text;
    g4_backend *be = c->pool->be;
    for (int i = 0; i < tc->n_layers; i++)
        if (c->pool->layer_kv[i] && tc->layers[i].kind == G4_LAYER_SLIDING)
            be->ops->kv_copy_blocks(be, c->pool->layer_kv[i], src, dst, n);
}

/* ---- admission and release ---- */

g4_prefix_match g4_prefix_lookup(g4_prefix_cache *c, const g4_block_hash *hashes, int n) {
    g4_prefix_match mt = {0, 0};
    if (n > c->match_cap) {
        int32_t *grown = realloc(c->match, (size_t)n * sizeof *grown);
        if (!grown) return mt;
        c->match = grown;
        c->match_cap = n;
    }
    while (mt.matched < n) {
        int32_t b = table_find(c, &hashes[mt.matched]);
        if (b < 0) break;
        c->match[mt.matched++] = b;
    }
    for (int d = mt.matched; d > 0; d--)
        if (!c->snap_blocks || c->nodes[c->match[d - 1]].snapshot >= 0) {
            mt.resume = d;
            break;
        }
    return mt;
}

static int resume_snapshot(const g4_prefix_cache *c, const g4_prefix_match *mt) {
    return mt->resume > 0 && c->snap_blocks ? c->nodes[c->match[mt->resume - 1]].snapshot : -1;
}

int g4_prefix_can_admit(const g4_prefix_cache *c, const g4_prefix_match *mt, int total_blocks) {
    const g4_kv_pool *p = c->pool;
    int idle_taken = 0;
    for (int j = 0; j < mt->resume; j++) idle_taken += c->nodes[c->match[j]].refs == 0;
    int fresh = total_blocks - mt->resume;
    if (fresh > p->n_free_full + c->n_idle - idle_taken) return 0;
    int keep = resume_snapshot(c, mt);
    int sliding_room = p->n_free_sliding + (c->n_snaps - (keep >= 0)) * c->snap_blocks;
    return p->ring_blocks <= sliding_room;
}

/* A block for a sequence: a free one, else the oldest idle cached one. */
static int32_t take_full_block(g4_prefix_cache *c) {
    g4_kv_pool *p = c->pool;
    if (p->n_free_full > 0) return p->free_full[--p->n_free_full];
    int32_t b = c->lru_head;
    if (b < 0) return -1;
    node *n = &c->nodes[b];
    lru_unlink(c, b);
    table_remove(c, b);
    if (n->snapshot >= 0) {
        snapshot_drop(c, n->snapshot);
        c->stats.snapshots_evicted++;
    }
    n->cached = 0;
    c->n_cached--;
    c->stats.blocks_evicted++;
    return b;
}

g4_status g4_prefix_admit(g4_prefix_cache *c, const g4_prefix_match *mt, int total_blocks, g4_kv_seq *s) {
    g4_kv_pool *p = c->pool;
    memset(s, 0, sizeof *s);
    if (!g4_prefix_can_admit(c, mt, total_blocks))
        return g4_fail(G4_ERR_LIMIT, "KV cache full: %d blocks do not fit", total_blocks);
    s->ring = malloc((size_t)p->ring_blocks * sizeof *s->ring);
    g4_status st = s->ring ? g4_kv_seq_grow_table(s, total_blocks) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != G4_OK) {
        free(s->ring);
        free(s->full_blocks);
        memset(s, 0, sizeof *s);
        return st;
    }
    /* borrow the prefix first, so that making room below never evicts it */
    for (int j = 0; j < mt->resume; j++) {
        int32_t b = c->match[j];
        if (c->nodes[b].refs++ == 0) lru_unlink(c, b);
        s->full_blocks[s->n_full++] = b;
    }
    c->n_held += mt->resume;
    const int keep = resume_snapshot(c, mt);
    while (s->n_full < total_blocks) {
        int32_t b = take_full_block(c); /* can_admit counted the room */
        s->full_blocks[s->n_full++] = b;
        c->n_held++;
    }
    while (p->n_free_sliding < p->ring_blocks && snapshot_evict_one(c, keep)) {}
    for (int i = 0; i < p->ring_blocks; i++) s->ring[i] = p->free_sliding[--p->n_free_sliding];
    if (keep >= 0) {
        snapshot *sn = &c->snaps[keep];
        const int32_t *blocks = c->snap_pool + (size_t)keep * c->snap_blocks;
        for (int i = 0; i < sn->n; i++) {
            c->copy_src[i] = blocks[i];
            c->copy_dst[i] = s->ring[(sn->first + i) % p->ring_blocks];
        }
        copy_sliding(c, c->copy_src, c->copy_dst, sn->n);
        sn->last_use = ++c->clock;
    }
    s->length = mt->resume * p->block_size;
    return G4_OK;
}

void g4_prefix_register(g4_prefix_cache *c, const g4_kv_seq *s, const g4_block_hash *hashes, int from, int to) {
    for (int j = from; j < to && j < s->n_full; j++) {
        int32_t b = s->full_blocks[j];
        node *n = &c->nodes[b];
        if (n->cached || table_find(c, &hashes[j]) >= 0) continue;
        n->hash = hashes[j];
        n->cached = 1;
        n->refs = 1; /* the sequence holds it */
        n->snapshot = -1;
        table_insert(c, b);
        c->n_cached++;
    }
}

void g4_prefix_snapshot(g4_prefix_cache *c, const g4_kv_seq *s, int length, const g4_block_hash *hashes, int depth) {
    g4_kv_pool *p = c->pool;
    const int bs = p->block_size;
    if (!c->snap_blocks || depth <= 0 || depth * bs > length) return;
    int32_t owner = table_find(c, &hashes[depth - 1]);
    if (owner < 0) return;
    node *n = &c->nodes[owner];
    if (n->snapshot >= 0) {
        c->snaps[n->snapshot].last_use = ++c->clock;
        return;
    }
    const int first = depth - c->snap_blocks > 0 ? depth - c->snap_blocks : 0, count = depth - first;
    /* logical block l sits in ring slot l % R until block l + R overwrites it */
    const int last_written = (length - 1) / bs;
    if (first < last_written - p->ring_blocks + 1) return;
    int idx = -1;
    for (int i = 0; i < c->max_snaps && idx < 0; i++)
        if (c->snaps[i].owner < 0) idx = i;
    while ((idx < 0 || p->n_free_sliding < count) && snapshot_evict_one(c, -1))
        for (int i = 0; i < c->max_snaps && idx < 0; i++)
            if (c->snaps[i].owner < 0) idx = i;
    if (idx < 0 || p->n_free_sliding < count) return;
    int32_t *blocks = c->snap_pool + (size_t)idx * c->snap_blocks;
    for (int i = 0; i < count; i++) {
        blocks[i] = p->free_sliding[--p->n_free_sliding];
        c->copy_src[i] = s->ring[(first + i) % p->ring_blocks];
        c->copy_dst[i] = blocks[i];
    }
    copy_sliding(c, c->copy_src, c->copy_dst, count);
    c->snaps[idx] = (snapshot){.owner = owner, .first = first, .n = count, .last_use = ++c->clock};
    n->snapshot = idx;
    c->n_snaps++;
    c->stats.snapshots_taken++;
}

void g4_prefix_release(g4_prefix_cache *c, g4_kv_seq *s) {
    g4_kv_pool *p = c->pool;
    /* deepest first: the LRU then gives up a chain's tail before its head,
     * and a prefix other requests share outlives the replies hanging off it */
    for (int j = s->n_full - 1; j >= 0; j--) {
        int32_t b = s->full_blocks[j];
        node *n = &c->nodes[b];
        if (n->cached) {
            if (--n->refs == 0) lru_push_newest(c, b);
        } else {
            p->free_full[p->n_free_full++] = b;
        }
    }
    c->n_held -= s->n_full;
    if (s->ring)
        for (int i = p->ring_blocks - 1; i >= 0; i--) p->free_sliding[p->n_free_sliding++] = s->ring[i];
    free(s->full_blocks);
    free(s->ring);
    memset(s, 0, sizeof *s);
}

int g4_prefix_blocks_held(const g4_prefix_cache *c) { return c->n_held; }

uint64_t g4_prefix_snapshot_bytes(const g4_prefix_cache *c) { return (uint64_t)c->snap_blocks * c->sliding_block_bytes; }

void g4_prefix_count(g4_prefix_cache *c, int reused_positions) {
    if (reused_positions > 0) c->stats.hits++, c->stats.tokens_reused += (uint64_t)reused_positions;
    else c->stats.misses++;
}

void g4_prefix_get_stats(const g4_prefix_cache *c, g4_prefix_stats *out) {
    *out = c->stats;
    out->cached_blocks = c->n_cached;
    out->idle_blocks = c->n_idle;
    out->snapshots = c->n_snaps;
    uint64_t snap_bytes = 0;
    for (int i = 0; i < c->max_snaps; i++)
        if (c->snaps[i].owner >= 0) snap_bytes += (uint64_t)c->snaps[i].n * c->sliding_block_bytes;
    out->cached_bytes = (uint64_t)c->n_cached * c->full_block_bytes + snap_bytes;
}
