#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

g4_status g4_session_create(const g4_model *m, const g4_session_options *opt, g4_session **out) {
    *out = NULL;
    const g4_text_config *tc = &m->config.text;
    g4_session *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->model = m;
    if (opt) s->opt = *opt;
    if (s->opt.n_ctx <= 0) s->opt.n_ctx = tc->max_position < 4096 ? tc->max_position : 4096;
    if (s->opt.n_ctx > tc->max_position) s->opt.n_ctx = tc->max_position;
    if (s->opt.chunk <= 0) s->opt.chunk = 512;
    if (s->opt.chunk > s->opt.n_ctx) s->opt.chunk = s->opt.n_ctx;
    if (s->opt.block_size <= 0) s->opt.block_size = 16;
    /* every row of a chunk may ask for logits (G4_LOGITS_ALL) */
    g4_engine_options eo = {.max_seqs = 1, .n_ctx = s->opt.n_ctx, .block_size = s->opt.block_size,
                            .max_batch_tokens = s->opt.chunk, .max_queue = 1, .vision_mask = s->opt.vision_mask,
                            .kv_type = s->opt.kv_type, .no_prefix_cache = 1, .logit_rows = s->opt.chunk};
    g4_status st = g4_engine_create(m, &eo, &s->engine);
    if (st == G4_OK) {
        s->kv = g4_engine_kv(s->engine);
        s->scratch = g4_engine_scratch(s->engine);
        st = g4_engine_seq_init(s->engine, &s->seq);
    }
    if (st != G4_OK) {
        g4_session_destroy(s);
        return st;
    }
    *out = s;
    return G4_OK;
}

void g4_session_destroy(g4_session *s) {
    if (!s) return;
    if (s->seq.ring) g4_engine_seq_release(s->engine, &s->seq);
    g4_engine_destroy(s->engine);
    free(s->history);
    free(s);
}

void g4_session_reset(g4_session *s) { g4_kv_seq_truncate(&s->seq, 0); }

int g4_session_length(const g4_session *s) { return s->seq.length; }

static int is_vision(const g4_model *m, int32_t id) {
    return id == m->config.tokens.image_id || id == m->config.tokens.video_id;
}

int g4_session_reuse(g4_session *s, const int32_t *ids, int n) {
    const int held = s->seq.length; /* history[0..held) is what the cache holds */
    int k = 0;
    while (k < held && k < n && s->history[k] == ids[k]) k++;
    if (k == n) k--; /* always evaluate at least one token to get logits */
    /* an image's tokens attend to each other: never resume inside one,
     * of the new prompt or of what the cache holds */
    while (k > 0 && is_vision(s->model, ids[k - 1]) &&
           ((k < n && is_vision(s->model, ids[k])) || (k < held && is_vision(s->model, s->history[k]))))
        k--;
    /* the sliding layers' ring must still hold the window before k */
    const int ring_positions = s->kv->ring_blocks * s->kv->block_size;
    if (k < held && k - s->model->config.text.sliding_window + 1 < held - ring_positions) k = 0;
    if (k < 0) k = 0;
    g4_kv_seq_truncate(&s->seq, k);
    return k;
}

g4_status g4_session_truncate(g4_session *s, int length) {
    const int held = s->seq.length;
    if (length < 0 || length > held)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "cannot truncate a sequence of %d positions to %d", held, length);
    if (length > 0 && length < held && is_vision(s->model, s->history[length - 1]) &&
        is_vision(s->model, s->history[length]))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "truncating to %d would cut an image in two", length);
    const int ring_positions = s->kv->ring_blocks * s->kv->block_size;
    if (length > 0 && length < held && length - s->model->config.text.sliding_window + 1 < held - ring_positions)
        return g4_fail(G4_ERR_UNSUPPORTED,
                       "truncating to %d: the sliding layers no longer hold the %d positions before it (only 0 works)",
                       length, s->model->config.text.sliding_window);
    g4_kv_seq_truncate(&s->seq, length);
    return G4_OK;
}

/* Room in the history for n more ids after the sequence. */
static g4_status history_room(g4_session *s, int n) {
    const int need = s->seq.length + n;
    if (n <= 0 || need <= s->history_cap) return G4_OK;
    int cap = need > 2 * s->history_cap ? need : 2 * s->history_cap;
    int32_t *grown = realloc(s->history, (size_t)cap * sizeof *grown);
    if (!grown) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->history = grown;
    s->history_cap = cap;
    return G4_OK;
}

/* The ids that ran from position `base` (every chunk before a failure). */
static void remember(g4_session *s, const int32_t *ids, int base) {
    if (s->seq.length > base) memcpy(s->history + base, ids, (size_t)(s->seq.length - base) * sizeof *ids);
}

static g4_status eval(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, g4_eval_output *o) {
    const int base = s->seq.length;
    g4_status st = history_room(s, n);
    o->hook = s->hook;
    o->hook_ctx = s->hook_ctx;
    if (st == G4_OK) st = g4_engine_eval(s->engine, &s->seq, ids, n, soft, o);
    remember(s, ids, base);
    return st;
}

g4_status g4_session_eval(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, g4_logits_mode mode,
                          float *logits) {
    g4_eval_output o = {.mode = mode, .logits = logits};
    return eval(s, ids, n, soft, &o);
}

g4_status g4_session_eval_hidden(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_logits_mode mode, float *logits, float *hidden) {
    if (mode == G4_LOGITS_NONE) return g4_fail(G4_ERR_INVALID_ARGUMENT, "hidden states come with logit rows");
    g4_eval_output o = {.mode = mode, .logits = logits, .hidden = hidden};
    return eval(s, ids, n, soft, &o);
}

g4_status g4_session_eval_top(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, int k,
                              int32_t *cand_ids, float *cand_values, double *lse) {
    if (k <= 0 || k > G4_TOP_LOGITS_MAX_K)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d candidates asked (1..%d)", k, G4_TOP_LOGITS_MAX_K);
    g4_eval_output o = {.mode = G4_LOGITS_LAST, .k = k, .cand_ids = cand_ids, .cand_values = cand_values, .lse = lse};
    return eval(s, ids, n, soft, &o);
}

g4_status g4_session_last_logits(g4_session *s, float *logits) { return g4_engine_last_logits(s->engine, logits); }

g4_status g4_session_eval_sample(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_sampler *sampler, float *logits, g4_sample *out) {
    int none;
    return g4_session_eval_sample_constrained(s, ids, n, soft, sampler, logits, NULL, 0, out, &none);
}

g4_status g4_session_eval_sample_constrained(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                             g4_sampler *sampler, float *logits, g4_token_matcher *m,
                                             int tokens_left, g4_sample *out, int *none) {
    if (s->hook) /* the engine's token choice takes no hook: the plain path keeps it */
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "a hidden-state hook works with g4_session_eval only");
    const int base = s->seq.length;
    g4_status st = history_room(s, n);
    if (st == G4_OK)
        st = g4_engine_eval_sample(s->engine, &s->seq, ids, n, soft, sampler, m, tokens_left, logits, out, none);
    remember(s, ids, base);
    return st;
}
