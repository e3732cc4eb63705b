/* Grammar construction and the checks that make a grammar safe to run. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/grammar_internal.h"

typedef struct {
    char *name;
    g4_gseq *alts;
    int n_alts, cap_alts;
} builder_rule;

struct g4_gbuilder {
    builder_rule *rules;
    int n_rules, cap_rules;
    g4_byteset *classes;
    int n_classes, cap_classes;
    int32_t single[256]; /* class index of each one-byte class, -1: none yet */
    int n_elems;
    int failed;
    char error[512];
};

void g4_byteset_add_range(g4_byteset *s, int lo, int hi) {
    for (int b = lo; b <= hi; b++) g4_byteset_add(s, b);
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 1;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

void g4_gb_error(g4_gbuilder *b, const char *fmt, ...) {
    if (b->failed) return;
    b->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->error, sizeof b->error, fmt, ap);
    va_end(ap);
}

void g4_gb_error_context(g4_gbuilder *b, const char *fmt, ...) {
    if (!b->failed) return;
    char ctx[256], old[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", b->error);
    snprintf(b->error, sizeof b->error, "%.200s: %.300s", ctx, old);
}

int g4_gb_failed(const g4_gbuilder *b) { return b->failed; }
int g4_gb_n_rules(const g4_gbuilder *b) { return b->n_rules; }
int g4_gb_n_alts(const g4_gbuilder *b, int rule) { return rule >= 0 && rule < b->n_rules ? b->rules[rule].n_alts : 0; }
const char *g4_gb_rule_name(const g4_gbuilder *b, int rule) { return b->rules[rule].name; }

g4_gbuilder *g4_gbuilder_new(void) {
    g4_gbuilder *b = calloc(1, sizeof *b);
    if (b)
        for (int i = 0; i < 256; i++) b->single[i] = -1;
    return b;
}

void g4_gbuilder_free(g4_gbuilder *b) {
    if (!b) return;
    for (int r = 0; r < b->n_rules; r++) {
        for (int a = 0; a < b->rules[r].n_alts; a++) g4_gseq_free(&b->rules[r].alts[a]);
        free(b->rules[r].alts);
        free(b->rules[r].name);
    }
    free(b->rules);
    free(b->classes);
    free(b);
}

static int class_index(g4_gbuilder *b, const g4_byteset *set) {
    int n = 0, only = -1;
    for (int i = 0; i < 4; i++) n += __builtin_popcountll(set->w[i]);
    if (n == 1)
        for (int c = 0; c < 256; c++)
            if (g4_byteset_has(set, c)) only = c;
    if (only >= 0 && b->single[only] >= 0) return b->single[only];
    if (only < 0)
        for (int i = b->n_classes - 1, seen = 0; i >= 0 && seen < 64; i--, seen++)
            if (memcmp(&b->classes[i], set, sizeof *set) == 0) return i;
    if (!grow((void **)&b->classes, &b->cap_classes, b->n_classes + 1, sizeof *b->classes)) {
        g4_gb_error(b, "out of memory");
        return 0;
    }
    b->classes[b->n_classes] = *set;
    if (only >= 0) b->single[only] = b->n_classes;
    return b->n_classes++;
}

static void seq_push(g4_gseq *q, int32_t kind, int32_t arg) {
    if (q->failed) return;
    if (!grow((void **)&q->e, &q->cap, q->n + 1, sizeof *q->e)) {
        q->failed = 1;
        return;
    }
    q->e[q->n].kind = kind;
    q->e[q->n].arg = arg;
    q->n++;
}

void g4_gseq_class(g4_gseq *q, const g4_byteset *set, g4_gbuilder *b) {
    int empty = !(set->w[0] | set->w[1] | set->w[2] | set->w[3]);
    if (empty) {
        g4_gb_error(b, "an empty character class matches nothing");
        return;
    }
    seq_push(q, G4_GE_CLASS, class_index(b, set));
}

void g4_gseq_byte(g4_gseq *q, int byte, g4_gbuilder *b) {
    g4_byteset s = {{0}};
    g4_byteset_add(&s, byte & 255);
    g4_gseq_class(q, &s, b);
}

void g4_gseq_lit(g4_gseq *q, const char *bytes, size_t n, g4_gbuilder *b) {
    for (size_t i = 0; i < n; i++) g4_gseq_byte(q, (unsigned char)bytes[i], b);
}

void g4_gseq_str(g4_gseq *q, const char *s, g4_gbuilder *b) { g4_gseq_lit(q, s, strlen(s), b); }
void g4_gseq_rule(g4_gseq *q, int rule) { seq_push(q, G4_GE_RULE, rule); }
void g4_gseq_token(g4_gseq *q, int32_t token_id) { seq_push(q, G4_GE_TOKEN, token_id); }

void g4_gseq_free(g4_gseq *q) {
    free(q->e);
    memset(q, 0, sizeof *q);
}

int g4_gb_rule(g4_gbuilder *b, const char *name) {
    if (b->failed) return -1;
    if (b->n_rules >= G4_GRAMMAR_MAX_RULES) {
        g4_gb_error(b, "grammar too large: more than %d rules", G4_GRAMMAR_MAX_RULES);
        return -1;
    }
    if (!grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules)) {
        g4_gb_error(b, "out of memory");
        return -1;
    }
    builder_rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name = strdup(name ? name : "rule");
    return b->n_rules++;
}

