#include "runtime/speculative.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"

struct g4_speculative {
    g4_session *session;
    const g4_assistant *assistant;
    g4_drafter_scratch *scratch;
    int draft_max;
    int vocab, hidden_size;
    float *logits;   /* host [draft_max + 1][vocab]: the verified rows */
    float *hidden;   /* host [draft_max + 1][hidden]: their final-normed states */
    float *next_hidden; /* host [hidden]: the state that chose the pending token */
    int have_hidden;
    int forced_accept; /* >= 0: benchmarks keep exactly this many drafts a round */
    /* sampling: the sampler's kept tokens and probabilities of one row */
    int32_t *cand_ids; /* [vocab] */
    double *cand_probs; /* [vocab] */
    g4_speculative_stats stats;
};

g4_status g4_speculative_create(g4_session *s, const g4_assistant *a, int draft_max, g4_speculative **out) {
    *out = NULL;
    const g4_model *target = s->model;
    if (draft_max < 1 || draft_max > G4_DRAFT_MAX)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "draft length %d outside 1..%d", draft_max, G4_DRAFT_MAX);
    if (a->target_layer[0] < 0 || a->target_layer[1] < 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter %s is not attached to a target", a->model->path);
    if (a->model->backend != target->backend)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "the drafter and its target must run on one backend");
    if (s->opt.chunk < draft_max + 1)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "prefill chunk %d is shorter than a verification of %d drafts",
                       s->opt.chunk, draft_max);
    /* The ring must hold what the target's and the drafter's sliding layers
     * see plus the verified positions, so that a verification never
     * overwrites a slot still visible after it is rolled back. */
    const int wt = target->config.text.sliding_window, wa = a->model->config.text.sliding_window + 1;
    const int ring_positions = s->kv->ring_blocks * s->kv->block_size;
    const int need = (wt > wa ? wt : wa) + draft_max + 1;
    const int whole = s->kv->ring_blocks >= s->kv->n_full_blocks; /* the ring never wraps within the context */
    if (!whole && ring_positions < need)
        return g4_fail(G4_ERR_LIMIT, "the sliding ring holds %d positions; speculation with %d drafts needs %d",
                       ring_positions, draft_max, need);
    g4_speculative *sp = calloc(1, sizeof *sp);
    if (!sp) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    sp->session = s;
    sp->assistant = a;
    sp->draft_max = draft_max;
    sp->forced_accept = -1;
    sp->vocab = target->config.text.vocab_size;
    sp->hidden_size = target->config.text.hidden_size;
    sp->logits = malloc((size_t)(draft_max + 1) * sp->vocab * sizeof *sp->logits);
    sp->hidden = malloc((size_t)(draft_max + 1) * sp->hidden_size * sizeof *sp->hidden);
    sp->next_hidden = malloc((size_t)sp->hidden_size * sizeof *sp->next_hidden);
    sp->cand_ids = malloc((size_t)sp->vocab * sizeof *sp->cand_ids);
    sp->cand_probs = malloc((size_t)sp->vocab * sizeof *sp->cand_probs);
    g4_status st = sp->logits && sp->hidden && sp->next_hidden && sp->cand_ids && sp->cand_probs
                       ? G4_OK
                       : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK) st = g4_drafter_scratch_create(a, &sp->scratch);
    if (st != G4_OK) {
        g4_speculative_free(sp);
        return st;
    }
    *out = sp;
    return G4_OK;
}

void g4_speculative_free(g4_speculative *sp) {
    if (!sp) return;
    g4_drafter_scratch_free(sp->scratch);
    free(sp->logits);
    free(sp->hidden);
    free(sp->next_hidden);
    free(sp->cand_ids);
    free(sp->cand_probs);
    free(sp);
}

const g4_speculative_stats *g4_speculative_get_stats(const g4_speculative *sp) { return &sp->stats; }

void g4_speculative_force_acceptance(g4_speculative *sp, int n) { sp->forced_accept = n < 0 ? -1 : n; }

void g4_speculative_reset_stats(g4_speculative *sp) { memset(&sp->stats, 0, sizeof sp->stats); }

