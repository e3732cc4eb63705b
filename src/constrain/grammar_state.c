/* The grammar's automaton: parse stacks interned into states, transitions
 * computed on first use (see grammar.h for why). */
#include <stdlib.h>
#include <string.h>

#include "constrain/grammar_internal.h"

#define ACCEPT_KEY ((int64_t)-1)
#define EXIT_KEY ((int64_t)-2) /* a local state's parse returned into the context it stands without */

static inline int64_t stack_key(int32_t pos, int32_t frame) {
    return pos < 0 ? ACCEPT_KEY : ((int64_t)pos << 32) | (uint32_t)frame;
}
static inline int32_t key_pos(int64_t k) { return k < 0 ? -1 : (int32_t)(k >> 32); }
static inline int32_t key_frame(int64_t k) { return (int32_t)(uint32_t)k; }

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

g4_grammar *g4_grammar_ref(g4_grammar *g) {
    pthread_mutex_lock(&g->lock);
    g->refs++;
    pthread_mutex_unlock(&g->lock);
    return g;
}

void g4_grammar_lock(g4_grammar *g) { pthread_mutex_lock(&g->lock); }
void g4_grammar_unlock(g4_grammar *g) { pthread_mutex_unlock(&g->lock); }

void g4_grammar_free(g4_grammar *g) {
    if (!g) return;
    if (g->lock_ready) {
        pthread_mutex_lock(&g->lock);
        int left = --g->refs;
        pthread_mutex_unlock(&g->lock);
        if (left > 0) return;
    }
    if (g->mask_cache_free) g->mask_cache_free(g->mask_cache);
    if (g->rule_names)
        for (int r = 0; r < g->n_rules; r++) free(g->rule_names[r]);
    free(g->rule_names);
    free(g->elems);
    free(g->classes);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->suffix_min);
    free(g->tokens);
    free(g->frames);
    free(g->frame_hash);
    free(g->stack_pool);
    for (int i = 0; i < g->n_states; i++) free(g->states[i].row);
    free(g->states);
    free(g->state_hash);
    free(g->scratch);
    if (g->lock_ready) pthread_mutex_destroy(&g->lock);
    free(g);
}

static int fail_limit(g4_grammar *g, const char *what, int limit) {
    if (!g->overflowed) g4_fail(G4_ERR_LIMIT, "grammar: more than %d %s (grammar too ambiguous or too deep)", limit, what);
    g->overflowed = 1;
    return -1;
}

/* ---- frames ---- */

static int rehash_frames(g4_grammar *g) {
    int cap = g->frame_hash_cap ? g->frame_hash_cap * 2 : 1024;
    int32_t *h = malloc((size_t)cap * sizeof *h);
    if (!h) return 0;
    memset(h, 0xff, (size_t)cap * sizeof *h);
    for (int i = 0; i < g->n_frames; i++) {
        uint64_t k = mix(((uint64_t)(uint32_t)g->frames[i].ret << 32) | (uint32_t)g->frames[i].parent);
        size_t j = k & (size_t)(cap - 1);
        while (h[j] >= 0) j = (j + 1) & (size_t)(cap - 1);
        h[j] = i;
    }
    free(g->frame_hash);
    g->frame_hash = h;
    g->frame_hash_cap = cap;
    return 1;
}

