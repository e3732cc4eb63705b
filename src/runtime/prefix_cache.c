#include "runtime/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "runtime/prefix_host.h"

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
    g4_block_index table;   /* hash -> pool block of the registered ones */
    g4_host_tier host;      /* blocks and snapshots given back, in host RAM (budget 0: none) */
    snapshot *snaps;
    int32_t *snap_pool;     /* [max_snaps][snap_blocks] sliding blocks */
    int max_snaps, n_snaps;
    uint64_t clock;
    uint64_t full_block_bytes, sliding_block_bytes;
    g4_prefix_stats stats;
    int32_t *match;         /* blocks of the last lookup's match (pool blocks, then host entries) */
    int match_cap;
    int32_t *host_match;    /* [match_cap] a lookup's host entries to pin */
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
    c->nodes = calloc((size_t)nb + 1, sizeof *c->nodes);
    c->max_snaps = c->snap_blocks ? pool->n_sliding_blocks / c->snap_blocks + 1 : 1;
    c->snaps = calloc((size_t)c->max_snaps, sizeof *c->snaps);
    c->snap_pool = malloc(((size_t)c->max_snaps * c->snap_blocks + 1) * sizeof *c->snap_pool);
    c->copy_src = malloc(((size_t)c->snap_blocks + 1) * sizeof *c->copy_src);
    c->copy_dst = malloc(((size_t)c->snap_blocks + 1) * sizeof *c->copy_dst);
    if (!c->nodes || g4_block_index_init(&c->table, nb) != G4_OK || !c->snaps || !c->snap_pool || !c->copy_src || !c->copy_dst) {
        g4_prefix_cache_free(c);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the prefix cache");
    }
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
    g4_block_index_free(&c->table);
    g4_host_tier_free(&c->host);
    free(c->host_match);
    free(c->snaps);
    free(c->snap_pool);
    free(c->match);
    free(c->copy_src);
    free(c->copy_dst);
    free(c);
}

g4_status g4_prefix_cache_set_host_ram(g4_prefix_cache *c, uint64_t bytes) {
    g4_host_tier_free(&c->host);
    if (!bytes) return G4_OK;
    return g4_host_tier_init(&c->host, bytes, c->full_block_bytes, c->sliding_block_bytes);
}

/* ---- copies between the pool and host memory ---- */

/* Host bytes of one block of layer i (the backend's kv_save_blocks layout). */
static size_t layer_block_bytes(const g4_prefix_cache *c, int i) {
    const g4_layer_config *lc = &c->model->config.text.layers[i];
    return (size_t)c->pool->block_size * lc->n_kv_heads * 2 * g4_kv_row_bytes(c->pool->type, lc->head_dim);
}

/* Blocks[0..n) of every layer of one kind with storage to host (layer
 * after layer, n blocks each), or back. */
static void blocks_host_copy(g4_prefix_cache *c, g4_layer_kind kind, const int32_t *blocks, int n, uint8_t *host,
                             int to_host) {
    const g4_text_config *tc = &c->model->config.text;
    g4_backend *be = c->pool->be;
    size_t off = 0;
    for (int i = 0; i < tc->n_layers; i++) {
        void *kv = c->pool->layer_kv[i];
        if (!kv || tc->layers[i].kind != kind) continue;
        if (to_host) be->ops->kv_save_blocks(be, kv, blocks, n, host + off);
        else be->ops->kv_load_blocks(be, kv, blocks, n, host + off);
        off += (size_t)n * layer_block_bytes(c, i);
    }
}

/* Pool block b (registered under n->hash) and its snapshot, if any, to the
 * host tier, before the pool takes them back. */
static void save_block_to_host(g4_prefix_cache *c, int32_t b);
static void save_window_to_host(g4_prefix_cache *c, int snap);

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
    save_window_to_host(c, oldest);
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

static void save_block_to_host(g4_prefix_cache *c, int32_t b) {
    uint8_t *dst = c->host.entries ? g4_host_tier_put_block(&c->host, &c->nodes[b].hash) : NULL;
    if (!dst) return;
    blocks_host_copy(c, G4_LAYER_FULL, &b, 1, dst, 1);
    c->stats.host_blocks_saved++;
}

static void save_window_to_host(g4_prefix_cache *c, int snap) {
    const snapshot *sn = &c->snaps[snap];
    uint8_t *dst = c->host.entries ? g4_host_tier_put_window(&c->host, &c->nodes[sn->owner].hash, sn->first, sn->n)
                                   : NULL;
    if (!dst) return;
    blocks_host_copy(c, G4_LAYER_SLIDING, c->snap_pool + (size_t)snap * c->snap_blocks, sn->n, dst, 1);
    c->stats.host_windows_saved++;
}

/* ---- admission and release ---- */

g4_prefix_match g4_prefix_lookup(g4_prefix_cache *c, const g4_block_hash *hashes, int n) {
    g4_prefix_match mt = {0, 0, 0, -1};
    if (n > c->match_cap) {
        int32_t *grown = realloc(c->match, (size_t)n * sizeof *grown);
        if (!grown) return mt;
        c->match = grown;
        int32_t *host_grown = realloc(c->host_match, (size_t)n * sizeof *host_grown);
        if (!host_grown) return mt;
        c->host_match = host_grown;
        c->match_cap = n;
    }
    while (mt.matched < n) {
        int32_t b = g4_block_index_find(&c->table, &hashes[mt.matched]);
        if (b < 0) break;
        c->match[mt.matched++] = b;
    }
    mt.on_device = mt.matched;
    /* the chain goes on in host RAM where the pool gave it back (the pool
     * gives a chain's tail back first, so what follows stays there too) */
    while (mt.matched < n) {
        int32_t e = g4_host_tier_find(&c->host, &hashes[mt.matched]);
        if (e < 0 || !c->host.entries[e].block) break;
        c->match[mt.matched++] = e;
    }
    for (int d = mt.matched; d > 0; d--) {
        if (!c->snap_blocks || (d <= mt.on_device && c->nodes[c->match[d - 1]].snapshot >= 0)) {
            mt.resume = d;
            break;
        }
        /* past the pool's chain the match holds the host entries already */
        int32_t e = d > mt.on_device ? c->match[d - 1] : g4_host_tier_find(&c->host, &hashes[d - 1]);
        if (e >= 0 && c->host.entries[e].window) {
            mt.resume = d;
            mt.host_window = e;
            break;
        }
    }
    return mt;
}

