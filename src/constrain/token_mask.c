#include "constrain/token_mask.h"

#include "constrain/grammar_internal.h" /* the walk reads states' rows and distances inline */

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct g4_token_trie {
    int vocab;
    unsigned char *bytes; /* every token's bytes back to back */
    size_t *off;          /* vocab + 1 */
    int n_nodes, max_depth;
    unsigned char *node_byte;
    uint16_t *node_depth; /* 1-based */
    int32_t *node_skip;   /* first node after the subtree */
    int32_t *node_tok;    /* tokens ending at node i: tok_ids[node_tok[i] .. node_tok[i+1]) */
    int32_t *tok_ids;
};

int g4_token_trie_vocab(const g4_token_trie *t) { return t->vocab; }
int g4_token_trie_nodes(const g4_token_trie *t) { return t->n_nodes; }

const unsigned char *g4_token_trie_bytes(const g4_token_trie *t, int32_t id, size_t *n) {
    if (id < 0 || id >= t->vocab) {
        *n = 0;
        return NULL;
    }
    *n = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

void g4_token_trie_free(g4_token_trie *t) {
    if (!t) return;
    free(t->bytes);
    free(t->off);
    free(t->node_byte);
    free(t->node_depth);
    free(t->node_skip);
    free(t->node_tok);
    free(t->tok_ids);
    free(t);
}

static const g4_token_trie *sort_trie;

static int cmp_tokens(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t nx = sort_trie->off[x + 1] - sort_trie->off[x], ny = sort_trie->off[y + 1] - sort_trie->off[y];
    int c = memcmp(sort_trie->bytes + sort_trie->off[x], sort_trie->bytes + sort_trie->off[y], nx < ny ? nx : ny);
    if (c) return c;
    if (nx != ny) return nx < ny ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Builds the preorder trie from t->bytes / t->off. */
static g4_status build_nodes(g4_token_trie *t) {
    int V = t->vocab, n_tok = 0;
    int32_t *order = malloc((size_t)(V + 1) * sizeof *order);
    if (!order) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    size_t total = 0, max_len = 0;
    for (int i = 0; i < V; i++) {
        size_t n = t->off[i + 1] - t->off[i];
        if (n == 0) continue;
        order[n_tok++] = i;
        total += n;
        if (n > max_len) max_len = n;
    }
    if (max_len > 60000) {
        free(order);
        return g4_fail(G4_ERR_UNSUPPORTED, "token masks: a token of %zu bytes", max_len);
    }
    /* qsort has no context argument in C11; the build is single-threaded per call */
    static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&sort_lock);
    sort_trie = t;
    qsort(order, (size_t)n_tok, sizeof *order, cmp_tokens);
    sort_trie = NULL;
    pthread_mutex_unlock(&sort_lock);
    size_t cap = total + 1;
    t->node_byte = malloc(cap);
    t->node_depth = malloc(cap * sizeof *t->node_depth);
    t->node_skip = malloc(cap * sizeof *t->node_skip);
    t->node_tok = calloc(cap + 1, sizeof *t->node_tok);
    t->tok_ids = malloc((size_t)(n_tok + 1) * sizeof *t->tok_ids);
    int32_t *path = malloc((max_len + 1) * sizeof *path);
    int32_t *end_node = malloc((size_t)(n_tok + 1) * sizeof *end_node);
    if (!t->node_byte || !t->node_depth || !t->node_skip || !t->node_tok || !t->tok_ids || !path || !end_node) {
        free(order);
        free(path);
        free(end_node);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the token trie");
    }
    int n = 0, path_len = 0;
    const unsigned char *prev = NULL;
    size_t prev_len = 0;
    for (int k = 0; k < n_tok; k++) {
        int id = order[k];
        const unsigned char *s = t->bytes + t->off[id];
        size_t len = t->off[id + 1] - t->off[id], lcp = 0;
        while (prev && lcp < len && lcp < prev_len && s[lcp] == prev[lcp]) lcp++;
        /* close the nodes deeper than the common prefix */
        for (int d = path_len - 1; d >= (int)lcp; d--) t->node_skip[path[d]] = n;
        path_len = (int)lcp;
        for (size_t d = lcp; d < len; d++) {
            t->node_byte[n] = s[d];
            t->node_depth[n] = (uint16_t)(d + 1);
            path[path_len++] = n++;
        }
        end_node[k] = path[len - 1];
        prev = s;
        prev_len = len;
    }
    for (int d = path_len - 1; d >= 0; d--) t->node_skip[path[d]] = n;
    /* tokens by end node (nondecreasing in sorted order) */
    for (int k = 0; k < n_tok; k++) t->node_tok[end_node[k] + 1]++;
    for (int i = 0; i < n; i++) t->node_tok[i + 1] += t->node_tok[i];
    for (int k = 0; k < n_tok; k++) t->tok_ids[k] = order[k];
    t->n_nodes = n;
    t->max_depth = (int)max_len;
    free(order);
    free(path);
    free(end_node);
    return G4_OK;
}

g4_status g4_token_trie_from_bytes(int vocab, const char *const *bytes, const size_t *lens, g4_token_trie **out) {
    *out = NULL;
    g4_token_trie *t = calloc(1, sizeof *t);
    if (!t) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    t->vocab = vocab;
    size_t total = 0;
    for (int i = 0; i < vocab; i++) total += lens[i];
    t->bytes = malloc(total + 1);
    t->off = malloc((size_t)(vocab + 1) * sizeof *t->off);
    if (!t->bytes || !t->off) {
        g4_token_trie_free(t);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    size_t o = 0;
    for (int i = 0; i < vocab; i++) {
        t->off[i] = o;
        if (lens[i]) memcpy(t->bytes + o, bytes[i], lens[i]);
        o += lens[i];
    }
    t->off[vocab] = o;
    g4_status st = build_nodes(t);
    if (st != G4_OK) {
        g4_token_trie_free(t);
        return st;
    }
    *out = t;
    return G4_OK;
}

g4_status g4_token_trie_build(const g4_tokenizer *tok, g4_token_trie **out) {
    *out = NULL;
    int V = g4_tokenizer_vocab_size(tok);
    char **bytes = calloc((size_t)V, sizeof *bytes);
    size_t *lens = calloc((size_t)V, sizeof *lens);
    g4_status st = bytes && lens ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < V && st == G4_OK; i++) {
        if (!g4_tokenizer_token_text(tok, i) || g4_tokenizer_is_special(tok, i)) continue;
        int byte = g4_tokenizer_token_byte(tok, i);
        if (byte >= 0) {
            bytes[i] = malloc(1);
            if (!bytes[i]) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            else bytes[i][0] = (char)byte, lens[i] = 1;
            continue;
        }
        int32_t id = i;
        size_t n = 0;
        if (g4_tokenizer_decode(tok, &id, 1, 0, &bytes[i], &n) != G4_OK) {
            g4_error_clear();
            bytes[i] = NULL;
            n = 0;
        }
        lens[i] = n;
    }
    if (st == G4_OK) st = g4_token_trie_from_bytes(V, (const char *const *)bytes, lens, out);
    for (int i = 0; bytes && i < V; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    return st;
}

/* ---- masks ---- */

/* A token whose text changes how far the grammar is from an end. */
typedef struct {
    int32_t id, dist;
} tok_dist;

#define MAX_CHANGERS 16384 /* per state; beyond, budget masks walk the trie */

typedef struct {
    const g4_token_trie *trie;
    size_t words;
    int cap, next;
    uint32_t *data;   /* cap masks */
    int32_t *owner;   /* the state each slot holds, -1: free */
    tok_dist **chg;   /* per slot: allowed tokens after which the distance to an end differs from the state's */
    int *n_chg;       /* -1: more than MAX_CHANGERS */
    int32_t **exits;  /* per slot of a local state: trie nodes where it exits into the cut context */
    int *n_exits;
    int cap_exits_scratch;
    int32_t *states;  /* walk scratch: one state per depth */
    const int32_t **rows; /* and its transition row */
    tok_dist *scratch; /* MAX_CHANGERS */
} mask_cache;

static void mask_cache_free(void *p) {
    mask_cache *c = p;
    if (!c) return;
    for (int i = 0; c->chg && i < c->cap; i++) free(c->chg[i]);
    for (int i = 0; c->exits && i < c->cap; i++) free(c->exits[i]);
    free(c->exits);
    free(c->n_exits);
    free(c->chg);
    free(c->n_chg);
    free(c->data);
    free(c->owner);
    free(c->states);
    free(c->rows);
    free(c->scratch);
    free(c);
}

#define MASK_CACHE_BYTES (64u << 20) /* per grammar: 2048 masks of the 262,144-token vocabulary */

static mask_cache *get_cache(g4_grammar *g, const g4_token_trie *t) {
    void **slot = g4_grammar_mask_cache(g, NULL);
    mask_cache *c = *slot;
    if (c && c->trie == t) return c;
    if (c) { /* another vocabulary: start over (states keep stale slots, so forget them all) */
        for (int i = 0; i < c->cap; i++)
            if (c->owner[i] >= 0) *g4_grammar_state_slot(g, c->owner[i]) = -1;
        mask_cache_free(c);
        *slot = NULL;
    }
    c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->trie = t;
    c->words = g4_mask_words(t->vocab);
    c->cap = (int)(MASK_CACHE_BYTES / (c->words * 4));
    if (c->cap < 4) c->cap = 4;
    if (c->cap > 4096) c->cap = 4096;
    c->data = malloc((size_t)c->cap * c->words * 4);
    c->owner = malloc((size_t)c->cap * sizeof *c->owner);
    c->chg = calloc((size_t)c->cap, sizeof *c->chg);
    c->n_chg = calloc((size_t)c->cap, sizeof *c->n_chg);
    c->exits = calloc((size_t)c->cap, sizeof *c->exits);
    c->n_exits = calloc((size_t)c->cap, sizeof *c->n_exits);
    c->states = malloc((size_t)(t->max_depth + 2) * sizeof *c->states);
    c->rows = malloc((size_t)(t->max_depth + 2) * sizeof *c->rows);
    c->scratch = malloc(MAX_CHANGERS * sizeof *c->scratch);
    if (!c->data || !c->owner || !c->chg || !c->n_chg || !c->exits || !c->n_exits || !c->states || !c->rows ||
        !c->scratch) {
        mask_cache_free(c);
        return NULL;
    }
    for (int i = 0; i < c->cap; i++) c->owner[i] = -1;
    *slot = c;
    g4_grammar_set_mask_cache_free(g, mask_cache_free);
    return c;
}

static void note_change(mask_cache *c, int *n, int32_t id, int32_t dist) {
    if (*n < 0) return;
    if (*n == MAX_CHANGERS) {
        *n = -1;
        return;
    }
    c->scratch[*n].id = id;
    c->scratch[(*n)++].dist = dist;
}

/* One pass over trie nodes [begin, end) in preorder from base_state at
 * base_depth: allowed tokens into mask, and into c->scratch (from *n_chg on)
 * those that leave the text at another distance from an end than d0. In a
 * local state a node whose state exits into the cut context ends the walk
 * of its subtree: the node goes to *exits (the real state checks it). */
static g4_status walk_nodes(g4_grammar *g, const g4_token_trie *t, mask_cache *c, int32_t base_state, int begin,
                            int end, int base_depth, int32_t d0, uint32_t *mask, int *n_chg, int32_t **exits,
                            int *n_exits, int *cap_exits) {
    int32_t *states = c->states;
    const int32_t **rows = c->rows;
    states[base_depth] = base_state;
    rows[base_depth] = g->states[base_state].row;
    const unsigned char *nb = t->node_byte;
    const uint16_t *nd = t->node_depth;
    const int32_t *skip = t->node_skip, *nt = t->node_tok, *ids = t->tok_ids;
    for (int i = begin; i < end;) {
        int d = nd[i];
        /* rows[d]: the transition row of states[d] where it has one (the hot
         * states do: a row is made once a state has more than a few exits) */
        const int32_t *row = rows[d - 1];
        int32_t to = row ? row[nb[i]] : G4_STATE_UNKNOWN;
        if (to == G4_STATE_UNKNOWN) {
            to = g4_grammar_step(g, states[d - 1], nb[i]);
            rows[d - 1] = g->states[states[d - 1]].row;
        }
        if (to < 0) {
            if (g4_grammar_overflowed(g)) return G4_ERR_LIMIT;
            i = skip[i];
            continue;
        }
        states[d] = to;
        const g4_gstate *ts = &g->states[to];
        rows[d] = ts->row;
        if (nt[i] != nt[i + 1]) {
            int32_t dist = ts->dist;
            for (int k = nt[i]; k < nt[i + 1]; k++) {
                mask[ids[k] >> 5] |= 1u << (ids[k] & 31);
                if (dist != d0) note_change(c, n_chg, ids[k], dist);
            }
        }
        if (exits && ts->exits && skip[i] > i + 1) {
            if (*n_exits == *cap_exits) {
                int cap = *cap_exits ? *cap_exits * 2 : 64;
                int32_t *e = realloc(*exits, (size_t)cap * sizeof *e);
                if (!e) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for token masks");
                *exits = e;
                *cap_exits = cap;
            }
            (*exits)[(*n_exits)++] = i;
            i = skip[i];
            continue;
        }
        i++;
    }
    return g4_grammar_overflowed(g) ? G4_ERR_LIMIT : G4_OK;
}

static void special_tokens(g4_grammar *g, const g4_token_trie *t, mask_cache *c, int32_t state, int32_t d0,
                           uint32_t *mask, int *n_chg) {
    const int32_t *tok = g4_grammar_tokens(g);
    for (int k = 0; k < g4_grammar_n_tokens(g); k++) {
        if (tok[k] < 0 || tok[k] >= t->vocab) continue;
        int32_t to = g4_grammar_step_token(g, state, tok[k]);
        if (to < 0) continue;
        mask[tok[k] >> 5] |= 1u << (tok[k] & 31);
        if (g4_grammar_dist(g, to) != d0) note_change(c, n_chg, tok[k], g4_grammar_dist(g, to));
    }
}

/* A slot to fill, never `keep`; the old owner forgets it. */
static int take_slot(g4_grammar *g, mask_cache *c, int keep) {
    if (c->next == keep) c->next = (c->next + 1) % c->cap;
    int k = c->next;
    c->next = (c->next + 1) % c->cap;
    if (c->owner[k] >= 0) *g4_grammar_state_slot(g, c->owner[k]) = -1;
    c->owner[k] = -1;
    free(c->chg[k]);
    c->chg[k] = NULL;
    free(c->exits[k]);
    c->exits[k] = NULL;
    c->n_exits[k] = 0;
    return k;
}

static void finish_slot(g4_grammar *g, mask_cache *c, int k, int32_t state, int n_chg) {
    c->n_chg[k] = n_chg;
    if (n_chg > 0) {
        c->chg[k] = malloc((size_t)n_chg * sizeof *c->chg[k]);
        if (c->chg[k]) memcpy(c->chg[k], c->scratch, (size_t)n_chg * sizeof *c->chg[k]);
        else c->n_chg[k] = -1;
    }
    c->owner[k] = state;
    *g4_grammar_state_slot(g, state) = k;
}

/* The state's cache slot, computing its mask first if needed; -1 on failure.
 * A state with a local form is assembled from the local state's mask (shared
 * by every context) plus exact walks of the subtrees where it exits. */
static int cached_slot(g4_grammar *g, const g4_token_trie *t, mask_cache *c, int32_t state, g4_status *st) {
    int32_t *slot = g4_grammar_state_slot(g, state);
    if (*slot >= 0 && c->owner[*slot] == state) return *slot;
    const int32_t d0 = g4_grammar_dist(g, state);
    int32_t cut_dist = 0;
    int32_t local = g4_grammar_local(g, state, &cut_dist);
    if (g4_grammar_overflowed(g)) {
        *st = G4_ERR_LIMIT;
        return -1;
    }
    int kl = local >= 0 && local != state ? cached_slot(g, t, c, local, st) : -1;
    if (local >= 0 && kl < 0 && *st != G4_OK) return -1;
    int k = take_slot(g, c, kl);
    uint32_t *mask = c->data + (size_t)k * c->words;
    int n_chg = 0;
    if (kl < 0) {
        memset(mask, 0, c->words * 4);
        *st = walk_nodes(g, t, c, state, 0, t->n_nodes, 0, d0, mask, &n_chg, &c->exits[k], &c->n_exits[k],
                         &c->cap_exits_scratch);
        c->cap_exits_scratch = 0; /* the list is the slot's now */
        if (*st == G4_OK) special_tokens(g, t, c, state, d0, mask, &n_chg);
    } else {
        memcpy(mask, c->data + (size_t)kl * c->words, c->words * 4);
        if (c->n_chg[kl] < 0) n_chg = -1;
        for (int i = 0; i < c->n_chg[kl]; i++) note_change(c, &n_chg, c->chg[kl][i].id, c->chg[kl][i].dist + cut_dist);
        const int32_t *ids = t->tok_ids;
        for (int e = 0; e < c->n_exits[kl] && *st == G4_OK; e++) {
            int node = c->exits[kl][e];
            int depth = t->node_depth[node];
            int32_t first = ids[t->node_tok[node + 1]]; /* a token of the subtree: its first bytes are the path */
            int32_t s = g4_grammar_run(g, state, t->bytes + t->off[first], (size_t)depth);
            if (s < 0) {
                if (g4_grammar_overflowed(g)) *st = G4_ERR_LIMIT;
                continue;
            }
            *st = walk_nodes(g, t, c, s, node + 1, t->node_skip[node], depth, d0, mask, &n_chg, NULL, NULL, NULL);
        }
    }
    if (*st != G4_OK) return -1;
    finish_slot(g, c, k, state, n_chg);
    return k;
}

g4_status g4_token_mask_compute(g4_grammar *g, const g4_token_trie *t, int32_t state, uint32_t *mask) {
    const size_t words = g4_mask_words(t->vocab);
    if (state < 0) {
        memset(mask, 0, words * 4);
        return G4_OK;
    }
    mask_cache *c = get_cache(g, t);
    if (!c) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for token masks");
    g4_status st = G4_OK;
    int k = cached_slot(g, t, c, state, &st);
    if (k < 0) return st;
    memcpy(mask, c->data + (size_t)k * words, words * 4);
    return G4_OK;
}

/* From the cached mask and its distance-changing tokens: a token is kept when
 * its distance after is within max_dist; tokens that keep the state's own
 * distance are all in or all out. Only states with too many such tokens
 * walk the trie again. */
g4_status g4_token_mask_within(g4_grammar *g, const g4_token_trie *t, int32_t state, int32_t max_dist,
                               uint32_t *mask) {
    const size_t words = g4_mask_words(t->vocab);
    mask_cache *c = get_cache(g, t);
    if (!c) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for token masks");
    g4_status st = G4_OK;
    int k = state >= 0 ? cached_slot(g, t, c, state, &st) : -1;
    if (k < 0) {
        memset(mask, 0, words * 4);
        return st;
    }
    const int32_t d0 = g4_grammar_dist(g, state);
    if (c->n_chg[k] >= 0) {
        const tok_dist *chg = c->chg[k];
        if (d0 <= max_dist) {
            memcpy(mask, c->data + (size_t)k * words, words * 4);
            for (int i = 0; i < c->n_chg[k]; i++)
                if (chg[i].dist > max_dist) mask[chg[i].id >> 5] &= ~(1u << (chg[i].id & 31));
        } else {
            memset(mask, 0, words * 4);
            for (int i = 0; i < c->n_chg[k]; i++)
                if (chg[i].dist <= max_dist) mask[chg[i].id >> 5] |= 1u << (chg[i].id & 31);
        }
        return G4_OK;
    }
    /* many tokens change the distance: filter the cached mask token by token */
    memcpy(mask, c->data + (size_t)k * words, words * 4);
    for (int id = 0; id < t->vocab; id++) {
        if (!g4_mask_has(mask, id)) continue;
        size_t n = t->off[id + 1] - t->off[id];
        int32_t to = n ? g4_grammar_run(g, state, t->bytes + t->off[id], n) : g4_grammar_step_token(g, state, id);
        if (to < 0 || g4_grammar_dist(g, to) > max_dist) mask[id >> 5] &= ~(1u << (id & 31));
    }
    return g4_grammar_overflowed(g) ? G4_ERR_LIMIT : G4_OK;
}

int g4_mask_apply(const uint32_t *mask, int mask_vocab, float *logits, int vocab) {
    int n = vocab < mask_vocab ? vocab : mask_vocab, kept = 0;
    for (int base = 0; base < n; base += 32) {
        uint32_t bits = mask[base >> 5];
        int len = base + 32 <= n ? 32 : n - base;
        if (len < 32) bits &= (1u << len) - 1;
        kept += __builtin_popcount(bits);
        if (bits == 0xffffffffu) continue;
        for (int i = 0; i < len; i++)
            if (!((bits >> i) & 1)) logits[base + i] = -INFINITY;
    }
    for (int i = n; i < vocab; i++) logits[i] = -INFINITY;
    return kept;
}

/* ---- matcher ---- */

enum { PH_ACTIVE = 0, PH_FREE, PH_THINK_MAYBE, PH_THINKING };

struct g4_token_matcher {
    g4_grammar *g;
    const g4_token_trie *t;
    g4_token_matcher_options o;
    int32_t *stops;
    uint32_t *mask;
    int phase;
    int budget; /* tokens left for the reply (0: unknown) */
    int32_t state;
    uint64_t serial;  /* unique in the process (g4_mask_key.owner) */
    g4_mask_key key;  /* of the last mask */
};

g4_status g4_token_matcher_create(g4_grammar *g, const g4_token_trie *t, const g4_token_matcher_options *o,
                                  g4_token_matcher **out) {
    *out = NULL;
    g4_token_matcher *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (o) m->o = *o;
    m->stops = malloc((size_t)(m->o.n_stop + 1) * sizeof *m->stops);
    m->mask = malloc(g4_mask_words(t->vocab) * sizeof *m->mask);
    if (!m->stops || !m->mask) {
        free(m->stops);
        free(m->mask);
        free(m);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (m->o.n_stop) memcpy(m->stops, m->o.stop_ids, (size_t)m->o.n_stop * sizeof *m->stops);
    m->o.stop_ids = m->stops;
    m->g = g4_grammar_ref(g);
    m->t = t;
    static atomic_uint_fast64_t serials = 1;
    m->serial = atomic_fetch_add(&serials, 1);
    g4_grammar_lock(g);
    m->state = g4_grammar_start(g);
    g4_grammar_unlock(g);
    if (m->state < 0) {
        g4_token_matcher_free(m);
        return g4_fail(G4_ERR_LIMIT, "grammar: the start state exceeds the limits");
    }
    m->phase = m->o.lazy ? PH_FREE : m->o.starts_in_thought ? PH_THINKING : m->o.think ? PH_THINK_MAYBE : PH_ACTIVE;
    *out = m;
    return G4_OK;
}

void g4_token_matcher_free(g4_token_matcher *m) {
    if (!m) return;
    g4_grammar_free(m->g);
    free(m->stops);
    free(m->mask);
    free(m);
}

static int in_sorted(const int32_t *v, int n, int32_t x) {
    for (int lo = 0, hi = n - 1; lo <= hi;) {
        int mid = (lo + hi) / 2;
        if (v[mid] == x) return 1;
        if (v[mid] < x) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

static void allow(uint32_t *mask, int vocab, int32_t id) {
    if (id >= 0 && id < vocab) mask[id >> 5] |= 1u << (id & 31);
}

int g4_token_matcher_mask(g4_token_matcher *m, const uint32_t **out) {
    uint32_t *mask = m->mask;
    *out = mask;
    if (m->phase == PH_FREE || m->phase == PH_THINKING) return 0;
    g4_grammar_lock(m->g);
    g4_status st = G4_OK;
    int budgeted = 0;
    /* Near the end of the budget only tokens after which the text can still
     * be completed in the tokens left (one byte a token at worst: byte
     * tokens exist) are allowed, so a reply cut by max_tokens still parses.
     * The margin starts this before a long token could overshoot. */
    const int32_t margin = 48;
    /* after this token: budget - 1 left, one of them kept for the stop token */
    const int32_t max_dist = m->budget - 1 - (m->o.n_stop > 0) > 0 ? m->budget - 1 - (m->o.n_stop > 0) : 0;
    if (m->budget > 0 && max_dist < g4_grammar_dist(m->g, m->state) + margin) {
        st = g4_token_mask_within(m->g, m->t, m->state, max_dist, mask);
        int any = 0;
        for (size_t w = 0; st == G4_OK && w < g4_mask_words(m->t->vocab) && !any; w++) any = mask[w] != 0;
        budgeted = any || st != G4_OK;
    }
    if (!budgeted) st = g4_token_mask_compute(m->g, m->t, m->state, mask);
    int accepts = g4_grammar_accepts(m->g, m->state);
    g4_grammar_unlock(m->g);
    if (st != G4_OK) return -1;
    if (accepts)
        for (int i = 0; i < m->o.n_stop; i++) allow(mask, m->t->vocab, m->stops[i]);
    if (m->phase == PH_THINK_MAYBE) allow(mask, m->t->vocab, m->o.think_open);
    /* the grammar's state (and budget cut) decide the mask, except where
     * this matcher's own stop tokens or thought opening were added */
    m->key = (g4_mask_key){.trie = m->t, .grammar = m->g->serial,
                           .owner = (accepts && m->o.n_stop) || m->phase == PH_THINK_MAYBE ? m->serial : 0,
                           .state = m->state, .max_dist = budgeted ? max_dist : -1};
    return 1;
}

g4_status g4_token_matcher_accept(g4_token_matcher *m, int32_t token) {
    if (m->phase == PH_THINKING) {
        if (token == m->o.think_close) m->phase = m->o.lazy ? PH_FREE : PH_ACTIVE;
        return G4_OK;
    }
    if (m->phase == PH_FREE) {
        if (m->o.lazy && token == m->o.trigger) {
            g4_grammar_lock(m->g);
            int32_t s = g4_grammar_step_token(m->g, g4_grammar_start(m->g), token);
            g4_grammar_unlock(m->g);
            if (s < 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "constraint: the grammar does not start with its trigger");
            m->state = s;
            m->phase = PH_ACTIVE;
        }
        return G4_OK;
    }
    if (m->phase == PH_THINK_MAYBE) {
        m->phase = PH_ACTIVE;
        if (token == m->o.think_open) {
            m->phase = PH_THINKING;
            return G4_OK;
        }
    }
    g4_grammar_lock(m->g);
    int accepts = g4_grammar_accepts(m->g, m->state);
    int32_t s = G4_STATE_DEAD;
    int is_stop = 0;
    for (int i = 0; i < m->o.n_stop; i++) is_stop |= m->stops[i] == token;
    if (is_stop && accepts) s = m->state;
    else if (in_sorted(g4_grammar_tokens(m->g), g4_grammar_n_tokens(m->g), token))
        s = g4_grammar_step_token(m->g, m->state, token);
    else {
        size_t n;
        const unsigned char *b = g4_token_trie_bytes(m->t, token, &n);
        if (n) s = g4_grammar_run(m->g, m->state, b, n);
    }
    int final = s >= 0 && g4_grammar_is_final(m->g, s);
    int overflow = g4_grammar_overflowed(m->g);
    g4_grammar_unlock(m->g);
    if (s < 0)
        return overflow ? G4_ERR_LIMIT : g4_fail(G4_ERR_INVALID_ARGUMENT, "constraint: token %d is not allowed here", token);
    m->state = s;
    if (m->o.lazy && final) {
        m->phase = PH_FREE;
        g4_grammar_lock(m->g);
        m->state = g4_grammar_start(m->g);
        g4_grammar_unlock(m->g);
    }
    return G4_OK;
}

void g4_token_matcher_set_budget(g4_token_matcher *m, int tokens_left) { m->budget = tokens_left; }

const g4_mask_key *g4_token_matcher_mask_key(const g4_token_matcher *m) { return &m->key; }

int g4_mask_key_equal(const g4_mask_key *a, const g4_mask_key *b) {
    return a->trie == b->trie && a->grammar == b->grammar && a->owner == b->owner && a->state == b->state &&
           a->max_dist == b->max_dist;
}

int g4_token_matcher_vocab(const g4_token_matcher *m) { return m->t->vocab; }

int g4_token_matcher_constrained(const g4_token_matcher *m) { return m->phase != PH_FREE && m->phase != PH_THINKING; }

int g4_token_matcher_can_end(const g4_token_matcher *m) {
    if (m->phase == PH_FREE) return 1;
    if (m->phase == PH_THINKING) return 0;
    return g4_grammar_accepts(m->g, m->state);
}