static int32_t intern_frame(g4_grammar *g, int32_t ret, int32_t parent) {
    if ((g->n_frames + 1) * 2 > g->frame_hash_cap && !rehash_frames(g)) return fail_limit(g, "frames", g->n_frames);
    uint64_t k = mix(((uint64_t)(uint32_t)ret << 32) | (uint32_t)parent);
    size_t mask = (size_t)g->frame_hash_cap - 1, j = k & mask;
    for (; g->frame_hash[j] >= 0; j = (j + 1) & mask) {
        const g4_gframe *f = &g->frames[g->frame_hash[j]];
        if (f->ret == ret && f->parent == parent) return g->frame_hash[j];
    }
    if (g->n_frames >= G4_GRAMMAR_MAX_FRAMES) return fail_limit(g, "parse frames", G4_GRAMMAR_MAX_FRAMES);
    if (g->n_frames == g->cap_frames) {
        int cap = g->cap_frames ? g->cap_frames * 2 : 1024;
        g4_gframe *f = realloc(g->frames, (size_t)cap * sizeof *f);
        if (!f) return fail_limit(g, "frames", g->n_frames);
        g->frames = f;
        g->cap_frames = cap;
    }
    g->frames[g->n_frames].ret = ret;
    g->frames[g->n_frames].parent = parent;
    {
        long d = ret < 0 ? 0 : (long)g->suffix_min[ret] + (parent >= 0 ? g->frames[parent].dist : 0);
        g->frames[g->n_frames].dist = d < 0x3fffffff ? (int32_t)d : 0x3fffffff;
    }
    g->frame_hash[j] = g->n_frames;
    return g->n_frames++;
}

/* ---- expansion: the stacks whose top is a terminal ---- */

static int push_scratch(g4_grammar *g, int64_t key) {
    if (g->n_scratch >= G4_GRAMMAR_MAX_STACKS * 8) return fail_limit(g, "parse stacks", G4_GRAMMAR_MAX_STACKS);
    if (g->n_scratch == g->cap_scratch) {
        int cap = g->cap_scratch ? g->cap_scratch * 2 : 256;
        int64_t *s = realloc(g->scratch, (size_t)cap * sizeof *s);
        if (!s) return fail_limit(g, "parse stacks", g->n_scratch);
        g->scratch = s;
        g->cap_scratch = cap;
    }
    g->scratch[g->n_scratch++] = key;
    return 0;
}

/* Left recursion is refused at compile time, so this terminates; the depth
 * guard is for chains of empty rules. */
static int expand(g4_grammar *g, int32_t pos, int32_t frame, int depth) {
    if (depth > 4096) return fail_limit(g, "nested empty rules", 4096);
    for (;;) {
        const g4_gelem *e = &g->elems[pos];
        if (e->kind == G4_GE_CLASS || e->kind == G4_GE_TOKEN) return push_scratch(g, stack_key(pos, frame));
        if (e->kind == G4_GE_END) {
            if (frame < 0) return push_scratch(g, ACCEPT_KEY);
            if (frame == g->sentinel) return push_scratch(g, EXIT_KEY);
            pos = g->frames[frame].ret;
            frame = g->frames[frame].parent;
            continue;
        }
        /* a rule: its alternatives return to pos + 1 (or, in tail position, where we would return) */
        int32_t child = frame;
        if (g->elems[pos + 1].kind != G4_GE_END) {
            child = intern_frame(g, pos + 1, frame);
            if (child < 0) return -1;
        }
        const int r = e->arg;
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            if (expand(g, g->alt_start[a], child, depth + 1) < 0) return -1;
        return 0;
    }
}

/* ---- states ---- */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t hash_stacks(const int64_t *s, int n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = mix(h ^ (uint64_t)s[i]);
    return h;
}

static int rehash_states(g4_grammar *g) {
    int cap = g->state_hash_cap ? g->state_hash_cap * 2 : 1024;
    int32_t *h = malloc((size_t)cap * sizeof *h);
    if (!h) return 0;
    memset(h, 0xff, (size_t)cap * sizeof *h);
    for (int i = 0; i < g->n_states; i++) {
        size_t j = hash_stacks(g->stack_pool + g->states[i].stacks, g->states[i].n_stacks) & (size_t)(cap - 1);
        while (h[j] >= 0) j = (j + 1) & (size_t)(cap - 1);
        h[j] = i;
    }
    free(g->state_hash);
    g->state_hash = h;
    g->state_hash_cap = cap;
    return 1;
}