void g4_gb_alt(g4_gbuilder *b, int rule, g4_gseq *q) {
    if (q->failed) g4_gb_error(b, "out of memory");
    if (b->failed || rule < 0 || rule >= b->n_rules) {
        g4_gseq_free(q);
        return;
    }
    b->n_elems += q->n + 1;
    if (b->n_elems > G4_GRAMMAR_MAX_ELEMS) {
        g4_gb_error(b, "grammar too large: more than %d elements", G4_GRAMMAR_MAX_ELEMS);
        g4_gseq_free(q);
        return;
    }
    builder_rule *r = &b->rules[rule];
    if (!grow((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof *r->alts)) {
        g4_gb_error(b, "out of memory");
        g4_gseq_free(q);
        return;
    }
    r->alts[r->n_alts++] = *q;
    memset(q, 0, sizeof *q);
}

int g4_gb_seq_rule(g4_gbuilder *b, const char *name, g4_gseq *q) {
    int r = g4_gb_rule(b, name);
    if (r < 0) {
        g4_gseq_free(q);
        return -1;
    }
    g4_gb_alt(b, r, q);
    return b->failed ? -1 : r;
}

/* X* as R ::= X R | "" (right recursion: the tail call keeps the stack flat). */
int g4_gb_star(g4_gbuilder *b, int x) {
    if (x < 0) return -1;
    int r = g4_gb_rule(b, "star");
    if (r < 0) return -1;
    g4_gseq q = {0};
    g4_gseq_rule(&q, x);
    g4_gseq_rule(&q, r);
    g4_gb_alt(b, r, &q);
    g4_gb_alt(b, r, &q);
    return b->failed ? -1 : r;
}

int g4_gb_plus(g4_gbuilder *b, int x) {
    int s = g4_gb_star(b, x);
    if (s < 0) return -1;
    g4_gseq q = {0};
    g4_gseq_rule(&q, x);
    g4_gseq_rule(&q, s);
    return g4_gb_seq_rule(b, "plus", &q);
}

int g4_gb_opt(g4_gbuilder *b, int x) {
    if (x < 0) return -1;
    int r = g4_gb_rule(b, "opt");
    if (r < 0) return -1;
    g4_gseq q = {0};
    g4_gseq_rule(&q, x);
    g4_gb_alt(b, r, &q);
    g4_gb_alt(b, r, &q);
    return b->failed ? -1 : r;
}

/* X{min,max}: min copies of X, then either X* (max < 0) or a chain of
 * max - min nested optionals (X (X (X)?)?)? so that the choice is made one
 * element at a time and no alternative is ambiguous. */
int g4_gb_repeat(g4_gbuilder *b, int x, int min, int max) {
    if (x < 0) return -1;
    if (min < 0 || (max >= 0 && max < min)) {
        g4_gb_error(b, "bad repetition {%d,%d}", min, max);
        return -1;
    }
    if (min > G4_GRAMMAR_MAX_REPEAT || max > G4_GRAMMAR_MAX_REPEAT) {
        g4_gb_error(b, "repetition count above %d", G4_GRAMMAR_MAX_REPEAT);
        return -1;
    }
    int tail;
    if (max < 0) tail = g4_gb_star(b, x);
    else {
        tail = g4_gb_rule(b, "empty");
        g4_gseq q = {0};
        g4_gb_alt(b, tail, &q);
        for (int i = 0; i < max - min && !b->failed; i++) {
            int r = g4_gb_rule(b, "upto");
            g4_gseq_rule(&q, x);
            g4_gseq_rule(&q, tail);
            g4_gb_alt(b, r, &q);
            g4_gb_alt(b, r, &q);
            tail = r;
        }
    }
    if (tail < 0 || b->failed) return -1;
    g4_gseq q = {0};
    for (int i = 0; i < min; i++) g4_gseq_rule(&q, x);
    g4_gseq_rule(&q, tail);
    return g4_gb_seq_rule(b, "repeat", &q);
}

/* ---- finishing: flatten and check ---- */

static g4_status check(const g4_grammar *g, const char *root_name) {
    const int R = g->n_rules;
    g4_status st = G4_OK;
    char *nullable = calloc((size_t)R, 1), *productive = calloc((size_t)R, 1);
    int *color = calloc((size_t)R, sizeof(int));
    int *stack = malloc((size_t)R * 2 * sizeof(int) + 16);
    if (!nullable || !productive || !color || !stack) {
        st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (int r = 0; r < R; r++)
        if (g->rule_alt[r] == g->rule_alt[r + 1]) {
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "grammar: rule '%s' has no alternatives (undefined?)",
                         g->rule_names[r]);
            goto done;
        }
    /* nullable and productive rules: fixpoints */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < R; r++)
            for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                int all_null = 1, all_prod = 1;
                for (int i = g->alt_start[a]; g->elems[i].kind != G4_GE_END; i++) {
                    const g4_gelem *e = &g->elems[i];
                    if (e->kind == G4_GE_RULE) {
                        all_null &= nullable[e->arg];
                        all_prod &= productive[e->arg];
                    } else all_null = 0;
                }
                if (all_null && !nullable[r]) nullable[r] = 1, changed = 1;
                if (all_prod && !productive[r]) productive[r] = 1, changed = 1;
            }
    }
    for (int r = 0; r < R; r++)
        if (!productive[r]) {
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "grammar: rule '%s' can never finish (infinite recursion)",
                         g->rule_names[r]);
            goto done;
        }
    /* left recursion: a cycle through rules reachable at the start of an
     * alternative (after nullable rules only); iterative DFS */
    for (int r0 = 0; r0 < R; r0++) {
        if (color[r0]) continue;
        int sp = 0;
        stack[sp++] = r0, stack[sp++] = g->rule_alt[r0] * 0; /* (rule, edge cursor) */
        color[r0] = 1;
        /* edge cursor: enumerate left-reachable references of the rule in order */
        while (sp) {
            int r = stack[sp - 2], cur = stack[sp - 1], k = 0, next = -1;
            for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1] && next < 0; a++)
                for (int i = g->alt_start[a]; g->elems[i].kind == G4_GE_RULE; i++) {
                    if (k++ == cur) {
                        next = g->elems[i].arg;
                        break;
                    }
                    if (!nullable[g->elems[i].arg]) break;
                }
            if (next < 0) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            stack[sp - 1] = cur + 1;
            if (color[next] == 1) {
                st = g4_fail(G4_ERR_INVALID_ARGUMENT,
                             "grammar: rule '%s' is left-recursive (through '%s'); write the recursion on the right",
                             g->rule_names[next], g->rule_names[r]);
                goto done;
            }
            if (color[next] == 0) {
                color[next] = 1;
                stack[sp++] = next, stack[sp++] = 0;
            }
        }
    }
    (void)root_name;
