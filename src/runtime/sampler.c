#include "runtime/sampler.h"

#include "tensor/logsumexp.h"
#include "tensor/top_k.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Candidate sets up to this size are sorted for top-p; larger ones (top-p
 * without top-k over a flat distribution) go through a histogram first. */
#define TOP_P_SORT_LIMIT 4096
/* Histogram buckets: 32 per octave of the weight exp((x - max)/T), read
 * from the float's bits; weights below 2^-126 share the last bucket. */
#define HIST_SHIFT 18
#define HIST_BUCKETS ((0x3F800000u >> HIST_SHIFT) + 2)

struct g4_sampler {
    int32_t vocab;
    g4_sampler_params p;
    g4_logit_bias *bias;
    int32_t *suppress;
    uint64_t rng[4];
    uint8_t *seen;      /* [vocab] in prompt or generated text */
    int32_t *seen_list; /* unique ids with seen[] set */
    size_t n_seen;
    uint32_t *count;   /* [vocab] times generated */
    int32_t *gen_list; /* unique ids with count > 0 */
    size_t n_gen;
    float *work;    /* [vocab] logits after steps 1-4 */
    int32_t *cand;  /* [vocab] candidate ids, ascending */
    float *weight;  /* [vocab] exp((x - max)/T) of each candidate */
    uint8_t *keep;  /* [vocab] per candidate */
    double *hist_mass;
    uint32_t *hist_count;
};

/* ---- random numbers: xoshiro256** seeded by splitmix64 (Vigna) ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t g4_sampler_next_u64(g4_sampler *s) {
    uint64_t *r = s->rng;
    uint64_t result = rotl(r[1] * 5, 7) * 9;
    uint64_t t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return result;
}

double g4_sampler_next_double(g4_sampler *s) { return (double)(g4_sampler_next_u64(s) >> 11) * 0x1.0p-53; }

static void seed_rng(g4_sampler *s, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}

/* ---- parameters, lifetime, history ---- */

void g4_sampler_params_default(g4_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

void g4_sampler_params_from_generation_config(g4_sampler_params *p, const g4_generation_config *gc) {
    g4_sampler_params_default(p);
    if (!gc || !gc->present) return;
    p->temperature = gc->do_sample ? gc->temperature : 0.0f;
    p->top_k = gc->top_k;
    p->top_p = gc->top_p;
    p->min_p = gc->min_p;
    p->repetition_penalty = gc->repetition_penalty;
    p->suppress = (const int32_t *)gc->suppress_ids;
    p->n_suppress = (size_t)gc->n_suppress;
}

static g4_status check_params(const g4_sampler_params *p, int32_t vocab) {
    if (vocab <= 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: vocabulary size %d", (int)vocab);
    if (isnan(p->temperature) || isinf(p->temperature))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: temperature must be finite");
    if (!(p->top_p > 0.0f)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: top_p must be > 0 (got %g)", p->top_p);
    if (isnan(p->min_p) || p->min_p > 1.0f)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: min_p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: repetition_penalty must be > 0 (got %g)",
                       p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: presence/frequency penalties must be finite");
    if (p->top_logprobs < 0 || p->top_logprobs > G4_SAMPLER_MAX_TOP_LOGPROBS)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: top_logprobs must be in 0..%d (got %d)",
                       G4_SAMPLER_MAX_TOP_LOGPROBS, p->top_logprobs);
    for (size_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id < 0 || p->logit_bias[i].id >= vocab || !isfinite(p->logit_bias[i].bias))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: logit_bias entry %zu (token %d, bias %g) is invalid", i,
                           (int)p->logit_bias[i].id, p->logit_bias[i].bias);
    for (size_t i = 0; i < p->n_suppress; i++)
        if (p->suppress[i] < 0 || p->suppress[i] >= vocab)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: suppressed token %d is outside the vocabulary of %d",
                           (int)p->suppress[i], (int)vocab);
    return G4_OK;
}