/* Sorts and dedupes the scratch stacks and interns them as a state. */
static int32_t intern_scratch(g4_grammar *g) {
    if (g->n_scratch == 0) return G4_STATE_DEAD;
    qsort(g->scratch, (size_t)g->n_scratch, sizeof *g->scratch, cmp_i64);
    int n = 0;
    for (int i = 0; i < g->n_scratch; i++)
        if (n == 0 || g->scratch[n - 1] != g->scratch[i]) g->scratch[n++] = g->scratch[i];
    g->n_scratch = n;
    if (n > G4_GRAMMAR_MAX_STACKS) return fail_limit(g, "parse stacks in one state", G4_GRAMMAR_MAX_STACKS);
    if ((g->n_states + 1) * 2 > g->state_hash_cap && !rehash_states(g)) return fail_limit(g, "states", g->n_states);
    uint64_t h = hash_stacks(g->scratch, n);
    size_t mask = (size_t)g->state_hash_cap - 1, j = h & mask;
    for (; g->state_hash[j] >= 0; j = (j + 1) & mask) {
        const g4_gstate *s = &g->states[g->state_hash[j]];
        if (s->n_stacks == n && memcmp(g->stack_pool + s->stacks, g->scratch, (size_t)n * sizeof(int64_t)) == 0)
            return g->state_hash[j];
    }
    if (g->n_states >= G4_GRAMMAR_MAX_STATES) return fail_limit(g, "states", G4_GRAMMAR_MAX_STATES);
    if (g->n_states == g->cap_states) {
        int cap = g->cap_states ? g->cap_states * 2 : 256;
        g4_gstate *s = realloc(g->states, (size_t)cap * sizeof *s);
        if (!s) return fail_limit(g, "states", g->n_states);
        g->states = s;
        g->cap_states = cap;
    }
    if (g->n_pool + (size_t)n > g->cap_pool) {
        size_t cap = g->cap_pool ? g->cap_pool * 2 : 4096;
        while (cap < g->n_pool + (size_t)n) cap *= 2;
        int64_t *p = realloc(g->stack_pool, cap * sizeof *p);
        if (!p) return fail_limit(g, "states", g->n_states);
        g->stack_pool = p;
        g->cap_pool = cap;
    }
    memcpy(g->stack_pool + g->n_pool, g->scratch, (size_t)n * sizeof(int64_t));
    g4_gstate *s = &g->states[g->n_states];
    memset(s, 0, sizeof *s);
    s->stacks = (int32_t)g->n_pool;
    s->n_stacks = n;
    s->slot = -1;
    /* sorted: EXIT (-2) then ACCEPT (-1) come first */
    s->exits = g->scratch[0] == EXIT_KEY;
    s->accepts = g->scratch[0] == ACCEPT_KEY || (n > 1 && g->scratch[1] == ACCEPT_KEY);
    s->dist = 0x3fffffff;
    for (int i = 0; i < n; i++) {
        int64_t k = g->scratch[i];
        long d = k < 0 ? 0
                                 : (long)g->suffix_min[key_pos(k)] + (key_frame(k) >= 0 ? g->frames[key_frame(k)].dist : 0);
        if (d < s->dist) s->dist = (int32_t)d;
    }
    s->final = s->accepts && n == 1;
    g->n_pool += (size_t)n;
    g->state_hash[j] = g->n_states;
    return g->n_states++;
}

