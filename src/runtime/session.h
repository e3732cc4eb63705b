/* A session: one sequence's KV cache and the working memory to run it.
 * Prompts are prefilled in chunks; each later token is one decode step. */
#ifndef G4_RUNTIME_SESSION_H
#define G4_RUNTIME_SESSION_H

#include <stdint.h>

#include "model/kv_cache.h"
#include "model/model.h"
#include "model/text_decoder.h"
#include "runtime/sampler.h"

typedef enum {
    G4_LOGITS_NONE = 0,
    G4_LOGITS_LAST, /* logits of the last row only: [1][vocab] */
    G4_LOGITS_ALL,  /* logits of every row: [n][vocab] */
} g4_logits_mode;

/* How image tokens attend to each other on models with
 * use_bidirectional_attention = "vision" (SPEC §5 / unified A7). */
typedef enum {
    G4_VISION_MASK_DEFAULT = 0, /* the model family's rule (gemma4: sliding layers, windowed) */
    G4_VISION_MASK_CAUSAL,      /* plain causal, as models without the flag */
    G4_VISION_MASK_ALL_LAYERS,  /* image block bidirectional on every layer, not windowed */
} g4_vision_mask;

typedef struct {
    int n_ctx;        /* maximum positions (0: min(max_position_embeddings, 4096)) */
    int chunk;        /* prefill chunk (0: 512) */
    int block_size;   /* KV block size (0: 16) */
    g4_vision_mask vision_mask;
    g4_kv_type kv_type; /* element type of the KV cache (AUTO: F32) */
} g4_session_options;

/* Soft tokens to place into the prompt: rows are indices into the ids of one
 * g4_session_eval call; embeds is backend memory [n][hidden]. */
typedef struct {
    int n;
    const int32_t *rows;
    const float *embeds;
} g4_soft_tokens;

typedef struct g4_session {
    const g4_model *model;
    g4_session_options opt;
    g4_kv_pool *kv;
    g4_kv_seq seq;
    g4_text_scratch *scratch;
    int bidir_mode;   /* 0 none, 1 gemma4 rule, 2 all layers */
    g4_hidden_hook hook;
    void *hook_ctx;
} g4_session;

g4_status g4_session_create(const g4_model *m, const g4_session_options *opt, g4_session **out);
void g4_session_destroy(g4_session *s);
/* Forgets the sequence (the KV cache is reused). */
void g4_session_reset(g4_session *s);
int g4_session_length(const g4_session *s);

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

/* Evaluates ids and chooses the next token with `sampler`: from the row's
 * largest logits when the sampler allows it (g4_sampler_candidates_needed),
 * else, or when they cannot decide, from the full row copied into
 * `logits` (host [vocab]; its contents are then unspecified). The same
 * token and random stream use as g4_session_eval + g4_sampler_sample. Does
 * not g4_sampler_accept the token. */
g4_status g4_session_eval_sample(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_sampler *sampler, float *logits, g4_sample *out);

/* The same under a constraint: where the matcher masks the next token the
 * full row comes back, tokens outside the mask get -inf and the sampler
 * draws from the rest (tokens_left: the reply's budget, see
 * g4_token_matcher_set_budget). *none is set (and nothing sampled) when the
 * mask allows no token: the grammar is complete and no stop token may
 * follow. The caller still accepts the token into the matcher. */
struct g4_token_matcher;
g4_status g4_session_eval_sample_constrained(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                             g4_sampler *sampler, float *logits, struct g4_token_matcher *m,
                                             int tokens_left, g4_sample *out, int *none);

#endif
