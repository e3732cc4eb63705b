#include "runtime/draft_rule.h"

#include <math.h>
#include <stdlib.h>

g4_status g4_draft_keep(g4_sampler *sampler, const float *logits, int32_t d, int32_t *cand_ids, double *cand_probs,
                        int *keep, int32_t *next) {
    if (g4_sampler_is_greedy(sampler)) {
        g4_sample sample;
        g4_status st = g4_sampler_sample(sampler, logits, &sample);
        if (st != G4_OK) return st;
        *keep = sample.token == d;
        *next = sample.token;
        return G4_OK;
    }
    size_t n = 0;
    g4_status st = g4_sampler_candidates(sampler, logits, cand_ids, cand_probs, &n);
    if (st != G4_OK) return st;
    double p_d = 0;
    for (size_t i = 0; i < n; i++)
        if (cand_ids[i] == d) p_d = cand_probs[i];
    *keep = g4_sampler_next_double(sampler) < p_d;
    *next = d;
    if (*keep) return G4_OK;
    /* the residual: p without d, drawn in ascending id order */
    double u = g4_sampler_next_double(sampler) * (1.0 - p_d), acc = 0;
    int32_t last = -1;
    for (size_t i = 0; i < n; i++) {
        if (cand_ids[i] == d || cand_probs[i] <= 0) continue;
        last = cand_ids[i];
        acc += cand_probs[i];
        if (u < acc) break;
    }
    if (last < 0) return g4_fail(G4_ERR_INTERNAL, "speculative sampling: no token left besides the rejected draft");
    *next = last;
    return G4_OK;
}

void g4_draft_length_init(g4_draft_length *d, int max) {
    d->max = max < 1 ? 1 : max > G4_DRAFT_MAX ? G4_DRAFT_MAX : max;
    d->len = d->max;
}

void g4_draft_length_update(g4_draft_length *d, int drafted, int kept) {
    if (drafted <= 0) return;
    if (kept >= drafted && d->len < d->max) d->len++;
    else if (2 * kept < drafted && d->len > 1) d->len--;
}

double g4_draft_top_probability(const float *logits, int n) {
    float top = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > top) top = logits[i];
    if (!(top > -INFINITY)) return 0;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - top);
    return 1.0 / sum;
}

static int is_eos(const g4_model *m, int32_t id) {
    for (int i = 0; i < m->config.tokens.n_eos; i++)
        if (id == m->config.tokens.eos_ids[i]) return 1;
    return 0;
}

/* The drafter's probability of its own choice, a softmax over the tokens it
 * scored (the centroid head scores only its candidates; the others carry a
 * filler value that is no probability). */
static double draft_confidence(const g4_assistant *a, const g4_model *target, const g4_drafter_result *res) {
    if (!a->ordered) return g4_draft_top_probability(res->logits, target->config.text.vocab_size);
    const int n = a->centroid_top_k * a->tokens_per_centroid;
    float top = -INFINITY;
    for (int i = 0; i < n; i++)
        if (res->logits[res->candidates[i]] > top) top = res->logits[res->candidates[i]];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)res->logits[res->candidates[i]] - top);
    return sum > 0 ? 1.0 / sum : 0;
}

/* The per-row arrays of one drafter forward (a group's rows). */
typedef struct {
    int *active, *from, *pos; /* scratch row r: which row it holds, its row the step before, its position */
    int32_t *tokens;
    const float **hidden;
    g4_drafter_kv *kv;
    g4_drafter_result *res;
} draft_work;