done:
    free(nullable);
    free(productive);
    free(color);
    free(stack);
    return st;
}

/* Fewest symbols each rule derives (productive rules only: finite), then
 * per element the fewest from it to the end of its alternative. */
#define DIST_INF 0x3fffffff
static g4_status min_lengths(g4_grammar *g) {
    int32_t *rmin = malloc((size_t)g->n_rules * sizeof *rmin);
    g->suffix_min = malloc((size_t)(g->n_elems + 1) * sizeof *g->suffix_min);
    if (!rmin || !g->suffix_min) {
        free(rmin);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int r = 0; r < g->n_rules; r++) rmin[r] = DIST_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++)
            for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                long sum = 0;
                for (int i = g->alt_start[a]; g->elems[i].kind != G4_GE_END && sum < DIST_INF; i++)
                    sum += g->elems[i].kind == G4_GE_RULE ? rmin[g->elems[i].arg] : 1;
                if (sum < rmin[r]) rmin[r] = (int32_t)sum, changed = 1;
            }
    }
    for (int a = 0; a < g->rule_alt[g->n_rules]; a++) {
        int end = g->alt_start[a];
        while (g->elems[end].kind != G4_GE_END) end++;
        long sum = 0;
        g->suffix_min[end] = 0;
        for (int i = end - 1; i >= g->alt_start[a]; i--) {
            sum += g->elems[i].kind == G4_GE_RULE ? rmin[g->elems[i].arg] : 1;
            g->suffix_min[i] = sum < DIST_INF ? (int32_t)sum : DIST_INF;
        }
    }
    free(rmin);
    return G4_OK;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

