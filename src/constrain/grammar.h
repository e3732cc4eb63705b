/* Context-free grammars over bytes (and a few whole tokens), and the
 * incremental recogniser that constrained decoding runs.
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an
 * alternative is a sequence of elements, each a byte class (a 256-bit set),
 * a reference to a rule, or one whole token (a special token such as Gemma's
 * <|"|> string delimiter, which no run of text bytes may stand for). Every
 * front end (JSON Schema, GBNF, regex) lowers to this form through the
 * builder below; repetition becomes right-recursive helper rules.
 *
 * Recogniser: a pushdown automaton run on every path at once, as llama.cpp's
 * GBNF sampler does, rather than Earley. A state is the set of parse stacks
 * (the next byte class to match + the return positions beneath it); stacks
 * share their frames through a hash-consed table and a call in tail position
 * reuses its caller's frame, so loops such as a string's characters return
 * to the very same state. States are interned, which makes the automaton a
 * lazily built DFA: the transition of (state, byte) is computed once and then
 * is an array load, the property that makes walking the vocabulary trie
 * cheap. Earley would handle left recursion and ambiguity gracefully but its
 * item sets differ at every position (they carry origins), so nothing could
 * be cached; the price here is refusing left-recursive grammars (compile
 * error) and bounding the stacks a state may hold. */
#ifndef G4_CONSTRAIN_GRAMMAR_H
#define G4_CONSTRAIN_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    uint64_t w[4];
} g4_byteset;

static inline void g4_byteset_add(g4_byteset *s, int b) { s->w[b >> 6] |= 1ull << (b & 63); }
static inline int g4_byteset_has(const g4_byteset *s, int b) { return (int)((s->w[b >> 6] >> (b & 63)) & 1); }
void g4_byteset_add_range(g4_byteset *s, int lo, int hi);

enum { G4_GE_END = 0, G4_GE_CLASS = 1, G4_GE_RULE = 2, G4_GE_TOKEN = 3 };

typedef struct {
    int32_t kind; /* G4_GE_* */
    int32_t arg;  /* class index, rule index or token id */
} g4_gelem;

/* ---- building ---- */

typedef struct g4_gbuilder g4_gbuilder;

/* A growing sequence of elements: one alternative being assembled. */
typedef struct {
    g4_gelem *e;
    int n, cap;
    int failed;
} g4_gseq;

void g4_gseq_class(g4_gseq *q, const g4_byteset *set, g4_gbuilder *b);
void g4_gseq_byte(g4_gseq *q, int byte, g4_gbuilder *b);
void g4_gseq_lit(g4_gseq *q, const char *bytes, size_t n, g4_gbuilder *b);
void g4_gseq_str(g4_gseq *q, const char *s, g4_gbuilder *b); /* NUL-terminated literal */
void g4_gseq_rule(g4_gseq *q, int rule);
void g4_gseq_token(g4_gseq *q, int32_t token_id);
void g4_gseq_free(g4_gseq *q);

g4_gbuilder *g4_gbuilder_new(void);
void g4_gbuilder_free(g4_gbuilder *b);
/* A new rule with no alternatives yet; name is for error messages (copied). */
int g4_gb_rule(g4_gbuilder *b, const char *name);
/* Appends q as one alternative of `rule` and empties q. */
void g4_gb_alt(g4_gbuilder *b, int rule, g4_gseq *q);
/* Helper rules: X* ; X+ ; X? ; X{min,max} (max < 0: unbounded). Return the
 * new rule, or -1 on failure (then the builder has failed). */