g4_status g4_sampler_create(int32_t vocab_size, const g4_sampler_params *p, g4_sampler **out) {
    *out = NULL;
    g4_status st = check_params(p, vocab_size);
    if (st != G4_OK) return st;
    g4_sampler *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "sampler: out of memory");
    size_t v = (size_t)vocab_size;
    s->vocab = vocab_size;
    s->p = *p;
    s->bias = p->n_logit_bias ? malloc(p->n_logit_bias * sizeof *s->bias) : NULL;
    s->suppress = p->n_suppress ? malloc(p->n_suppress * sizeof *s->suppress) : NULL;
    s->seen = calloc(v, 1);
    s->seen_list = malloc(v * sizeof *s->seen_list);
    s->count = calloc(v, sizeof *s->count);
    s->gen_list = malloc(v * sizeof *s->gen_list);
    s->work = malloc(v * sizeof *s->work);
    s->cand = malloc(v * sizeof *s->cand);
    s->weight = malloc(v * sizeof *s->weight);
    s->keep = malloc(v);
    s->hist_mass = malloc(HIST_BUCKETS * sizeof *s->hist_mass);
    s->hist_count = malloc(HIST_BUCKETS * sizeof *s->hist_count);
    if ((p->n_logit_bias && !s->bias) || (p->n_suppress && !s->suppress) || !s->seen || !s->seen_list || !s->count ||
        !s->gen_list || !s->work || !s->cand || !s->weight || !s->keep || !s->hist_mass || !s->hist_count) {
        g4_sampler_free(s);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "sampler: out of memory for a vocabulary of %d", (int)vocab_size);
    }
    if (p->n_logit_bias) memcpy(s->bias, p->logit_bias, p->n_logit_bias * sizeof *s->bias);
    if (p->n_suppress) memcpy(s->suppress, p->suppress, p->n_suppress * sizeof *s->suppress);
    s->p.logit_bias = s->bias;
    s->p.suppress = s->suppress;
    seed_rng(s, p->seed);
    *out = s;
    return G4_OK;
}

void g4_sampler_free(g4_sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->suppress);
    free(s->seen);
    free(s->seen_list);
    free(s->count);
    free(s->gen_list);
    free(s->work);
    free(s->cand);
    free(s->weight);
    free(s->keep);
    free(s->hist_mass);
    free(s->hist_count);
    free(s);
}

void g4_sampler_reset(g4_sampler *s, uint64_t seed) {
    for (size_t i = 0; i < s->n_seen; i++) s->seen[s->seen_list[i]] = 0;
    for (size_t i = 0; i < s->n_gen; i++) s->count[s->gen_list[i]] = 0;
    s->n_seen = s->n_gen = 0;
    seed_rng(s, seed);
}

static void mark_seen(g4_sampler *s, int32_t id) {
    if (!s->seen[id]) {
        s->seen[id] = 1;
        s->seen_list[s->n_seen++] = id;
    }
}

g4_status g4_sampler_add_prompt(g4_sampler *s, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: prompt token %d at %zu is outside the vocabulary",
                           (int)ids[i], i);
    for (size_t i = 0; i < n; i++) mark_seen(s, ids[i]);
    return G4_OK;
}

g4_status g4_sampler_accept(g4_sampler *s, int32_t token) {
    if (token < 0 || token >= s->vocab)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: token %d is outside the vocabulary", (int)token);
    mark_seen(s, token);
    if (s->count[token]++ == 0) s->gen_list[s->n_gen++] = token;
    return G4_OK;
}

/* ---- steps 1-4: logits -> s->work ---- */