/* The shared rule (runtime/draft_rule.h) with this loop's scratch. */
static g4_status keep_draft(g4_speculative *sp, g4_sampler *sampler, const float *logits, int32_t d, int *keep,
                            int32_t *next) {
    return g4_draft_keep(sampler, logits, d, sp->cand_ids, sp->cand_probs, keep, next);
}

g4_status g4_speculative_prefill(g4_speculative *sp, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_sampler *sampler, int32_t *token) {
    sp->have_hidden = 0;
    g4_status st = g4_session_eval_hidden(sp->session, ids, n, soft, G4_LOGITS_LAST, sp->logits, sp->next_hidden);
    g4_sample sample;
    if (st == G4_OK) st = g4_sampler_sample(sampler, sp->logits, &sample);
    if (st != G4_OK) return st;
    sp->have_hidden = 1;
    *token = sample.token;
    return G4_OK;
}

/* Drafts up to k tokens after `token` at position p = the session length,
 * stopping after an end-of-sequence id (nothing follows it worth drafting);
 * returns how many in *n. */
static g4_status draft(g4_speculative *sp, int32_t token, int k, int32_t *drafts, int *n) {
    const g4_assistant *a = sp->assistant;
    g4_session *s = sp->session;
    const int p = g4_session_length(s);
    g4_drafter_kv kv = {
        .kv = s->kv,
        .full_table = s->seq.full_blocks,
        .full_table_stride = s->seq.cap_full,
        .ring = s->seq.ring,
    };
    /* every step of a round sees the same target keys, 0..p-1, and sits at p */
    g4_drafter_kv_window(a, p, &kv);
    return g4_draft_round(a, sp->scratch, s->model, &kv, p, token, sp->next_hidden, k, 0.0f, NULL, NULL, drafts, n);
}

g4_status g4_speculative_verify(g4_speculative *sp, int32_t token, const int32_t *drafts, int k,
                                g4_sampler *sampler, int32_t *out, int *n_out) {
    *n_out = 0;
    g4_session *s = sp->session;
    const int p = g4_session_length(s);
    if (k < 0 || k > sp->draft_max)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d drafts to verify (0..%d)", k, sp->draft_max);
    if (p + 1 + k > s->opt.n_ctx)
        return g4_fail(G4_ERR_LIMIT, "context full: %d positions used + %d to verify exceed %d", p, k + 1,
                       s->opt.n_ctx);
    int32_t row[G4_DRAFT_MAX + 1];
    row[0] = token;
    memcpy(row + 1, drafts, (size_t)k * sizeof *row);
    /* the target over [token, d_1..d_k] at p..p+k, one pass */
    g4_status st = g4_session_eval_hidden(s, row, k + 1, NULL, G4_LOGITS_ALL, sp->logits, sp->hidden);
    if (st != G4_OK) return st;
    /* each row decides with the sampler's history so far (accepted drafts
     * included), as plain decoding would */
    int n = 0;
    int32_t next = -1;
    for (int i = 0; i <= k; i++) {
        const float *logits = sp->logits + (size_t)i * sp->vocab;
        if (i == k) { /* every draft kept: the row after them, as usual */
            g4_sample sample;
            st = g4_sampler_sample(sampler, logits, &sample);
            if (st != G4_OK) return st;
            next = sample.token;
            break;
        }
        int keep = 0;
        if (sp->forced_accept >= 0 && i < sp->forced_accept) {
            keep = 1, next = row[i + 1];
        } else if (sp->forced_accept >= 0) { /* rejected: the target's own token */
            g4_sample sample;
            st = g4_sampler_sample(sampler, logits, &sample);
            next = sample.token;
        } else {
            st = keep_draft(sp, sampler, logits, row[i + 1], &keep, &next);
        }
        if (st != G4_OK) return st;
        if (!keep) break;
        st = g4_sampler_accept(sampler, next);
        if (st != G4_OK) return st;
        out[n++] = next;
    }
    out[n] = next;
    *n_out = n + 1;
    /* the state that chose `next` is the next round's drafter input */
    memcpy(sp->next_hidden, sp->hidden + (size_t)n * sp->hidden_size, (size_t)sp->hidden_size * sizeof(float));
    sp->have_hidden = 1;
    /* forget the rejected drafts: positions after p + n */
    g4_kv_seq_truncate(&s->seq, p + n + 1);
    g4_speculative_stats *stats = &sp->stats;
    stats->rounds++;
    stats->drafted += k;
    stats->accepted += n;
    for (int i = 0; i < k; i++) {
        stats->drafted_at[i]++;
        if (i < n) stats->accepted_at[i]++;
    }
    return G4_OK;
}