/* One group of at most the scratch's rows. */
static g4_status draft_group(const g4_assistant *a, g4_drafter_scratch *scratch, const g4_model *target,
                             g4_draft_row *rows, int n_rows, float min_p, float *logits, int32_t *cands,
                             const draft_work *w, int *forwards) {
    const size_t V = (size_t)target->config.text.vocab_size;
    const size_t n_cands = (size_t)(a->ordered ? a->centroid_top_k * a->tokens_per_centroid : 1);
    int *active = w->active, *from = w->from, *pos = w->pos;
    int32_t *tokens = w->tokens;
    const float **hidden = w->hidden;
    g4_drafter_kv *kv = w->kv;
    g4_drafter_result *res = w->res;
    int n_active = 0;
    for (int i = 0; i < n_rows; i++) {
        rows[i].n = 0;
        if (rows[i].k > 0) active[n_active] = i, from[n_active] = -1, n_active++;
    }
    for (int step = 0; n_active > 0; step++) {
        for (int r = 0; r < n_active; r++) {
            const g4_draft_row *row = &rows[active[r]];
            tokens[r] = step == 0 ? row->token : row->drafts[row->n - 1];
            hidden[r] = step == 0 ? row->hidden : NULL;
            pos[r] = row->pos;
            kv[r] = row->kv;
            res[r] = (g4_drafter_result){0};
            if (min_p > 0) {
                res[r].logits = logits + (size_t)r * V;
                if (a->ordered) res[r].candidates = cands + (size_t)r * n_cands;
            }
        }
        g4_status st = g4_drafter_set_tokens(scratch, target, n_active, tokens, hidden, step == 0 ? NULL : from);
        if (st == G4_OK) st = g4_drafter_forward_rows(a, scratch, n_active, pos, kv, res);
        if (st != G4_OK) return st;
        if (forwards) (*forwards)++;
        int kept = 0;
        for (int r = 0; r < n_active; r++) {
            g4_draft_row *row = &rows[active[r]];
            if (res[r].logits && draft_confidence(a, target, &res[r]) < min_p) continue;
            row->drafts[row->n++] = res[r].token;
            if (row->n >= row->k || is_eos(target, res[r].token)) continue;
            /* it drafts on from scratch row `kept`, its state now at row r */
            active[kept] = active[r];
            from[kept] = r;
            kept++;
        }
        n_active = kept;
    }
    return G4_OK;
}

g4_status g4_draft_rounds(const g4_assistant *a, g4_drafter_scratch *scratch, const g4_model *target,
                          g4_draft_row *rows, int n_rows, float min_p, float *logits, int32_t *cands,
                          int *forwards) {
    const int cap = g4_drafter_scratch_rows(scratch);
    const size_t n = (size_t)(n_rows < cap ? n_rows : cap);
    if (n_rows <= 0) return G4_OK;
    draft_work w = {.active = malloc(n * sizeof *w.active), .from = malloc(n * sizeof *w.from),
                    .pos = malloc(n * sizeof *w.pos), .tokens = malloc(n * sizeof *w.tokens),
                    .hidden = malloc(n * sizeof *w.hidden), .kv = malloc(n * sizeof *w.kv),
                    .res = malloc(n * sizeof *w.res)};
    g4_status st = G4_OK;
    if (!w.active || !w.from || !w.pos || !w.tokens || !w.hidden || !w.kv || !w.res)
        st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for a drafting round of %d rows", n_rows);
    for (int i = 0; st == G4_OK && i < n_rows; i += cap)
        st = draft_group(a, scratch, target, rows + i, n_rows - i < cap ? n_rows - i : cap, min_p, logits, cands, &w,
                         forwards);
    free(w.active), free(w.from), free(w.pos), free(w.tokens), free(w.hidden), free(w.kv), free(w.res);
    return st;
}

g4_status g4_draft_round(const g4_assistant *a, g4_drafter_scratch *scratch, const g4_model *target,
                         const g4_drafter_kv *kv, int p, int32_t token, const float *hidden, int k, float min_p,
                         float *logits, int32_t *cands, int32_t *drafts, int *n) {
    g4_draft_row row = {.kv = *kv, .pos = p, .token = token, .hidden = hidden, .k = k, .drafts = drafts};
    g4_status st = g4_draft_rounds(a, scratch, target, &row, 1, min_p, logits, cands, NULL);
    *n = row.n;
    return st;
}
