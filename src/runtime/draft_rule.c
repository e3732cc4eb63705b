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
