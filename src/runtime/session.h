/* A session: one sequence of a private engine (runtime/engine.h), driven
 * by its caller token by token: the CLI, speculative decoding, benchmarks
 * and tests. Batch building, chunking and token choice are the engine's;
 * this wrapper keeps one sequence and its KV cache between calls (a chat
 * keeps them between turns) and can roll it back (g4_kv_seq_truncate). */
#ifndef G4_RUNTIME_SESSION_H
#define G4_RUNTIME_SESSION_H

#include <stdint.h>

#include "model/kv_cache.h"
#include "model/model.h"
#include "model/text_decoder.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

typedef struct {
    int n_ctx;        /* maximum positions (0: min(max_position_embeddings, 4096)) */
    int chunk;        /* prefill chunk (0: 512) */
    int block_size;   /* KV block size (0: 16) */
    g4_vision_mask vision_mask;
    g4_kv_type kv_type; /* element type of the KV cache (AUTO: F32) */
} g4_session_options;

typedef struct g4_session {
    const g4_model *model;
    g4_session_options opt; /* with the defaults filled in */
    g4_engine *engine;      /* one sequence, no prefix cache, no thread */
    g4_kv_pool *kv;         /* the engine's */
    g4_text_scratch *scratch; /* the engine's */
    g4_kv_seq seq;
    int32_t *history; /* [history_cap]: the ids of positions 0..seq.length (g4_session_reuse) */
    int history_cap;
    g4_hidden_hook hook;
    void *hook_ctx;
} g4_session;

g4_status g4_session_create(const g4_model *m, const g4_session_options *opt, g4_session **out);
void g4_session_destroy(g4_session *s);
/* Forgets the sequence (the KV cache is reused). */
void g4_session_reset(g4_session *s);
int g4_session_length(const g4_session *s);

/* Forgets positions length.. of the sequence (the KV cache keeps the
 * rest). Fails, changing nothing, when length is past the sequence, cuts an
 * image in two, or the sliding layers' ring no longer holds the window
 * before it (0 always works). */
g4_status g4_session_truncate(g4_session *s, int length);

/* A new prompt ids[0..n) for the same conversation (a chat's next turn,
 * the whole conversation re-rendered): keeps the longest prefix of the
 * sequence that the prompt repeats and that can be resumed (at least one
 * id is left to evaluate, never inside an image, and the sliding layers'
 * ring still holds the window before it), forgets the rest, and returns
 * its length: evaluate ids[that..n) next. */
int g4_session_reuse(g4_session *s, const int32_t *ids, int n);

/* Appends ids[0..n) to the sequence, running them through the model.
 * logits: host buffer for the rows `mode` asks for (may be NULL for NONE). */
g4_status g4_session_eval(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, g4_logits_mode mode,
                          float *logits);

/* g4_session_eval that also returns the final-normed hidden states (host
 * [rows][hidden_size]) of the rows `mode` asks for (LAST or ALL): what an
 * MTP drafter takes from its target. */
g4_status g4_session_eval_hidden(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_logits_mode mode, float *logits, float *hidden);

/* Like g4_session_eval with G4_LOGITS_LAST, but of the last row only the
 * k (1..G4_TOP_LOGITS_MAX_K) largest logits (host cand_ids[k],
 * cand_values[k], ordered by value descending, equal values by ascending
 * id) and its log-sum-exp come back: the backend's top_logits op, so a
 * GPU decode step copies 8k + 8 bytes instead of the row. */
g4_status g4_session_eval_top(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, int k,
                              int32_t *cand_ids, float *cand_values, double *lse);

/* The full logits of the last row of the last eval (host [vocab]), also
 * after g4_session_eval_top. */
g4_status g4_session_last_logits(g4_session *s, float *logits);

/* Evaluates ids and chooses the next token with `sampler`
 * (g4_engine_eval_sample: the same token and random stream use as
 * g4_session_eval + g4_sampler_sample); `logits` host [vocab], its
 * contents then unspecified. Does not g4_sampler_accept the token. */
g4_status g4_session_eval_sample(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_sampler *sampler, float *logits, g4_sample *out);

/* The same under a constraint (m may be NULL): tokens outside the
 * matcher's mask are never chosen (tokens_left: the reply's budget, see
 * g4_token_matcher_set_budget). *none is set (and nothing sampled) when
 * the mask allows no token: the grammar is complete and no stop token may
 * follow. The caller still accepts the token into the matcher. */
g4_status g4_session_eval_sample_constrained(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                             g4_sampler *sampler, float *logits, g4_token_matcher *m,
                                             int tokens_left, g4_sample *out, int *none);

#endif
