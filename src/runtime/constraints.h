/* Constraints against one tokenizer: the vocabulary trie (built on first
 * use: a third of a second for Gemma's 262,144 tokens), the special tokens
 * the grammars need, and a small cache of compiled grammars keyed by their
 * spec (8), so that requests repeating a schema share its automaton and token
 * masks. Thread-safe. */
#ifndef G4_RUNTIME_CONSTRAINTS_H
#define G4_RUNTIME_CONSTRAINTS_H

#include "constrain/constrain.h"
#include "constrain/token_mask.h"
#include "text/tokenizer.h"

typedef struct g4_constraints g4_constraints;

g4_status g4_constraints_create(const g4_tokenizer *tok, g4_constraints **out);
void g4_constraints_free(g4_constraints *c);

typedef struct {
    const int32_t *stop_ids; /* end-of-reply tokens (allowed where the grammar may end) */
    int n_stop;
    int thinking;            /* reasoning on: a thought channel may come first */
    int starts_in_thought;   /* the prompt opened it already */
} g4_constraint_use;

/* Compiles (or finds) the spec's grammar and makes a matcher for one
 * request. G4_ERR_INVALID_ARGUMENT with the compiler's message for a bad
 * schema / grammar. */
g4_status g4_constraints_matcher(g4_constraints *c, const g4_constraint_spec *spec, const g4_constraint_use *use,
                                 g4_token_matcher **out);

#endif