int32_t g4_grammar_start(g4_grammar *g) {
    if (g->start != G4_STATE_UNKNOWN) return g->start;
    g->n_scratch = 0;
    for (int a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        if (expand(g, g->alt_start[a], -1, 0) < 0) return G4_STATE_DEAD;
    g->start = intern_scratch(g);
    return g->start;
}

static int token_index(const g4_grammar *g, int32_t id) {
    int lo = 0, hi = g->n_tokens - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (g->tokens[mid] == id) return mid;
        if (g->tokens[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* The transition on symbol `sym` (a byte, or 256 + token index), computed. */
static int32_t compute(g4_grammar *g, int32_t state, int sym) {
    g->n_scratch = 0;
    const g4_gstate *s = &g->states[state];
    const int32_t off = s->stacks, n = s->n_stacks;
    for (int i = 0; i < n; i++) {
        int64_t k = g->stack_pool[off + i];
        if (k < 0) continue;
        int32_t pos = key_pos(k), frame = key_frame(k);
        const g4_gelem *e = &g->elems[pos];
        int match = sym < 256 ? e->kind == G4_GE_CLASS && g4_byteset_has(&g->classes[e->arg], sym)
                              : e->kind == G4_GE_TOKEN && token_index(g, e->arg) == sym - 256;
        if (match && expand(g, pos + 1, frame, 0) < 0) return G4_STATE_DEAD;
    }
    return intern_scratch(g);
}

static int32_t step_sym(g4_grammar *g, int32_t state, int sym) {
    if (state < 0) return G4_STATE_DEAD;
    g4_gstate *s = &g->states[state];
    if (s->row && s->row[sym] != G4_STATE_UNKNOWN) return s->row[sym];
    if (!s->row)
        for (int i = 0; i < s->n_inline; i++)
            if (s->in_sym_lo[i] == (sym & 255) && s->in_sym_hi[i] == (sym >> 8)) return s->in_to[i];
    int32_t to = compute(g, state, sym);
    if (to == G4_STATE_DEAD && g->overflowed) return G4_STATE_DEAD; /* not cached: the grammar is spent */
    s = &g->states[state]; /* compute may have moved the array */
    if (!s->row && s->n_inline < G4_STATE_INLINE) {
        s->in_sym_lo[s->n_inline] = (uint8_t)(sym & 255);
        s->in_sym_hi[s->n_inline] = (uint8_t)(sym >> 8);
        s->in_to[s->n_inline++] = to;
        return to;
    }
    if (!s->row) {
        size_t width = 256 + (size_t)g->n_tokens;
        s->row = malloc(width * sizeof *s->row);
        if (!s->row) return to;
        for (size_t i = 0; i < width; i++) s->row[i] = G4_STATE_UNKNOWN;
        for (int i = 0; i < s->n_inline; i++) s->row[s->in_sym_lo[i] | (s->in_sym_hi[i] << 8)] = s->in_to[i];
    }
    s->row[sym] = to;
    return to;
}

int32_t g4_grammar_step(g4_grammar *g, int32_t state, int byte) { return step_sym(g, state, byte & 255); }

int32_t g4_grammar_step_token(g4_grammar *g, int32_t state, int32_t token_id) {
    int k = token_index(g, token_id);
    return k < 0 ? G4_STATE_DEAD : step_sym(g, state, 256 + k);
}

int32_t g4_grammar_run(g4_grammar *g, int32_t state, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n && state >= 0; i++) state = g4_grammar_step(g, state, p[i]);
    return state;
}

int g4_grammar_accepts(const g4_grammar *g, int32_t state) { return state >= 0 && g->states[state].accepts; }
int g4_grammar_is_final(const g4_grammar *g, int32_t state) { return state >= 0 && g->states[state].final; }
int g4_grammar_overflowed(const g4_grammar *g) { return g->overflowed; }
int32_t g4_grammar_dist(const g4_grammar *g, int32_t state) { return state >= 0 ? g->states[state].dist : 0x3fffffff; }
int g4_grammar_n_states(const g4_grammar *g) { return g->n_states; }
int32_t *g4_grammar_state_slot(g4_grammar *g, int32_t state) { return &g->states[state].slot; }

int32_t *g4_grammar_row(g4_grammar *g, int32_t state) {
    g4_gstate *s = &g->states[state];
    if (!s->row) {
        size_t width = 256 + (size_t)g->n_tokens;
        s->row = malloc(width * sizeof *s->row);
        if (!s->row) return NULL;
        for (size_t i = 0; i < width; i++) s->row[i] = G4_STATE_UNKNOWN;
        for (int i = 0; i < s->n_inline; i++) s->row[s->in_sym_lo[i] | (s->in_sym_hi[i] << 8)] = s->in_to[i];
    }
    return s->row;
}

void g4_grammar_next_bytes(const g4_grammar *g, int32_t state, g4_byteset *out) {
    memset(out, 0, sizeof *out);
    if (state < 0) return;
    const g4_gstate *s = &g->states[state];
    for (int i = 0; i < s->n_stacks; i++) {
        int64_t k = g->stack_pool[s->stacks + i];
        if (k < 0) continue;
        const g4_gelem *e = &g->elems[key_pos(k)];
        if (e->kind == G4_GE_CLASS)
            for (int w = 0; w < 4; w++) out->w[w] |= g->classes[e->arg].w[w];
    }
}

void **g4_grammar_mask_cache(g4_grammar *g, void (**free_fn)(void *)) {
    if (free_fn) *free_fn = NULL;
    return &g->mask_cache;
}

void g4_grammar_set_mask_cache_free(g4_grammar *g, void (*fn)(void *)) { g->mask_cache_free = fn; }

const int32_t *g4_grammar_row_if_any(const g4_grammar *g, int32_t state) { return g->states[state].row; }

int g4_grammar_exits(const g4_grammar *g, int32_t state) { return state >= 0 && g->states[state].exits; }

/* ---- local states ----
 * A state's stacks usually share a frame near their tops (the context the
 * current string, number or object was entered from). Cut there and
 * replaced by a sentinel, the state is the same for every context: its
 * token mask can be shared, and the parses that return into the context
 * (EXIT) are the only tokens left to check against the real state. */

#define LOCAL_SCAN 48 /* frames looked at for the common one */

int32_t g4_grammar_local(g4_grammar *g, int32_t state, int32_t *cut_dist) {
    if (state < 0) return -1;
    const g4_gstate *s = &g->states[state];
    const int n = s->n_stacks;
    const int64_t *stk = g->stack_pool + s->stacks;
    if (n == 0 || stk[0] < 0) return -1; /* an accepting or exiting state has no context below */
    /* candidate cut frames: the first stack's chain, shallowest first */
    int32_t chain[LOCAL_SCAN];
    int depth = 0;
    for (int32_t f = key_frame(stk[0]); f >= 0 && depth < LOCAL_SCAN; f = g->frames[f].parent) {
        if (f == g->sentinel) return -1;
        chain[depth++] = f;
    }
    int32_t cut = -1;
    for (int c = 0; c < depth && cut < 0; c++) {
        int all = 1;
        for (int i = 1; i < n && all; i++) {
            int found = 0, steps = 0;
            for (int32_t f = key_frame(stk[i]); f >= 0 && steps < LOCAL_SCAN && !found; f = g->frames[f].parent, steps++)
                found = f == chain[c];
            all = found;
        }
        if (all) cut = chain[c];
    }
    if (cut < 0) return -1;
    if (g->sentinel < 0) {
        /* ret -1 is no element: no real frame equals it, and expand stops at it */
        g->sentinel = intern_frame(g, -1, -1);
        if (g->sentinel < 0) return -1;
    }
    /* rebuild every stack above the cut on the sentinel */
    int64_t *keys = malloc((size_t)n * sizeof *keys);
    if (!keys) return -1;
    for (int i = 0; i < n; i++) {
        int32_t above[LOCAL_SCAN];
        int m = 0;
        for (int32_t f = key_frame(stk[i]); f != cut; f = g->frames[f].parent) above[m++] = f;
        int32_t nf = g->sentinel;
        for (int j = m - 1; j >= 0 && nf >= 0; j--) nf = intern_frame(g, g->frames[above[j]].ret, nf);
        if (nf < 0) {
            free(keys);
            return -1;
        }
        stk = g->stack_pool + g->states[state].stacks; /* (the pool does not move here, but be safe) */
        keys[i] = stack_key(key_pos(stk[i]), nf);
    }
    g->n_scratch = 0;
    for (int i = 0; i < n; i++)
        if (push_scratch(g, keys[i]) < 0) {
            free(keys);
            return -1;
        }
    free(keys);
    *cut_dist = g->frames[cut].dist;
    return intern_scratch(g);
}