static g4_status prepare(g4_sampler *s, const float *logits) {
    size_t v = (size_t)s->vocab;
    float *restrict x = s->work;
    unsigned bad = 0;
#pragma omp simd reduction(+ : bad)
    for (size_t i = 0; i < v; i++) {
        float l = logits[i];
        x[i] = l;
        bad += l != l;
    }
    if (bad) return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: %u logits are NaN", bad);
    for (size_t i = 0; i < s->p.n_logit_bias; i++) x[s->bias[i].id] += s->bias[i].bias;
    float r = s->p.repetition_penalty;
    if (r != 1.0f)
        for (size_t i = 0; i < s->n_seen; i++) {
            float *t = &x[s->seen_list[i]];
            *t = *t < 0 ? *t * r : *t / r;
        }
    float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    if (pres != 0.0f || freq != 0.0f)
        for (size_t i = 0; i < s->n_gen; i++) {
            int32_t id = s->gen_list[i];
            x[id] -= pres + freq * (float)s->count[id];
        }
    for (size_t i = 0; i < s->p.n_suppress; i++) x[s->suppress[i]] = -INFINITY;
    return G4_OK;
}

/* First index of the maximum (ties -> lowest id); -1 if nothing is above
 * -inf. Vectorised block maxima; only the winning block is scanned. */
static int32_t argmax(const float *x, size_t n) {
    const size_t block = 64;
    float best = -INFINITY;
    size_t best_block = 0;
    for (size_t b = 0; b < n; b += block) {
        size_t e = b + block < n ? b + block : n;
        float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
        for (size_t i = b; i < e; i++) bm = x[i] > bm ? x[i] : bm;
        if (bm > best) {
            best = bm;
            best_block = b;
        }
    }
    if (!(best > -INFINITY)) return -1;
    for (size_t i = best_block; i < n; i++)
        if (x[i] == best) return (int32_t)i;
    return -1;
}

#define SUM_BLOCK 256

static float block_sum(const float *w, size_t i, size_t e) {
    float part = 0;
#pragma omp simd reduction(+ : part)
    for (size_t j = i; j < e; j++) part += w[j];
    return part;
}

/* Sum in float blocks (vectorised), blocks added in double. */
static double sum_of(const float *w, size_t n) {
    double z = 0;
    for (size_t i = 0; i < n; i += SUM_BLOCK) z += block_sum(w, i, i + SUM_BLOCK < n ? i + SUM_BLOCK : n);
    return z;
}

/* Inverse CDF: the first slot where the running sum of w passes target,
 * found block by block with the same block sums as sum_of(). */
static size_t pick(const float *w, size_t n, double target) {
    double cum = 0;
    for (size_t i = 0; i < n; i += SUM_BLOCK) {
        size_t e = i + SUM_BLOCK < n ? i + SUM_BLOCK : n;
        double part = block_sum(w, i, e);
        if (cum + part <= target && e < n) {
            cum += part;
            continue;
        }
        size_t last = n;
        for (size_t j = i; j < e; j++) {
            if (w[j] > 0) last = j;
            cum += w[j];
            if (cum > target && w[j] > 0) return j;
        }
        if (last < n) return last; /* rounding inside the block */
    }
    for (size_t j = n; j-- > 0;) /* rounding at the very top: the last token with weight */
        if (w[j] > 0) return j;
    return 0;
}

/* ---- steps 5-8: the kept set in s->cand[0..n) with weights ---- */

typedef struct {
    size_t n;      /* kept candidates */
    float max;     /* largest processed logit (before temperature) */
    double z;      /* sum of kept weights */
} kept_set;

/* Marks the top-p prefix (by value desc, id asc) of candidates c[0..n) in keep[]. */
static g4_status top_p_sorted(g4_sampler *s, size_t n, double budget) {
    g4_scored *order = malloc(n * sizeof *order);
    if (!order) return g4_fail(G4_ERR_OUT_OF_MEMORY, "sampler: out of memory");
    for (size_t i = 0; i < n; i++) order[i] = (g4_scored){s->work[s->cand[i]], s->cand[i]};
    qsort(order, n, sizeof *order, g4_scored_best_first);
    /* candidates are in ascending id order: find each sorted entry's slot by binary search */
    double above = 0;
    memset(s->keep, 0, n);
    for (size_t r = 0; r < n && above < budget; r++) {
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (s->cand[mid] < order[r].id) lo = mid + 1;
            else hi = mid;
        }
        s->keep[lo] = 1;
        above += s->weight[lo];
    }
    free(order);
    return G4_OK;
}

