#include "runtime/draft_rule.h"

#include <math.h>

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

g4_status g4_draft_round(const g4_assistant *a, g4_drafter_scratch *scratch, const g4_model *target,
                         const g4_drafter_kv *kv, int p, int32_t token, const float *hidden, int k, float min_p,
                         float *logits, int32_t *cands, int32_t *drafts, int *n) {
    int32_t tok = token;
    *n = 0;
    for (int i = 0; i < k; i++) {
        g4_status st = g4_drafter_set_token(scratch, target, tok, i == 0 ? hidden : NULL);
        g4_drafter_result res = {0};
        if (min_p > 0) {
            res.logits = logits;
            if (a->ordered) res.candidates = cands;
        }
        if (st == G4_OK) st = g4_drafter_forward(a, scratch, p, kv, &res);
        if (st != G4_OK) return st;
        if (res.logits && draft_confidence(a, target, &res) < min_p) break;
        drafts[(*n)++] = tok = res.token;
        if (is_eos(target, tok)) break;
    }
    return G4_OK;
}
