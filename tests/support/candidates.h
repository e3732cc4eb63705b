/* What the tests of candidate lists share (test_sampling_top,
 * test_masked_candidates, test_cuda_masked_top): the reference order of a
 * row (value descending, equal values by ascending id), random token masks
 * and masked rows, and the sampler setups compared between a candidate
 * list and the full row, with their bitwise sample comparison. The random
 * stream is test_random.h's (each test sets rng_state to its own seed). */
#ifndef G4_TESTS_SUPPORT_CANDIDATES_H
#define G4_TESTS_SUPPORT_CANDIDATES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/token_mask.h"
#include "runtime/sampler.h"
#include "support/test_random.h"

typedef struct {
    float v;
    int32_t id;
} rank_pair;

static inline int rank_pair_order(const void *a, const void *b) {
    const rank_pair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* sorted[0..vocab): the row's (value, id) in the order top_logits promises */
static inline void rank_row(const float *row, int vocab, rank_pair *sorted) {
    for (int i = 0; i < vocab; i++) sorted[i] = (rank_pair){row[i], i};
    qsort(sorted, (size_t)vocab, sizeof *sorted, rank_pair_order);
}

/* every token allowed with probability `density` (0: none, 1: all) */
static inline void random_mask(uint32_t *mask, int words, double density) {
    memset(mask, 0, (size_t)words * sizeof *mask);
    for (int i = 0; i < words * 32; i++)
        if (density >= 1 || uniform01() < density) mask[i >> 5] |= 1u << (i & 31);
}

/* out = x with the tokens the mask (of `words` words) does not allow at -inf */
static inline void masked_row(float *out, const float *x, int vocab, const uint32_t *mask, int words) {
    for (int i = 0; i < vocab; i++) out[i] = (i >> 5) < words && g4_mask_has(mask, i) ? x[i] : -INFINITY;
}

/* A sampler setup of the candidate-list tests. */
typedef struct {
    const char *name;
    float temperature;
    int top_k;
    float top_p, min_p;
    int logprobs, top_logprobs;
    g4_logprobs_mode mode;
} sampler_setup;

static inline void sampler_setup_params(const sampler_setup *s, uint64_t seed, g4_sampler_params *p) {
    g4_sampler_params_default(p);
    p->temperature = s->temperature;
    p->top_k = s->top_k;
    p->top_p = s->top_p;
    p->min_p = s->min_p;
    p->logprobs = s->logprobs;
    p->top_logprobs = s->top_logprobs;
    p->logprobs_mode = s->mode;
    p->seed = seed;
}

/* the same token, log-probability bits and top log-probabilities */
static inline int same_sample(const g4_sample *a, const g4_sample *b) {
    if (a->token != b->token || memcmp(&a->logprob, &b->logprob, sizeof a->logprob) || a->n_top != b->n_top) return 0;
    for (int i = 0; i < a->n_top; i++)
        if (a->top[i].id != b->top[i].id || memcmp(&a->top[i].logprob, &b->top[i].logprob, sizeof(float))) return 0;
    return 1;
}

#endif
