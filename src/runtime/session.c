#include "runtime/session.h"

#include "constrain/token_mask.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/memory_plan.h"

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
    if (tc->bidirectional_vision) {
        s->bidir_mode = s->opt.vision_mask == G4_VISION_MASK_CAUSAL ? 0
                        : s->opt.vision_mask == G4_VISION_MASK_ALL_LAYERS ? 2 : 1;
    }
    int bs = s->opt.block_size;
    int full_blocks = (s->opt.n_ctx + bs - 1) / bs;
    int ring = g4_kv_ring_blocks(tc->sliding_window, s->opt.chunk, bs);
    /* a context shorter than window + chunk fits whole: no slot is reused,
     * and the sliding layers need no more blocks than the full ones */
    if (ring > full_blocks) ring = full_blocks;
    g4_status st = g4_memory_check_kv(m, s->opt.kv_type, bs, full_blocks, ring, s->opt.n_ctx);
    if (st == G4_OK) st = g4_kv_pool_create(m, bs, full_blocks, ring, ring, s->opt.kv_type, &s->kv);
    if (st == G4_OK) st = g4_kv_seq_init(s->kv, &s->seq);
    if (st == G4_OK) st = g4_text_scratch_create(m, s->opt.chunk, s->opt.chunk, &s->scratch);
    if (st != G4_OK) {
        g4_session_destroy(s);
        return st;
    }
    *out = s;
    return G4_OK;
}

void g4_session_destroy(g4_session *s) {
    if (!s) return;
    if (s->kv) g4_kv_seq_release(s->kv, &s->seq);
    g4_kv_pool_free(s->kv);
    g4_text_scratch_free(s->scratch);
    free(s);
}

void g4_session_reset(g4_session *s) { g4_kv_seq_truncate(&s->seq, 0); }

int g4_session_length(const g4_session *s) { return s->seq.length; }

static int is_vision_token(const g4_token_ids *tk, int32_t id) { return id == tk->image_id || id == tk->video_id; }

/* Image groups: maximal runs of image/video placeholder tokens (transformers'
 * get_block_sequence_ids_for_mask). Returns the end (exclusive) of the run
 * starting at index i. */
static int run_end(const g4_token_ids *tk, const int32_t *ids, int n, int i) {
    int j = i;
    while (j < n && is_vision_token(tk, ids[j])) j++;
    return j;
}

/* Length of the next chunk starting at `start`: at most `chunk` rows, ending
 * before an image group that would straddle the boundary (bidirectional
 * groups must be prefilled whole). */
static g4_status next_chunk(const g4_session *s, const int32_t *ids, int n, int start, int *len) {
    int limit = n - start < s->opt.chunk ? n - start : s->opt.chunk;
    if (!s->bidir_mode) {
        *len = limit;
        return G4_OK;
    }
    const g4_token_ids *tk = &s->model->config.tokens;
    int end = start + limit;
    if (end < n && is_vision_token(tk, ids[end]) && is_vision_token(tk, ids[end - 1])) {
        /* the boundary cuts a group: find where it starts */
        int g = end - 1;
        while (g > start && is_vision_token(tk, ids[g - 1])) g--;
        if (g == start) {
            int e = run_end(tk, ids, n, start);
            return g4_fail(G4_ERR_LIMIT,
                           "an image of %d soft tokens does not fit the %d-token prefill chunk; raise the chunk size",
                           e - start, s->opt.chunk);
        }
        end = g;
    }
    *len = end - start;
    return G4_OK;
}

/* What comes back of the last row: candidates (k > 0) instead of logits. */
typedef struct {
    int k;
    int32_t *ids;
    float *values;
    double *lse;
} candidates_out;