/* Leading blocks of the match borrowed from the pool. */
static int borrowed(const g4_prefix_match *mt) { return mt->resume < mt->on_device ? mt->resume : mt->on_device; }

static int resume_snapshot(const g4_prefix_cache *c, const g4_prefix_match *mt) {
    return mt->resume > 0 && c->snap_blocks && mt->host_window < 0 ? c->nodes[c->match[mt->resume - 1]].snapshot : -1;
}

int g4_prefix_can_admit(const g4_prefix_cache *c, const g4_prefix_match *mt, int total_blocks) {
    const g4_kv_pool *p = c->pool;
    int idle_taken = 0;
    for (int j = 0; j < borrowed(mt); j++) idle_taken += c->nodes[c->match[j]].refs == 0;
    int fresh = total_blocks - borrowed(mt);
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
    save_block_to_host(c, b);
    g4_block_index_remove(&c->table, &n->hash);
    if (n->snapshot >= 0) {
        save_window_to_host(c, n->snapshot);
        snapshot_drop(c, n->snapshot);
        c->stats.snapshots_evicted++;
    }
    n->cached = 0;
    c->n_cached--;
    c->stats.blocks_evicted++;
    return b;
}

/* Host entries an admission reads stay put while it makes room. */
static void pin_host(g4_prefix_cache *c, const g4_prefix_match *mt, int pinned) {
    for (int j = mt->on_device; j < mt->resume; j++) c->host.entries[c->match[j]].pinned = pinned;
    if (mt->host_window >= 0) c->host.entries[mt->host_window].pinned = pinned;
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
    for (int j = 0; j < borrowed(mt); j++) {
        int32_t b = c->match[j];
        if (c->nodes[b].refs++ == 0) lru_unlink(c, b);
        s->full_blocks[s->n_full++] = b;
    }
    c->n_held += borrowed(mt);
    for (int j = mt->on_device; j < mt->resume; j++) c->host_match[j] = c->match[j];
    pin_host(c, mt, 1);
    const int keep = resume_snapshot(c, mt);
    while (s->n_full < total_blocks) {
        int32_t b = take_full_block(c); /* can_admit counted the room */
        s->full_blocks[s->n_full++] = b;
        c->n_held++;
    }
    /* blocks from host RAM into the fresh ones, registered as the sequence's */
    for (int j = mt->on_device; j < mt->resume; j++) {
        const int32_t e = c->host_match[j], b = s->full_blocks[j];
        g4_host_entry *he = &c->host.entries[e];
        blocks_host_copy(c, G4_LAYER_FULL, &b, 1, he->block, 0);
        node *n = &c->nodes[b];
        *n = (node){.hash = he->hash, .cached = 1, .refs = 1, .prev = -1, .next = -1, .snapshot = -1};
        g4_block_index_insert(&c->table, &n->hash, b);
        c->n_cached++;
        c->stats.host_blocks_restored++;
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
    } else if (mt->host_window >= 0) {
        const g4_host_entry *he = &c->host.entries[mt->host_window];
        for (int i = 0; i < he->window_n; i++) c->copy_dst[i] = s->ring[(he->window_first + i) % p->ring_blocks];
        blocks_host_copy(c, G4_LAYER_SLIDING, c->copy_dst, he->window_n, he->window, 0);
        c->stats.host_windows_restored++;
    }
    pin_host(c, mt, 0);
    /* the restored blocks live in the pool now; their host copies go */
    for (int j = mt->on_device; j < mt->resume; j++) g4_host_tier_drop_block(&c->host, c->host_match[j]);
    s->length = mt->resume * p->block_size;
    return G4_OK;
}

void g4_prefix_register(g4_prefix_cache *c, const g4_kv_seq *s, const g4_block_hash *hashes, int from, int to) {
    for (int j = from; j < to && j < s->n_full; j++) {
        int32_t b = s->full_blocks[j];
        node *n = &c->nodes[b];
        if (n->cached || g4_block_index_find(&c->table, &hashes[j]) >= 0) continue;
        n->hash = hashes[j];
        n->cached = 1;
        n->refs = 1; /* the sequence holds it */
        n->snapshot = -1;
        g4_block_index_insert(&c->table, &n->hash, b);
        c->n_cached++;
    }
}

void g4_prefix_snapshot(g4_prefix_cache *c, const g4_kv_seq *s, int length, const g4_block_hash *hashes, int depth) {
    g4_kv_pool *p = c->pool;
    const int bs = p->block_size;
    if (!c->snap_blocks || depth <= 0 || depth * bs > length) return;
    int32_t owner = g4_block_index_find(&c->table, &hashes[depth - 1]);
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
    out->host_budget = c->host.budget;
    out->host_bytes = c->host.bytes;
    out->host_evicted = c->host.evicted;
}