int g4_gb_star(g4_gbuilder *b, int x);
int g4_gb_plus(g4_gbuilder *b, int x);
int g4_gb_opt(g4_gbuilder *b, int x);
int g4_gb_repeat(g4_gbuilder *b, int x, int min, int max);
/* A rule matching the single alternative q (q is emptied). */
int g4_gb_seq_rule(g4_gbuilder *b, const char *name, g4_gseq *q);
/* Records the first error (later ones are dropped); the builder has failed. */
void g4_gb_error(g4_gbuilder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the recorded error with context ("ctx: error"). */
void g4_gb_error_context(g4_gbuilder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int g4_gb_failed(const g4_gbuilder *b);
int g4_gb_n_rules(const g4_gbuilder *b);
int g4_gb_n_alts(const g4_gbuilder *b, int rule);
const char *g4_gb_rule_name(const g4_gbuilder *b, int rule);

/* Limits that keep compile time and state bounded. */
#define G4_GRAMMAR_MAX_RULES 20000
#define G4_GRAMMAR_MAX_ELEMS 400000
#define G4_GRAMMAR_MAX_REPEAT 1000  /* x{m,n} with n beyond: refused */
#define G4_GRAMMAR_MAX_STACKS 2048  /* parse stacks in one state */
#define G4_GRAMMAR_MAX_STATES 300000
#define G4_GRAMMAR_MAX_FRAMES 2000000

/* ---- the compiled grammar ---- */

typedef struct g4_grammar g4_grammar;

/* Checks the grammar (every rule has an alternative, every reference exists,
 * no left recursion, no rule that can never finish) and freezes it; `root`
 * is the start rule. The builder is freed in every case. Failure:
 * G4_ERR_INVALID_ARGUMENT with the builder's first error or the check's. */
g4_status g4_grammar_finish(g4_gbuilder *b, int root, g4_grammar **out);
/* Reference counting: a grammar may be shared by requests (the server's
 * cache); g4_grammar_free drops one reference. */
g4_grammar *g4_grammar_ref(g4_grammar *g);
void g4_grammar_free(g4_grammar *g);
/* The token-mask cache hangs here (token_mask.c). */
void **g4_grammar_mask_cache(g4_grammar *g, void (**free_fn)(void *));
void g4_grammar_set_mask_cache_free(g4_grammar *g, void (*fn)(void *));

/* Whole tokens the grammar refers to (sorted ids). */
int g4_grammar_n_tokens(const g4_grammar *g);
const int32_t *g4_grammar_tokens(const g4_grammar *g);

/* ---- states (the lazily built automaton; owned by the grammar) ----
 * Not thread-safe: hold g4_grammar_lock around these when a grammar is
 * shared by threads. */
#define G4_STATE_DEAD (-1)

void g4_grammar_lock(g4_grammar *g);
void g4_grammar_unlock(g4_grammar *g);

/* The start state, or G4_STATE_DEAD with the error recorded (limits). */
int32_t g4_grammar_start(g4_grammar *g);
/* The state after one byte (0..255), or DEAD when the byte is not allowed
 * (or a limit was hit: then g4_grammar_overflowed is set). */
int32_t g4_grammar_step(g4_grammar *g, int32_t state, int byte);
/* The state after a whole token the grammar refers to. */
int32_t g4_grammar_step_token(g4_grammar *g, int32_t state, int32_t token_id);
/* 1 if the text may end in this state. */
int g4_grammar_accepts(const g4_grammar *g, int32_t state);
/* 1 if nothing at all may follow (the state accepts and has no stacks left). */
int g4_grammar_is_final(const g4_grammar *g, int32_t state);
/* The bytes allowed next (no transition computed). */
void g4_grammar_next_bytes(const g4_grammar *g, int32_t state, g4_byteset *out);
/* The fewest symbols (bytes, or whole tokens the grammar names) that
 * complete the text from this state: 0 where it may end. */
int32_t g4_grammar_dist(const g4_grammar *g, int32_t state);
/* A state or frame limit was reached (the grammar cannot go on). */
int g4_grammar_overflowed(const g4_grammar *g);
int g4_grammar_n_states(const g4_grammar *g);

/* Per-state slot the token masks use for their cache (-1: none). */
int32_t *g4_grammar_state_slot(g4_grammar *g, int32_t state);

/* The transition row of a state for bytes (256 entries, -2 = not computed
 * yet): for the trie walk's inner loop. */
int32_t *g4_grammar_row(g4_grammar *g, int32_t state);
#define G4_STATE_UNKNOWN (-2)
/* The row if the state has one already (NULL: use g4_grammar_step). */
const int32_t *g4_grammar_row_if_any(const g4_grammar *g, int32_t state);

/* Runs bytes from `state`; DEAD if any is refused. */
int32_t g4_grammar_run(g4_grammar *g, int32_t state, const void *bytes, size_t n);

/* Local states (token masks share them across contexts): the state with its
 * stacks cut at their shallowest common frame, which a sentinel replaces
 * (*cut_dist: that frame's distance to an end), or -1 when the state has no
 * such frame. A local state's parses that return into the cut context end
 * in EXIT: g4_grammar_exits says a state holds one. */
int32_t g4_grammar_local(g4_grammar *g, int32_t state, int32_t *cut_dist);
int g4_grammar_exits(const g4_grammar *g, int32_t state);

/* Debug/tests: the grammar in GBNF-like text (heap string). */
char *g4_grammar_dump(const g4_grammar *g);

#endif
