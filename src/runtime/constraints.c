#include "runtime/constraints.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_SIZE 8 /* compiled grammars kept; each may hold up to 64 MiB of masks (touched as used) */

typedef struct {
    g4_constraint_kind kind;
    g4_tool_mode mode;
    char *text;
    g4_grammar *g;
    uint64_t used;
} cached;

struct g4_constraints {
    const g4_tokenizer *tok;
    g4_token_trie *trie;
    g4_constraint_tokens tokens;
    int32_t think_open, think_close;
    pthread_mutex_t lock;
    cached cache[CACHE_SIZE];
    uint64_t clock;
};

g4_status g4_constraints_create(const g4_tokenizer *tok, g4_constraints **out) {
    *out = NULL;
    g4_constraints *c = calloc(1, sizeof *c);
    if (!c) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    c->tok = tok;
    c->tokens.str_delim = g4_tokenizer_token_id(tok, "<|\"|>");
    c->tokens.tool_call = g4_tokenizer_token_id(tok, "<|tool_call>");
    c->tokens.tool_call_end = g4_tokenizer_token_id(tok, "<tool_call|>");
    c->think_open = g4_tokenizer_token_id(tok, "<|channel>");
    c->think_close = g4_tokenizer_token_id(tok, "<channel|>");
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return G4_OK;
}

void g4_constraints_free(g4_constraints *c) {
    if (!c) return;
    for (int i = 0; i < CACHE_SIZE; i++) {
        free(c->cache[i].text);
        g4_grammar_free(c->cache[i].g);
    }
    g4_token_trie_free(c->trie);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* The spec's grammar with a reference for the caller; lock held. */
static g4_status find_or_compile(g4_constraints *c, const g4_constraint_spec *spec, g4_grammar **out) {
    const char *text = spec->text ? spec->text : "";
    c->clock++;
    for (int i = 0; i < CACHE_SIZE; i++) {
        cached *e = &c->cache[i];
        if (e->g && e->kind == spec->kind && e->mode == spec->tool_mode && !strcmp(e->text, text) &&
            !g4_grammar_overflowed(e->g)) {
            e->used = c->clock;
            *out = g4_grammar_ref(e->g);
            return G4_OK;
        }
    }
    g4_grammar *g;
    g4_status st = g4_constraint_compile(spec, &c->tokens, &g);
    if (st != G4_OK) return st;
    int victim = 0;
    for (int i = 1; i < CACHE_SIZE; i++)
        if (c->cache[i].used < c->cache[victim].used) victim = i;
    cached *e = &c->cache[victim];
    char *copy = strdup(text);
    if (copy) {
        free(e->text);
        g4_grammar_free(e->g);
        e->text = copy;
        e->kind = spec->kind;
        e->mode = spec->tool_mode;
        e->g = g4_grammar_ref(g);
        e->used = c->clock;
    }
    *out = g;
    return G4_OK;
}

g4_status g4_constraints_matcher(g4_constraints *c, const g4_constraint_spec *spec, const g4_constraint_use *use,
                                 g4_token_matcher **out) {
    *out = NULL;
    pthread_mutex_lock(&c->lock);
    g4_status st = G4_OK;
    if (!c->trie) st = g4_token_trie_build(c->tok, &c->trie);
    g4_grammar *g = NULL;
    if (st == G4_OK) st = find_or_compile(c, spec, &g);
    pthread_mutex_unlock(&c->lock);
    if (st != G4_OK) return st;
    g4_token_matcher_options o = {0};
    if (use) {
        o.stop_ids = use->stop_ids;
        o.n_stop = use->n_stop;
        o.think = use->thinking && c->think_open >= 0 && c->think_close >= 0;
        o.starts_in_thought = use->starts_in_thought && o.think;
    }
    o.think_open = c->think_open;
    o.think_close = c->think_close;
    if (spec->kind == G4_CONSTRAINT_TOOL_CALLS && spec->tool_mode == G4_TOOLS_LAZY) {
        o.lazy = 1;
        o.trigger = c->tokens.tool_call;
    }
    st = g4_token_matcher_create(g, c->trie, &o, out);
    g4_grammar_free(g);
    return st;
}