g4_status g4_speculative_step(g4_speculative *sp, int32_t token, g4_sampler *sampler, int max_new, int32_t *out,
                              int *n_out) {
    *n_out = 0;
    g4_session *s = sp->session;
    g4_status st = G4_OK;
    if (!sp->have_hidden)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "speculative step without a prefill: no hidden state to draft from");
    if (max_new < 1) return g4_fail(G4_ERR_INVALID_ARGUMENT, "a speculative step needs room for one token");
    const int p = g4_session_length(s);
    int k = sp->draft_max < max_new - 1 ? sp->draft_max : max_new - 1;
    if (p + 1 + k > s->opt.n_ctx) k = s->opt.n_ctx - p - 1; /* the context's end */
    if (k < 0) return g4_fail(G4_ERR_LIMIT, "context full: %d positions used of %d", p, s->opt.n_ctx);
    if (p == 0) k = 0; /* nothing for the drafter to attend to */
    int32_t drafts[G4_DRAFT_MAX];
    double t0 = g4_now_seconds();
    if (k > 0) {
        st = draft(sp, token, k, drafts, &k);
        if (st != G4_OK) return st;
    }
    double t1 = g4_now_seconds();
    st = g4_speculative_verify(sp, token, drafts, k, sampler, out, n_out);
    sp->stats.draft_seconds += t1 - t0;
    sp->stats.verify_seconds += g4_now_seconds() - t1;
    return st;
}

static int is_stop_id(int32_t id, const int32_t *stop_ids, int n_stop) {
    for (int i = 0; i < n_stop; i++)
        if (id == stop_ids[i]) return 1;
    return 0;
}

g4_status g4_speculative_greedy(g4_session *s, const g4_assistant *a, int draft_max, int forced_accept,
                                const int32_t *prompt, int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, int32_t *out,
                                int *n_out, g4_speculative_stats *stats, double *decode_seconds) {
    *n_out = 0;
    if (decode_seconds) *decode_seconds = 0;
    if (max_new <= 0) return G4_OK;
    g4_speculative *sp = NULL;
    g4_sampler *sampler = NULL;
    g4_sampler_params params;
    g4_sampler_params_default(&params); /* temperature 0: the argmax, no processors */
    g4_status st = g4_speculative_create(s, a, draft_max, &sp);
    if (st == G4_OK) g4_speculative_force_acceptance(sp, forced_accept);
    if (st == G4_OK) st = g4_sampler_create(s->model->config.text.vocab_size, &params, &sampler);
    int32_t tok = -1, round[G4_DRAFT_MAX + 1];
    if (st == G4_OK) st = g4_speculative_prefill(sp, prompt, n_prompt, NULL, sampler, &tok);
    const double t0 = g4_now_seconds();
    int done = 0;
    if (st == G4_OK) {
        out[(*n_out)++] = tok;
        done = is_stop_id(tok, stop_ids, n_stop) || *n_out == max_new;
    }
    while (st == G4_OK && !done) {
        int k = 0;
        st = g4_sampler_accept(sampler, tok);
        if (st == G4_OK) st = g4_speculative_step(sp, tok, sampler, max_new - *n_out, round, &k);
        for (int i = 0; st == G4_OK && i < k && !done; i++) {
            out[(*n_out)++] = tok = round[i];
            done = is_stop_id(tok, stop_ids, n_stop) || *n_out == max_new;
        }
    }
    if (decode_seconds) *decode_seconds = g4_now_seconds() - t0;
    if (sp && stats) *stats = *g4_speculative_get_stats(sp);
    g4_sampler_free(sampler);
    g4_speculative_free(sp);
    return st;
}