static size_t bucket_of(float w) {
    uint32_t bits;
    memcpy(&bits, &w, sizeof bits);
    if (w < 0x1p-126f) return HIST_BUCKETS - 1;
    return (0x3F800000u - bits) >> HIST_SHIFT;
}

/* Same result as top_p_sorted without sorting everything: whole histogram
 * buckets (32 per octave of weight) are kept while the mass above stays
 * below the budget; only the bucket where it crosses is sorted. */
static g4_status top_p_histogram(g4_sampler *s, size_t n, double budget) {
    memset(s->hist_mass, 0, HIST_BUCKETS * sizeof *s->hist_mass);
    memset(s->hist_count, 0, HIST_BUCKETS * sizeof *s->hist_count);
    for (size_t i = 0; i < n; i++) {
        size_t b = bucket_of(s->weight[i]);
        s->hist_mass[b] += s->weight[i];
        s->hist_count[b]++;
    }
    double above = 0;
    size_t edge = 0;
    while (edge < HIST_BUCKETS - 1 && above + s->hist_mass[edge] < budget) above += s->hist_mass[edge++];
    size_t m = s->hist_count[edge];
    g4_scored *order = malloc((m ? m : 1) * sizeof *order);
    if (!order) return g4_fail(G4_ERR_OUT_OF_MEMORY, "sampler: out of memory");
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = bucket_of(s->weight[i]);
        s->keep[i] = b < edge;
        if (b == edge) {
            order[j] = (g4_scored){s->work[s->cand[i]], (int32_t)i}; /* id field holds the slot here */
            j++;
        }
    }
    /* sort the edge bucket by value desc; slots ascend with ids, so ties go by id */
    qsort(order, m, sizeof *order, g4_scored_best_first);
    for (size_t r = 0; r < m && above < budget; r++) {
        s->keep[order[r].id] = 1;
        above += s->weight[order[r].id];
    }
    free(order);
    return G4_OK;
}

/* Drops the candidates whose keep flag is 0, keeping the id order
 * (branch-free: the flags follow no pattern). */
static void compact(g4_sampler *s, size_t *n) {
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        s->cand[k] = s->cand[i];
        s->weight[k] = s->weight[i];
        k += s->keep[i];
    }
    *n = k;
}

static g4_status weigh_kept(g4_sampler *s, size_t n, kept_set *ks);

/* Steps 6-8: top-k candidates of s->work, then weigh_kept. */
static g4_status select_kept(g4_sampler *s, kept_set *ks) {
    size_t v = (size_t)s->vocab, n = 0;
    const float *x = s->work;
    int k = s->p.top_k;
    if (k > 0 && (size_t)k < v) {
        g4_scored *heap = malloc((size_t)k * sizeof *heap);
        if (!heap) return g4_fail(G4_ERR_OUT_OF_MEMORY, "sampler: out of memory");
        g4_top_k_heap(x, v, heap, (size_t)k);
        float kth = heap[0].v;
        free(heap);
        /* every token >= the k-th value, as HF's `scores < topk[-1]` removal keeps ties;
         * blocks whose maximum is below it are skipped */
        const size_t block = 64;
        for (size_t b = 0; b < v; b += block) {
            size_t e = b + block < v ? b + block : v;
            float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
            for (size_t i = b; i < e; i++) bm = x[i] > bm ? x[i] : bm;
            if (!(bm >= kth)) continue;
            for (size_t i = b; i < e; i++)
                if (x[i] >= kth && x[i] > -INFINITY) s->cand[n++] = (int32_t)i;
        }
    } else {
        for (size_t i = 0; i < v; i++)
            if (x[i] > -INFINITY) s->cand[n++] = (int32_t)i;
    }
    return weigh_kept(s, n, ks);
}

/* Steps 5-8 for the candidates s->cand[0..n) (ascending ids, values in
 * s->work[id]): temperature weights, top-p, min-p. */