g4_status g4_grammar_finish(g4_gbuilder *b, int root, g4_grammar **out) {
    *out = NULL;
    if (!b) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (b->failed) {
        g4_status st = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s", b->error);
        g4_gbuilder_free(b);
        return st;
    }
    if (root < 0 || root >= b->n_rules) {
        g4_gbuilder_free(b);
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "grammar: no root rule");
    }
    g4_grammar *g = calloc(1, sizeof *g);
    int n_alts = 0;
    for (int r = 0; r < b->n_rules; r++) n_alts += b->rules[r].n_alts;
    if (g) {
        g->n_rules = b->n_rules;
        g->n_elems = b->n_elems;
        g->elems = malloc((size_t)(b->n_elems + 1) * sizeof *g->elems);
        g->alt_start = malloc((size_t)(n_alts + 1) * sizeof *g->alt_start);
        g->rule_alt = malloc((size_t)(b->n_rules + 1) * sizeof *g->rule_alt);
        g->rule_names = calloc((size_t)b->n_rules, sizeof *g->rule_names);
        g->classes = malloc((size_t)(b->n_classes + 1) * sizeof *g->classes);
        g->tokens = malloc((size_t)(b->n_elems + 1) * sizeof *g->tokens);
    }
    if (!g || !g->elems || !g->alt_start || !g->rule_alt || !g->rule_names || !g->classes || !g->tokens) {
        g4_grammar_free(g);
        g4_gbuilder_free(b);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    static atomic_uint_fast64_t serials = 1;
    g->serial = atomic_fetch_add(&serials, 1);
    g->root = root;
    g->n_classes = b->n_classes;
    if (b->n_classes) memcpy(g->classes, b->classes, (size_t)b->n_classes * sizeof *g->classes);
    int ne = 0, na = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->rule_alt[r] = na;
        g->rule_names[r] = b->rules[r].name;
        b->rules[r].name = NULL;
        for (int a = 0; a < b->rules[r].n_alts; a++) {
            g->alt_start[na++] = ne;
            const g4_gseq *q = &b->rules[r].alts[a];
            for (int i = 0; i < q->n; i++) {
                g->elems[ne++] = q->e[i];
                if (q->e[i].kind == G4_GE_TOKEN) g->tokens[g->n_tokens++] = q->e[i].arg;
            }
            g->elems[ne].kind = G4_GE_END;
            g->elems[ne++].arg = 0;
        }
    }
    g->rule_alt[b->n_rules] = na;
    g->n_elems = ne;
    qsort(g->tokens, (size_t)g->n_tokens, sizeof *g->tokens, cmp_i32);
    int nt = 0;
    for (int i = 0; i < g->n_tokens; i++)
        if (nt == 0 || g->tokens[nt - 1] != g->tokens[i]) g->tokens[nt++] = g->tokens[i];
    g->n_tokens = nt;
    g4_gbuilder_free(b);
    for (int i = 0; i < ne; i++)
        if (g->elems[i].kind == G4_GE_RULE && (g->elems[i].arg < 0 || g->elems[i].arg >= g->n_rules)) {
            g4_grammar_free(g);
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "grammar: reference to a missing rule");
        }
    g4_status st = check(g, g->rule_names[root]);
    if (st == G4_OK) st = min_lengths(g);
    if (st != G4_OK) {
        g4_grammar_free(g);
        return st;
    }
    pthread_mutex_init(&g->lock, NULL);
    g->lock_ready = 1;
    g->refs = 1;
    g->start = G4_STATE_UNKNOWN;
    g->sentinel = -1;
    *out = g;
    return G4_OK;
}

