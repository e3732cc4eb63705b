/* Automatic prefix reuse over the engine's KV pool (docs/ARCHITECTURE.md,
 * "Prefix cache").
 *
 * Full-attention layers: every full block of a sequence (block_size
 * positions, all computed) is named by a chain hash, SHA-256 over its
 * parent's hash, its token ids and the content hashes of the soft tokens
 * (image, audio) in it. Registered blocks are shared read-only by every
 * sequence whose prompt starts with the same chain; a block is registered
 * only once full and never written again, so sharing needs no copy-on-write.
 * Blocks no sequence holds stay cached in LRU order and are taken back when
 * a sequence needs room (the deepest block of a chain goes first).
 *
 * Sliding layers keep only a ring of the last positions, so a cached chain is
 * reusable only up to a block boundary where a snapshot of the sliding
 * window exists: a copy of the ring blocks holding the window's positions
 * [end - window, end), taken at the ends of prompts and replies and where a
 * prompt leaves a cached chain (the branch point of a shared system prompt).
 * Reuse therefore always resumes at a block boundary.
 *
 * With a host-RAM tier (g4_prefix_cache_set_host_ram), what the pool gives
 * back — evicted blocks and dropped snapshots — is copied to host memory
 * first (runtime/prefix_host.h), and a chain continues there: those blocks
 * are copied back into fresh pool blocks when a prompt reuses them.
 *
 * Not thread-safe: the engine thread alone calls it. */
#ifndef G4_RUNTIME_PREFIX_CACHE_H
#define G4_RUNTIME_PREFIX_CACHE_H

#include <stdint.h>

#include "model/kv_cache.h"
#include "runtime/block_index.h"
#include "model/model.h"


typedef struct {
    uint64_t hits, misses;     /* admitted requests that reused a prefix / did not */
    uint64_t tokens_reused;    /* prompt positions whose KV came from the cache */
    uint64_t blocks_evicted;   /* cached full blocks taken back for new sequences */
    uint64_t snapshots_taken, snapshots_evicted;
    int cached_blocks;         /* full blocks registered (held or idle) */
    int idle_blocks;           /* of them, held by no sequence (evictable) */
    int snapshots;             /* sliding-window snapshots kept */
    uint64_t cached_bytes;     /* KV bytes of the registered blocks and the snapshots */
    /* the host-RAM tier */
    uint64_t host_budget, host_bytes; /* bytes allowed, held */
    uint64_t host_blocks_saved, host_windows_saved;       /* copied out of the pool */
    uint64_t host_blocks_restored, host_windows_restored; /* copied back for a prompt */
    uint64_t host_evicted;     /* host entries dropped for room */
} g4_prefix_stats;

typedef struct g4_prefix_cache g4_prefix_cache;

/* What a lookup found for a prompt's chain of block hashes. */
typedef struct {
    int matched;   /* leading blocks known (in the pool, then in host RAM) */
    int resume;    /* leading blocks reusable: a snapshot ends there (0: none) */
    int on_device; /* of the matched, those registered in the pool; blocks
                    * [on_device, resume) are copied back from host RAM */
    int32_t host_window; /* host entry of the snapshot at resume, or -1 (the pool's) */
} g4_prefix_match;

/* Blocks of `window` positions a snapshot takes (0 when the model has no
 * sliding layer of its own: nothing to snapshot). */
int g4_prefix_snapshot_blocks(const g4_model *m, int block_size);

g4_status g4_prefix_cache_create(const g4_model *m, g4_kv_pool *pool, g4_prefix_cache **out);
void g4_prefix_cache_free(g4_prefix_cache *c);
/* Gives the cache a host-RAM tier of `bytes` (0: none, the default). */
g4_status g4_prefix_cache_set_host_ram(g4_prefix_cache *c, uint64_t bytes);

/* The content key of each soft token: SHA-256 over the bytes of the run of
 * consecutive soft-token rows it belongs to (an image, an audio clip), so a
 * block inside an image matches only when the whole image does. embeds is
 * host memory [n][dim]; rows increasing. */
void g4_prefix_media_keys(const int32_t *rows, const float *embeds, int n, int dim, g4_block_hash *keys);

/* Chain hashes of blocks [from, to) of ids (block b: positions b*bs ..),
 * hashes[from - 1] the parent (none for block 0); media rows/keys as above,
 * rows increasing. */
void g4_prefix_hash_blocks(const g4_prefix_cache *c, const int32_t *ids, const int32_t *media_rows,
                           const g4_block_hash *media_keys, int n_media, int from, int to, g4_block_hash *hashes);

/* The longest registered chain among hashes[0..n) and how much of it is
 * reusable. Valid until the cache next changes. */
g4_prefix_match g4_prefix_lookup(g4_prefix_cache *c, const g4_block_hash *hashes, int n);

/* Whether a sequence of `total_blocks` full blocks, reusing the match, fits
 * in the pool now, counting idle cached blocks and snapshots as room (never
 * the match's own). Without the cache the same sequence fits iff it fits in
 * the free blocks; cached blocks are a subset of what would be free, so
 * whatever fits without the cache fits with it. */
int g4_prefix_can_admit(const g4_prefix_cache *c, const g4_prefix_match *mt, int total_blocks);

/* Builds a sequence's KV from the match (g4_prefix_can_admit must have said
 * yes): blocks [0, resume) borrowed from the cache, fresh ones up to
 * total_blocks, a ring with the snapshot's window copied in. */
g4_status g4_prefix_admit(g4_prefix_cache *c, const g4_prefix_match *mt, int total_blocks, g4_kv_seq *s);

/* Registers s's blocks [from, to), computed, under hashes[from..to). A hash
 * already registered (another sequence computed the same prefix) leaves the
 * block private. */
void g4_prefix_register(g4_prefix_cache *c, const g4_kv_seq *s, const g4_block_hash *hashes, int from, int to);

/* Saves the sliding window that ends at block `depth` (hashes[depth - 1]
 * registered) from the ring of s, which has computed `length` positions;
 * nothing when the ring no longer holds it, the node has one already or no
 * room can be made. */
void g4_prefix_snapshot(g4_prefix_cache *c, const g4_kv_seq *s, int length, const g4_block_hash *hashes, int depth);

/* Returns s's blocks: registered ones to the cache (idle when no other
 * sequence holds them), the rest and the ring to the pool. */
void g4_prefix_release(g4_prefix_cache *c, g4_kv_seq *s);

/* KV bytes one window snapshot takes. */
uint64_t g4_prefix_snapshot_bytes(const g4_prefix_cache *c);
/* Full blocks that sequences hold (registered or not). */
int g4_prefix_blocks_held(const g4_prefix_cache *c);
void g4_prefix_get_stats(const g4_prefix_cache *c, g4_prefix_stats *out);
/* Counts an admission as a hit (reused > 0 positions) or a miss. */
void g4_prefix_count(g4_prefix_cache *c, int reused_positions);

#endif