static g4_status eval(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, g4_logits_mode mode,
                      float *logits, const candidates_out *cand, float *hidden) {
    const g4_model *m = s->model;
    const int V = m->config.text.vocab_size;
    const g4_token_ids *tk = &m->config.tokens;
    if (n <= 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "empty prompt: nothing to evaluate");
    if (s->seq.length + n > s->opt.n_ctx)
        return g4_fail(G4_ERR_LIMIT, "context full: %d positions used + %d new exceed the context of %d",
                       s->seq.length, n, s->opt.n_ctx);
    int C = s->opt.chunk;
    int32_t *pos = malloc((size_t)C * sizeof *pos);
    int32_t *ranges = malloc((size_t)C * 4 * sizeof *ranges);
    int32_t *glo = malloc((size_t)C * sizeof *glo), *ghi = malloc((size_t)C * sizeof *ghi);
    int32_t *rows = malloc((size_t)C * sizeof *rows);
    int32_t *mm_rows = malloc((size_t)C * sizeof *mm_rows);
    g4_status st = (pos && ranges && glo && ghi && rows && mm_rows) ? G4_OK
                                                                      : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (int start = 0; st == G4_OK && start < n;) {
        int len = 0;
        st = next_chunk(s, ids, n, start, &len);
        if (st != G4_OK) break;
        int base = s->seq.length;
        st = g4_kv_seq_reserve(s->kv, &s->seq, base + len);
        if (st != G4_OK) break;
        for (int t = 0; t < len; t++) {
            pos[t] = base + t;
            glo[t] = ghi[t] = -1;
        }
        if (s->bidir_mode) {
            for (int t = 0; t < len;) {
                if (!is_vision_token(tk, ids[start + t])) {
                    t++;
                    continue;
                }
                int e = run_end(tk, ids + start, len, t);
                for (int u = t; u < e; u++) {
                    glo[u] = base + t;
                    ghi[u] = base + e;
                }
                t = e;
            }
        }
        g4_text_kv_ranges(m, pos, glo, ghi, len, s->bidir_mode, ranges);
        /* soft tokens that fall into this chunk */
        int n_mm = 0;
        const float *mm_first = NULL;
        if (soft) {
            for (int i = 0; i < soft->n; i++) {
                int r = soft->rows[i];
                if (r >= start && r < start + len) {
                    if (n_mm == 0) mm_first = soft->embeds + (size_t)i * m->config.text.hidden_size;
                    mm_rows[n_mm++] = r - start;
                }
            }
        }
        g4_text_batch b = {
            .n_tokens = len,
            .ids = ids + start,
            .pos = pos,
            .kv_range = ranges,
            .n_seqs = 1,
            .full_tables = s->seq.full_blocks,
            .full_table_stride = s->seq.n_full,
            .sliding_tables = s->seq.ring,
            .n_mm = n_mm,
            .mm_rows = mm_rows,
            .mm_embeds = mm_first,
            .hook = s->hook,
            .hook_ctx = s->hook_ctx,
        };
        int last_chunk = start + len == n;
        if (mode == G4_LOGITS_ALL) {
            for (int t = 0; t < len; t++) rows[t] = t;
            b.n_logit_rows = len;
            b.logit_rows = rows;
            b.logits = logits + (size_t)start * V;
            if (hidden) b.hidden_out = hidden + (size_t)start * m->config.text.hidden_size;
        } else if (mode == G4_LOGITS_LAST && last_chunk) {
            rows[0] = len - 1;
            b.n_logit_rows = 1;
            b.logit_rows = rows;
            b.logits = logits;
            b.hidden_out = hidden;
            if (cand) {
                b.n_candidates = cand->k;
                b.cand_ids = cand->ids;
                b.cand_values = cand->values;
                b.cand_lse = cand->lse;
            }
        }
        st = g4_text_forward(m, s->kv, s->scratch, &b);
        if (st != G4_OK) break;
        s->seq.length = base + len;
        start += len;
    }
    free(pos);
    free(ranges);
    free(glo);
    free(ghi);
    free(rows);
    free(mm_rows);
    return st;
}

g4_status g4_session_eval(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, g4_logits_mode mode,
                          float *logits) {
    return eval(s, ids, n, soft, mode, logits, NULL, NULL);
}

g4_status g4_session_eval_hidden(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_logits_mode mode, float *logits, float *hidden) {
    if (mode == G4_LOGITS_NONE) return g4_fail(G4_ERR_INVALID_ARGUMENT, "hidden states come with logit rows");
    return eval(s, ids, n, soft, mode, logits, NULL, hidden);
}

g4_status g4_session_eval_top(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft, int k,
                              int32_t *cand_ids, float *cand_values, double *lse) {
    if (k <= 0 || k > G4_TOP_LOGITS_MAX_K)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d candidates asked (1..%d)", k, G4_TOP_LOGITS_MAX_K);
    candidates_out c = {k, cand_ids, cand_values, lse};
    return eval(s, ids, n, soft, G4_LOGITS_LAST, NULL, &c, NULL);
}

g4_status g4_session_last_logits(g4_session *s, float *logits) { return g4_text_scratch_logits(s->scratch, 0, logits); }

g4_status g4_session_eval_sample(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_sampler *sampler, float *logits, g4_sample *out) {
    const int k = g4_sampler_candidates_needed(sampler);
    if (k == 0) {
        g4_status st = g4_session_eval(s, ids, n, soft, G4_LOGITS_LAST, logits);
        return st == G4_OK ? g4_sampler_sample(sampler, logits, out) : st;
    }
    int32_t cand_ids[G4_SAMPLER_MAX_CANDIDATES];
    float cand_values[G4_SAMPLER_MAX_CANDIDATES];
    double lse;
    int need_full = 0;
    g4_status st = g4_session_eval_top(s, ids, n, soft, k, cand_ids, cand_values, &lse);
    if (st == G4_OK) st = g4_sampler_sample_top(sampler, cand_ids, cand_values, k, lse, out, &need_full);
    if (st == G4_OK && need_full) { /* ties across the top-k edge: the row decides */
        st = g4_session_last_logits(s, logits);
        if (st == G4_OK) st = g4_sampler_sample(sampler, logits, out);
    }
    return st;
}

g4_status g4_session_eval_sample_constrained(g4_session *s, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                             g4_sampler *sampler, float *logits, g4_token_matcher *m,
                                             int tokens_left, g4_sample *out, int *none) {
    *none = 0;
    if (!m || !g4_token_matcher_constrained(m)) return g4_session_eval_sample(s, ids, n, soft, sampler, logits, out);
    g4_status st = g4_session_eval(s, ids, n, soft, G4_LOGITS_LAST, logits);
    if (st != G4_OK) return st;
    g4_token_matcher_set_budget(m, tokens_left);
    const uint32_t *mask;
    int r = g4_token_matcher_mask(m, &mask);
    if (r < 0) return G4_ERR_LIMIT;
    if (r > 0 && g4_mask_apply(mask, g4_token_matcher_vocab(m), logits, s->model->config.text.vocab_size) == 0) {
        *none = 1;
        return G4_OK;
    }
    return g4_sampler_sample(sampler, logits, out);
}