static g4_status weigh_kept(g4_sampler *s, size_t n, kept_set *ks) {
    size_t v = (size_t)s->vocab;
    const float *x = s->work;
    const float t = s->p.temperature, inv_t = 1.0f / t;
    float mx = -INFINITY;
    if (n == 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: every token is suppressed (no finite logit)");
    float *restrict w = s->weight;
    if (n == v) { /* every token is a candidate: contiguous, vectorised */
        mx = g4_max_of(x, v);
#pragma omp simd
        for (size_t i = 0; i < v; i++) w[i] = g4_exp_nonpos((x[i] - mx) * inv_t);
    } else {
        for (size_t i = 0; i < n; i++) mx = x[s->cand[i]] > mx ? x[s->cand[i]] : mx;
        for (size_t i = 0; i < n; i++) w[i] = g4_exp_nonpos((x[s->cand[i]] - mx) * inv_t);
    }
    double z = sum_of(w, n);
    if (s->p.top_p < 1.0f && n > 1) {
        double budget = (double)s->p.top_p * z;
        g4_status st = n <= TOP_P_SORT_LIMIT ? top_p_sorted(s, n, budget) : top_p_histogram(s, n, budget);
        if (st != G4_OK) return st;
        compact(s, &n);
    }
    if (s->p.min_p > 0.0f) {
        /* p_i >= min_p * p_max  <=>  w_i >= min_p, as the largest weight is exp(0) = 1 */
        for (size_t i = 0; i < n; i++) s->keep[i] = s->weight[i] >= s->p.min_p;
        compact(s, &n);
    }
    z = sum_of(s->weight, n);
    ks->n = n;
    ks->max = mx;
    ks->z = z;
    return G4_OK;
}

/* ---- log-probabilities ---- */

/* log_softmax over a whole vector: the chosen token and the top N */
static void full_logprobs(const float *x, size_t v, int32_t token, int want_top, g4_sample *out) {
    float m = g4_max_of(x, v);
    double lse = g4_log_sum_exp(x, v, m);
    out->logprob = (float)((double)x[token] - lse);
    if (want_top > 0) {
        size_t k = (size_t)want_top < v ? (size_t)want_top : v;
        g4_scored h[G4_SAMPLER_MAX_TOP_LOGPROBS];
        g4_top_k_heap(x, v, h, k);
        qsort(h, k, sizeof *h, g4_scored_best_first);
        for (size_t i = 0; i < k; i++) out->top[i] = (g4_token_logprob){h[i].id, (float)((double)h[i].v - lse)};
        out->n_top = (int)k;
    }
}

/* log-probabilities of the kept set: (x - max)/T - log z */
static void kept_logprobs(g4_sampler *s, const kept_set *ks, int32_t token, int want_top, g4_sample *out) {
    double inv_t = 1.0 / (double)s->p.temperature, lz = log(ks->z);
    out->logprob = (float)(((double)s->work[token] - ks->max) * inv_t - lz);
    if (want_top > 0) {
        size_t k = (size_t)want_top < ks->n ? (size_t)want_top : ks->n;
        g4_scored h[G4_SAMPLER_MAX_TOP_LOGPROBS];
        /* the kept set is small after filtering in practice; a heap keeps it linear anyway */
        g4_scored *all = malloc(ks->n * sizeof *all);
        if (!all) {
            out->n_top = 0;
            return;
        }
        for (size_t i = 0; i < ks->n; i++) all[i] = (g4_scored){s->work[s->cand[i]], s->cand[i]};
        for (size_t i = 0; i < k; i++) h[i] = all[i];
        for (size_t i = k / 2; i-- > 0;) g4_heap_sift_down(h, k, i);
        for (size_t i = k; i < ks->n; i++)
            if (g4_scored_below(h[0], all[i])) {
                h[0] = all[i];
                g4_heap_sift_down(h, k, 0);
            }
        free(all);
        qsort(h, k, sizeof *h, g4_scored_best_first);
        for (size_t i = 0; i < k; i++)
            out->top[i] = (g4_token_logprob){h[i].id, (float)(((double)h[i].v - ks->max) * inv_t - lz)};
        out->n_top = (int)k;
    }
}

/* ---- public entry points ---- */

g4_status g4_sampler_sample(g4_sampler *s, const float *logits, g4_sample *out) {
    memset(out, 0, sizeof *out);
    g4_status st = prepare(s, logits);
    if (st != G4_OK) return st;
    size_t v = (size_t)s->vocab;
    int want_lp = s->p.logprobs || s->p.top_logprobs > 0;
    if (s->p.temperature <= 0.0f) {
        int32_t tok = argmax(s->work, v);
        if (tok < 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: every token is suppressed (no finite logit)");
        out->token = tok;
        if (want_lp)
            full_logprobs(s->p.logprobs_mode == G4_LOGPROBS_RAW ? logits : s->work, v, tok, s->p.top_logprobs, out);
        return G4_OK;
    }
    kept_set ks;
    if ((st = select_kept(s, &ks)) != G4_OK) return st;
    size_t slot = pick(s->weight, ks.n, g4_sampler_next_double(s) * ks.z);
    out->token = s->cand[slot];
    if (want_lp) {
        if (s->p.logprobs_mode == G4_LOGPROBS_RAW) full_logprobs(logits, v, out->token, s->p.top_logprobs, out);
        else kept_logprobs(s, &ks, out->token, s->p.top_logprobs, out);
    }
    return G4_OK;
}

g4_status g4_sampler_candidates(g4_sampler *s, const float *logits, int32_t *ids, double *probs, size_t *n) {
    *n = 0;
    g4_status st = prepare(s, logits);
    if (st != G4_OK) return st;
    if (s->p.temperature <= 0.0f) {
        int32_t tok = argmax(s->work, (size_t)s->vocab);
        if (tok < 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: every token is suppressed (no finite logit)");
        ids[0] = tok;
        probs[0] = 1.0;
        *n = 1;
        return G4_OK;
    }
    kept_set ks;
    if ((st = select_kept(s, &ks)) != G4_OK) return st;
    for (size_t i = 0; i < ks.n; i++) {
        ids[i] = s->cand[i];
        probs[i] = s->weight[i] / ks.z;
    }
    *n = ks.n;
    return G4_OK;
}

/* ---- choosing from the row's largest logits ---- */

/* Extra candidates beyond top_k: ties across the top-k edge are kept (as
 * HF), and a tie run that ends inside the list is seen whole. */
#define TOP_K_EDGE_MARGIN 4

int g4_sampler_is_greedy(const g4_sampler *s) { return s->p.temperature <= 0; }

int g4_sampler_candidates_needed(const g4_sampler *s) {
    const g4_sampler_params *p = &s->p;
    /* Logit bias, penalties and suppressed tokens (steps 1-4) move logits
     * anywhere in the row: the row's largest logits need not hold the
     * largest processed ones. Such requests take the full row. */
    if (p->n_logit_bias || p->n_suppress || p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
        p->frequency_penalty != 0.0f)
        return 0;
    int k;
    if (p->temperature <= 0.0f) {
        k = p->top_logprobs > 1 ? p->top_logprobs : 1;
    } else {
        /* without top-k any token may be drawn: the full row */
        if (p->top_k <= 0 || p->top_k >= s->vocab) return 0;
        k = (p->top_k > p->top_logprobs ? p->top_k : p->top_logprobs) + TOP_K_EDGE_MARGIN;
    }
    if (k > s->vocab) k = s->vocab;
    return k <= G4_SAMPLER_MAX_CANDIDATES ? k : 0;
}

int g4_sampler_wants_logprobs(const g4_sampler *s) { return s->p.logprobs || s->p.top_logprobs > 0; }

static int ascending_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* RAW log-probabilities (log_softmax of the unprocessed row) from the
 * candidates: what full_logprobs gives on the whole row. */
static void top_raw_logprobs(const int32_t *ids, const float *values, int n, double lse, float token_value,
                             int want_top, g4_sample *out) {
    out->logprob = (float)((double)token_value - lse);
    if (want_top > 0) {
        int k = want_top < n ? want_top : n;
        for (int i = 0; i < k; i++) out->top[i] = (g4_token_logprob){ids[i], (float)((double)values[i] - lse)};
        out->n_top = k;
    }
}

int g4_sampler_takes_candidates(const g4_sampler *s) {
    const g4_sampler_params *p = &s->p;
    return !(p->n_logit_bias || p->n_suppress || p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
             p->frequency_penalty != 0.0f);
}

/* g4_sampler_sample_top, and with `complete` g4_sampler_sample_complete. */
static g4_status sample_listed(g4_sampler *s, const int32_t *ids, const float *values, int n, double lse,
                               int complete, g4_sample *out, int *need_full) {
    memset(out, 0, sizeof *out);
    *need_full = 0;
    const int need = g4_sampler_candidates_needed(s);
    if (complete ? !g4_sampler_takes_candidates(s) : need == 0 || n < need)
        return g4_fail(G4_ERR_INVALID_ARGUMENT,
                       "sampler: %d candidates given where these parameters need %d (0: the full row)", n, need);
    if (n > s->vocab) n = s->vocab; /* the rest is padding */
    if (isnan(lse)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: the logits hold NaN");
    if (complete && s->p.top_logprobs > n) { /* the full row's list goes on into -inf tokens */
        *need_full = 1;
        return G4_OK;
    }
    if (n <= 0 || !(values[0] > -INFINITY))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: every token is suppressed (no finite logit)");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab || (i && !(values[i] <= values[i - 1])))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "sampler: candidate %d (token %d) is out of order or range", i,
                           (int)ids[i]);
    const int want_lp = s->p.logprobs || s->p.top_logprobs > 0;
    if (s->p.temperature <= 0.0f) { /* the first candidate is the argmax, ties to the lowest id */
        out->token = ids[0];
        /* greedy PROCESSED log-probabilities are of the unpenalised row here: the same as RAW */
        if (want_lp) top_raw_logprobs(ids, values, n, lse, values[0], s->p.top_logprobs, out);
        return G4_OK;
    }
    /* top-k keeps every token >= the k-th value: the run of values equal to
     * it must end inside the list, or the list must be the whole row (or
     * hold every finite value of it) */
    int m = n;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        const float kth = values[s->p.top_k - 1];
        m = s->p.top_k;
        while (m < n && values[m] == kth) m++;
        if (m == n && n < s->vocab && !complete) {
            *need_full = 1;
            return G4_OK;
        }
    } else if (!complete && n < s->vocab) { /* cannot happen: needed() asks for more */
        *need_full = 1;
        return G4_OK;
    }
    while (m > 0 && !(values[m - 1] > -INFINITY)) m--;
    /* the kept candidates as select_kept leaves them: ascending ids, values in work[] */
    for (int i = 0; i < m; i++) {
        s->cand[i] = ids[i];
        s->work[ids[i]] = values[i];
    }
    qsort(s->cand, (size_t)m, sizeof *s->cand, ascending_id);
    kept_set ks;
    g4_status st = weigh_kept(s, (size_t)m, &ks);
    if (st != G4_OK) return st;
    size_t slot = pick(s->weight, ks.n, g4_sampler_next_double(s) * ks.z);
    out->token = s->cand[slot];
    if (want_lp) {
        if (s->p.logprobs_mode == G4_LOGPROBS_RAW)
            top_raw_logprobs(ids, values, n, lse, s->work[out->token], s->p.top_logprobs, out);
        else
            kept_logprobs(s, &ks, out->token, s->p.top_logprobs, out);
    }
    return G4_OK;
}

g4_status g4_sampler_sample_top(g4_sampler *s, const int32_t *ids, const float *values, int n, double lse,
                                g4_sample *out, int *need_full) {
    return sample_listed(s, ids, values, n, lse, 0, out, need_full);
}

g4_status g4_sampler_sample_complete(g4_sampler *s, const int32_t *ids, const float *values, int n, double lse,
                                     g4_sample *out, int *need_full) {
    return sample_listed(s, ids, values, n, lse, 1, out, need_full);
}