int g4_grammar_n_tokens(const g4_grammar *g) { return g->n_tokens; }
const int32_t *g4_grammar_tokens(const g4_grammar *g) { return g->tokens; }

static void dump_class(char **p, size_t *left, const g4_byteset *s) {
    int n = 0;
    for (int c = 0; c < 256; c++) n += g4_byteset_has(s, c);
    int w;
    if (n == 1) {
        for (int c = 0; c < 256; c++)
            if (g4_byteset_has(s, c)) {
                w = c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? snprintf(*p, *left, "\"%c\" ", c)
                                                                     : snprintf(*p, *left, "[\\x%02X] ", c);
                if (w > 0 && (size_t)w < *left) *p += w, *left -= (size_t)w;
            }
        return;
    }
    w = snprintf(*p, *left, "[");
    if (w > 0 && (size_t)w < *left) *p += w, *left -= (size_t)w;
    for (int c = 0; c < 256; c++) {
        if (!g4_byteset_has(s, c)) continue;
        int e = c;
        while (e + 1 < 256 && g4_byteset_has(s, e + 1)) e++;
        w = e == c ? snprintf(*p, *left, "\\x%02X", c) : snprintf(*p, *left, "\\x%02X-\\x%02X", c, e);
        if (w > 0 && (size_t)w < *left) *p += w, *left -= (size_t)w;
        c = e;
    }
    w = snprintf(*p, *left, "] ");
    if (w > 0 && (size_t)w < *left) *p += w, *left -= (size_t)w;
}

char *g4_grammar_dump(const g4_grammar *g) {
    size_t cap = 1 << 20, left = cap;
    char *buf = malloc(cap), *p = buf;
    if (!buf) return NULL;
    *p = 0;
    for (int r = 0; r < g->n_rules && left > 256; r++) {
        int w = snprintf(p, left, "r%d_%s ::=", r, g->rule_names[r]);
        p += w, left -= (size_t)w;
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1] && left > 256; a++) {
            w = snprintf(p, left, a == g->rule_alt[r] ? " " : " | ");
            p += w, left -= (size_t)w;
            for (int i = g->alt_start[a]; g->elems[i].kind != G4_GE_END && left > 256; i++) {
                const g4_gelem *e = &g->elems[i];
                if (e->kind == G4_GE_CLASS) dump_class(&p, &left, &g->classes[e->arg]);
                else {
                    w = e->kind == G4_GE_RULE ? snprintf(p, left, "r%d ", e->arg) : snprintf(p, left, "<[%d]> ", e->arg);
                    p += w, left -= (size_t)w;
                }
            }
        }
        w = snprintf(p, left, "\n");
        p += w, left -= (size_t)w;
    }
    return buf;
}
