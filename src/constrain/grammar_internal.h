/* The grammar's private layout, shared by grammar_build.c (construction and
 * checks) and grammar_state.c (the automaton). */
#ifndef G4_CONSTRAIN_GRAMMAR_INTERNAL_H
#define G4_CONSTRAIN_GRAMMAR_INTERNAL_H

#include <pthread.h>

#include "constrain/grammar.h"

typedef struct {
    int32_t ret;    /* element index to continue at */
    int32_t parent; /* frame beneath, -1: none */
    int32_t dist;   /* fewest symbols to finish from ret through every frame beneath */
} g4_gframe;

/* A few transitions kept inline; a full row once a state has more. */
#define G4_STATE_INLINE 6

typedef struct {
    int32_t stacks;  /* offset into stack_pool */
    int32_t n_stacks;
    int32_t *row;    /* 256 + n_tokens entries, or NULL */
    uint8_t n_inline, accepts, final, exits;
    uint8_t in_sym_hi[G4_STATE_INLINE]; /* sym >> 8 */
    uint8_t in_sym_lo[G4_STATE_INLINE];
    int32_t in_to[G4_STATE_INLINE];
    int32_t slot; /* token-mask cache slot */
    int32_t dist; /* fewest symbols (bytes or whole tokens) that complete the text */
} g4_gstate;

struct g4_grammar {
    g4_gelem *elems;
    int n_elems;
    g4_byteset *classes;
    int n_classes;
    int32_t *alt_start; /* element index of each alternative */
    int32_t *rule_alt;  /* rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r+1]) */
    int n_rules;
    int root;
    char **rule_names;
    int32_t *suffix_min; /* per element: fewest symbols from it to the end of its alternative */
    int32_t *tokens; /* distinct token ids, sorted */
    int n_tokens;

    /* the automaton */
    pthread_mutex_t lock;
    int lock_ready;
    g4_gframe *frames;
    int n_frames, cap_frames;
    int32_t *frame_hash; /* open addressing, -1 empty */
    int frame_hash_cap;
    int64_t *stack_pool;
    size_t n_pool, cap_pool;
    g4_gstate *states;
    int n_states, cap_states;
    int32_t *state_hash;
    int state_hash_cap;
    int32_t start;
    int overflowed;
    int32_t sentinel; /* the frame that stands for "the context below" in local states, -1: not made yet */
    /* token masks cached per state (token_mask.c) */
    void *mask_cache;
    void (*mask_cache_free)(void *);
    int refs;
    uint64_t serial; /* unique in the process: what keys of its states' masks name it by */
    /* scratch for one step */
    int64_t *scratch;
    int n_scratch, cap_scratch;
};

#endif
