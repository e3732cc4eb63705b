/* Grammars over tokens: which of the vocabulary's tokens may come next.
 *
 * The vocabulary's byte strings go into a trie stored in preorder (byte,
 * depth, end of subtree, tokens ending here); a mask is one pass over it
 * that follows the grammar's automaton and skips every subtree whose prefix
 * the grammar refuses. Masks are cached per automaton state (in the
 * grammar), so a state met again (inside a string, between array items)
 * costs a copy. Special tokens never match text: they are allowed only
 * where the grammar names them (<|"|>, <|tool_call>...) or where the
 * matcher's modes let them through (stop tokens once the grammar may end,
 * the thought channel's opening token). */
#ifndef G4_CONSTRAIN_TOKEN_MASK_H
#define G4_CONSTRAIN_TOKEN_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "constrain/grammar.h"
#include "text/tokenizer.h"

typedef struct g4_token_trie g4_token_trie;

/* Every non-special token's decoded bytes (byte-fallback tokens: their one
 * byte). Read-only once built: many matchers share one. */
g4_status g4_token_trie_build(const g4_tokenizer *tok, g4_token_trie **out);
/* The same from explicit byte strings (tests, tools); lens[i] == 0: a token
 * that never matches text. */
g4_status g4_token_trie_from_bytes(int vocab, const char *const *bytes, const size_t *lens, g4_token_trie **out);
void g4_token_trie_free(g4_token_trie *t);
int g4_token_trie_vocab(const g4_token_trie *t);
int g4_token_trie_nodes(const g4_token_trie *t);
const unsigned char *g4_token_trie_bytes(const g4_token_trie *t, int32_t id, size_t *n);

/* Words of a mask: bit (id & 31) of word id / 32. */
static inline size_t g4_mask_words(int vocab) { return ((size_t)vocab + 31) / 32; }
static inline int g4_mask_has(const uint32_t *m, int32_t id) { return (int)((m[id >> 5] >> (id & 31)) & 1); }

/* The allowed tokens in `state` (text tokens and the grammar's own special
 * tokens), into mask (g4_mask_words words). The grammar must be locked by
 * the caller when shared. */
g4_status g4_token_mask_compute(g4_grammar *g, const g4_token_trie *t, int32_t state, uint32_t *mask);

/* The same, keeping only tokens after which the text can be completed in at
 * most max_dist more symbols (not cached). */
g4_status g4_token_mask_within(g4_grammar *g, const g4_token_trie *t, int32_t state, int32_t max_dist,
                               uint32_t *mask);

typedef struct {
    const int32_t *stop_ids; /* allowed where the grammar may end (copied) */
    int n_stop;
    int lazy;                /* free text until `trigger`; the grammar starts with that token */
    int32_t trigger;
    int think;               /* reasoning on: a thought channel may come first, unconstrained */
    int32_t think_open, think_close; /* <|channel>, <channel|> */
    int starts_in_thought;   /* the prompt already opened the thought channel */
} g4_token_matcher_options;

typedef struct g4_token_matcher g4_token_matcher;

/* Takes a reference on the grammar. */
g4_status g4_token_matcher_create(g4_grammar *g, const g4_token_trie *t, const g4_token_matcher_options *o,
                                  g4_token_matcher **out);
void g4_token_matcher_free(g4_token_matcher *m);

/* The next token's mask (the matcher's own buffer of
 * g4_mask_words(g4_token_trie_vocab) words, valid until the next call).
 * Returns 1 with *mask set when the next token is constrained, 0 when any
 * token may come (thought channel, lazy mode before its trigger), -1 on
 * failure (limits: the message is recorded). */
int g4_token_matcher_mask(g4_token_matcher *m, const uint32_t **mask);
/* Advances by a generated token; G4_ERR_INVALID_ARGUMENT if the grammar
 * refuses it (the engine never samples such a token). */
g4_status g4_token_matcher_accept(g4_token_matcher *m, int32_t token);
/* Tokens the reply may still have, this one included (0: no limit known):
 * near the end the mask keeps only tokens that leave room to complete the
 * text, so that max_tokens cuts no reply short of its grammar. */
void g4_token_matcher_set_budget(g4_token_matcher *m, int tokens_left);
/* 1 when the next token is constrained (the mask will say which). */
int g4_token_matcher_constrained(const g4_token_matcher *m);
/* What the last mask (g4_token_matcher_mask returning 1) depends on: equal
 * keys, equal masks, across the matchers of one grammar too (one state's
 * mask serves every request in it), so a copy of a mask elsewhere (a
 * device) can be reused while its key matches. Masks with the matcher's own
 * stop tokens or thought opening added carry the matcher's serial. */
typedef struct {
    const void *trie;
    uint64_t grammar; /* the grammar's serial (unique in the process) */
    uint64_t owner;   /* 0: any matcher of the grammar; else the matcher's serial */
    int32_t state;
    int32_t max_dist; /* the budget cut (g4_token_mask_within), -1: none */
} g4_mask_key;
const g4_mask_key *g4_token_matcher_mask_key(const g4_token_matcher *m);
int g4_mask_key_equal(const g4_mask_key *a, const g4_mask_key *b);
/* Ids its masks cover (the trie's vocabulary). */
int g4_token_matcher_vocab(const g4_token_matcher *m);
/* 1 if the reply may end here (grammar accepting, or unconstrained). */
int g4_token_matcher_can_end(const g4_token_matcher *m);

/* Sets logits[0..vocab) of tokens outside the mask (of mask_vocab ids) to
 * -inf; returns how many tokens stay allowed. */
int g4_mask_apply(const uint32_t *mask, int mask_vocab, float *logits, int vocab);

#endif
