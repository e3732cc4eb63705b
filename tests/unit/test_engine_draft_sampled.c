/* Speculative sampling inside the batched engine (issue 29) keeps the
 * target's distribution. Seeded sampled requests (temperature 1, top-k 3)
 * of one prompt run through the engine with and without a drafter (two
 * drafts a round, the drafter batched over 64 sequences) on the bundled
 * model and its trained drafter; the first three tokens (t1, t2, t3) of
 * every reply are counted, and both runs are compared by chi-squared with
 * the exact distribution p(t1) p(t2 | t1) p(t3 | t1, t2) that the sampler
 * gives on the target's own logits (one session evaluation per prefix), and
 * with each other. t2 is a verified first draft (kept with p(d), else drawn
 * from the residual p without d: about half the rounds), t3 a verified
 * second draft, a bonus row or the next round's first draft.
 *
 * The thresholds are the chi-squared quantiles at 1e-4 for the degrees of
 * freedom of each comparison (categories with expected count >= 5, the rest
 * pooled into one), computed here; the draws are seeded, so a run is
 * reproducible. A residual that does not exclude the rejected draft, or a
 * draft always kept, fails it (tried by breaking g4_draft_keep). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/assistant.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "text/tokenizer.h"
#include "test_util.h"

enum { TOP_K = 3, N_TOK = 3, N_CAT = TOP_K * TOP_K * TOP_K };

/* A reply's first tokens, and the category of the joint (t1, t2, t3) */
typedef struct {
    int32_t ids[N_TOK + 2];
    int n;
    int done;
} reply;

static void on_token(void *user, const g4_token_event *ev) {
    reply *r = user;
    if (ev->has_token && r->n < N_TOK + 2) r->ids[r->n++] = ev->sample.token;
    if (ev->finish != G4_FINISH_NONE) r->done = 1;
}

static void sampling_params(g4_sampler_params *p, uint64_t seed) {
    g4_sampler_params_default(p);
    p->temperature = 1.0f;
    p->top_k = TOP_K;
    p->seed = seed;
}

/* The exact joint distribution: for every prefix, the sampler's candidates
 * (ascending ids, top-k renormalised) on the target's logits after it.
 * cand[0][k]: t1; cand[1][i][k]: t2 after t1 = cand[0][i]; cand[2][i][j][k]. */
typedef struct {
    int32_t t1[TOP_K], t2[TOP_K][TOP_K], t3[TOP_K][TOP_K][TOP_K];
    double p[N_CAT];
} exact_dist;

static int candidates(g4_session *s, g4_sampler *sampler, const int32_t *ids, int n, int32_t *cand, double *prob) {
    const int V = s->model->config.text.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *all = malloc((size_t)V * sizeof *all);
    double *probs = malloc((size_t)V * sizeof *probs);
    size_t got = 0;
    g4_session_reset(s);
    g4_status st = g4_session_eval(s, ids, n, NULL, G4_LOGITS_LAST, logits);
    if (st == G4_OK) st = g4_sampler_candidates(sampler, logits, all, probs, &got);
    CHECK(st == G4_OK && got == TOP_K, "exact distribution: %s (%zu candidates)", g4_error_message(), got);
    for (size_t i = 0; i < TOP_K && i < got; i++) cand[i] = all[i], prob[i] = probs[i];
    free(logits), free(all), free(probs);
    return st == G4_OK && got == TOP_K;
}

static int exact_distribution(const g4_model *m, const int32_t *prompt, int P, exact_dist *d) {
    g4_session *s = NULL;
    g4_sampler *sampler = NULL;
    g4_sampler_params sp;
    sampling_params(&sp, 1);
    g4_status st = g4_session_create(m, NULL, &s);
    if (st == G4_OK) st = g4_sampler_create(m->config.text.vocab_size, &sp, &sampler);
    CHECK(st == G4_OK, "exact distribution setup: %s", g4_error_message());
    int ok = st == G4_OK;
    int32_t ids[64];
    double p1[TOP_K], p2[TOP_K], p3[TOP_K];
    memcpy(ids, prompt, (size_t)P * sizeof *ids);
    ok = ok && candidates(s, sampler, ids, P, d->t1, p1);
    for (int i = 0; ok && i < TOP_K; i++) {
        ids[P] = d->t1[i];
        ok = candidates(s, sampler, ids, P + 1, d->t2[i], p2);
        for (int j = 0; ok && j < TOP_K; j++) {
            ids[P + 1] = d->t2[i][j];
            ok = candidates(s, sampler, ids, P + 2, d->t3[i][j], p3);
            for (int k = 0; ok && k < TOP_K; k++) d->p[(i * TOP_K + j) * TOP_K + k] = p1[i] * p2[j] * p3[k];
        }
    }
    g4_sampler_free(sampler);
    g4_session_destroy(s);
    return ok;
}

static int index_of(const int32_t *ids, int32_t id) {
    for (int i = 0; i < TOP_K; i++)
        if (ids[i] == id) return i;
    return -1;
}

/* The category of a reply's (t1, t2, t3); -1 outside the sampler's sets */
static int category(const exact_dist *d, const reply *r) {
    if (r->n < N_TOK) return -1;
    int i = index_of(d->t1, r->ids[0]);
    int j = i < 0 ? -1 : index_of(d->t2[i], r->ids[1]);
    int k = j < 0 ? -1 : index_of(d->t3[i][j], r->ids[2]);
    return k < 0 ? -1 : (i * TOP_K + j) * TOP_K + k;
}

/* The chi-squared quantile at upper tail 1e-4 for df degrees of freedom
 * (Wilson-Hilferty: (x/df)^(1/3) is close to normal with mean 1 - 2/(9 df)
 * and variance 2/(9 df); z(1e-4) = 3.719). */
static double chi2_threshold(int df) {
    const double z = 3.719, v = 2.0 / (9.0 * df);
    const double c = 1.0 - v + z * sqrt(v);
    return df * c * c * c;
}

/* Goodness of fit of counts (total n) to probabilities p; categories with
 * an expected count under 5 are pooled into one. */
static double chi2_fit(const long *count, const double *p, long n, int *df) {
    double stat = 0, pool_e = 0, pool_o = 0;
    int cats = 0;
    for (int c = 0; c < N_CAT; c++) {
        const double e = n * p[c];
        if (e < 5) {
            pool_e += e, pool_o += count[c];
            continue;
        }
        stat += (count[c] - e) * (count[c] - e) / e;
        cats++;
    }
    if (pool_e >= 5) stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, cats++;
    *df = cats - 1;
    return stat;
}

/* Two samples of the same size: sum (a - b)^2 / (a + b) over categories
 * with a + b >= 10, the rest pooled. */
static double chi2_two_sample(const long *a, const long *b, int *df) {
    double stat = 0;
    long pa = 0, pb = 0;
    int cats = 0;
    for (int c = 0; c < N_CAT; c++) {
        if (a[c] + b[c] < 10) {
            pa += a[c], pb += b[c];
            continue;
        }
        stat += (double)(a[c] - b[c]) * (a[c] - b[c]) / (double)(a[c] + b[c]);
        cats++;
    }
    if (pa + pb >= 10) stat += (double)(pa - pb) * (pa - pb) / (double)(pa + pb), cats++;
    *df = cats - 1;
    return stat;
}

/* n seeded requests of the prompt through one engine (drafter a or none);
 * counts[c] of their (t1, t2, t3). */
static int sample_engine(const g4_model *m, const g4_assistant *a, const int32_t *prompt, int P, int n,
                         const exact_dist *d, long *counts, g4_engine_stats *stats) {
    enum { SEQS = 64 };
    g4_engine_options opt = {.max_seqs = SEQS, .n_ctx = P + 8, .no_prefix_cache = 1, .max_queue = n,
                             .drafter = a, .draft_max = 2, .draft_max_batch = SEQS};
    reply *rs = calloc((size_t)n, sizeof *rs);
    g4_engine *e = NULL;
    g4_status st = g4_engine_create(m, &opt, &e);
    for (int r = 0; st == G4_OK && r < n; r++) {
        /* drafted: a fourth token, so that the first round drafts two (a round leaves room for its bonus) */
        g4_request req = {.prompt = prompt, .n_prompt = P, .max_tokens = a ? N_TOK + 1 : N_TOK, .on_token = on_token,
                          .user = &rs[r]};
        sampling_params(&req.sampling, 7000 + (uint64_t)r);
        st = g4_engine_submit(e, &req, NULL);
    }
    while (st == G4_OK) {
        int left = g4_engine_step(e);
        if (left < 0) st = G4_ERR_INTERNAL;
        if (left <= 0) break;
    }
    CHECK(st == G4_OK, "sampling engine (%s): %s", a ? "drafted" : "plain", g4_error_message());
    if (e) g4_engine_get_stats(e, stats);
    g4_engine_destroy(e);
    memset(counts, 0, N_CAT * sizeof *counts);
    long outside = 0, short_replies = 0;
    for (int r = 0; r < n; r++) {
        short_replies += !rs[r].done || rs[r].n < N_TOK;
        const int c = category(d, &rs[r]);
        if (c >= 0) counts[c]++;
        else outside++;
    }
    CHECK(short_replies == 0, "%ld replies with fewer than %d tokens", short_replies, N_TOK);
    CHECK(outside == 0, "%s: %ld of %d replies outside the sampler's top-%d sets", a ? "drafted" : "plain", outside,
          n, TOP_K);
    free(rs);
    return st == G4_OK;
}

static void check_pair(const char *name, const g4_model *m, const g4_assistant *a, const int32_t *prompt, int P,
                       int n) {
    exact_dist d;
    if (!exact_distribution(m, prompt, P, &d)) return;
    static long plain[N_CAT], drafted[N_CAT];
    g4_engine_stats sp, sd;
    if (!sample_engine(m, NULL, prompt, P, n, &d, plain, &sp)) return;
    if (!sample_engine(m, a, prompt, P, n, &d, drafted, &sd)) return;
    int df_p, df_d, df_2;
    const double x_p = chi2_fit(plain, d.p, n, &df_p), x_d = chi2_fit(drafted, d.p, n, &df_d);
    const double x_2 = chi2_two_sample(plain, drafted, &df_2);
    const double t_p = chi2_threshold(df_p), t_d = chi2_threshold(df_d), t_2 = chi2_threshold(df_2);
    /* both paths ran: first drafts kept and rejected (the residual), second drafts verified */
    const uint64_t rejected0 = sd.drafted_at[0] - sd.accepted_at[0];
    printf("%s, %d samples of (t1, t2, t3), top-%d: plain vs exact chi2 %.1f (df %d, limit %.1f); drafted vs exact "
           "%.1f (df %d, limit %.1f); drafted vs plain %.1f (df %d, limit %.1f)\n",
           name, n, TOP_K, x_p, df_p, t_p, x_d, df_d, t_d, x_2, df_2, t_2);
    printf("%s: %llu rounds, first drafts kept %llu of %llu (%llu residual draws), second drafts kept %llu of %llu, "
           "%llu drafter forwards\n",
           name, (unsigned long long)sd.draft_rounds, (unsigned long long)sd.accepted_at[0],
           (unsigned long long)sd.drafted_at[0], (unsigned long long)rejected0, (unsigned long long)sd.accepted_at[1],
           (unsigned long long)sd.drafted_at[1], (unsigned long long)sd.draft_forwards);
    CHECK(sd.draft_rounds >= (uint64_t)n && rejected0 >= (uint64_t)n / 10 && sd.accepted_at[0] >= (uint64_t)n / 10,
          "%s: both verdicts at the first draft (%llu kept, %llu rejected of %llu rounds)", name,
          (unsigned long long)sd.accepted_at[0], (unsigned long long)rejected0, (unsigned long long)sd.draft_rounds);
    CHECK(sp.draft_rounds == 0, "%s: the plain engine drafted", name);
    CHECK(df_p >= 3 && df_d >= 3, "%s: %d / %d degrees of freedom", name, df_p, df_d);
    CHECK(x_p < t_p, "%s: plain sampling does not follow the exact distribution (chi2 %.1f >= %.1f)", name, x_p, t_p);
    CHECK(x_d < t_d, "%s: drafted sampling does not keep the target's distribution (chi2 %.1f >= %.1f)", name, x_d,
          t_d);
    CHECK(x_2 < t_2, "%s: drafted and plain sampling differ (chi2 %.1f >= %.1f)", name, x_2, t_2);
}

int main(void) {
    const char *src = getenv("G4_SOURCE");
    g4_backend *be = NULL;
    g4_status st = g4_backend_cpu_create(0, &be);
    CHECK(st == G4_OK, "cpu backend: %s", g4_error_message());
    if (!be) return test_finish();
    /* the exact path: a row's logits in any batch are those of the session */
    be->ops->set_precision(be, G4_PRECISION_EXACT);
    /* every sample costs a few rows of the 262,144-token head: 600 (300 sanitized) keep it to seconds; a
     * residual that may draw the rejected draft again gives chi2 91 at 500 (limit 46) */
    const int n = getenv("G4_TEST_SANITIZED") && !strcmp(getenv("G4_TEST_SANITIZED"), "1") ? 300 : 600;

    /* the bundled model and its trained drafter */
    char mdir[1024], adir[1024];
    snprintf(mdir, sizeof mdir, "%s/models/tiny", src ? src : ".");
    snprintf(adir, sizeof adir, "%s/models/tiny-assistant", src ? src : ".");
    g4_model *m = NULL;
    g4_assistant *a = NULL;
    st = g4_model_load_dir(mdir, be, &m);
    if (st == G4_OK) st = g4_assistant_load_dir(adir, be, &a);
    if (st == G4_OK) st = g4_assistant_attach(a, m);
    CHECK(st == G4_OK, "bundled model + drafter: %s", g4_error_message());
    /* <bos> "And God said," */
    g4_tokenizer *tok = NULL;
    if (st == G4_OK) st = g4_tokenizer_load(mdir, &tok);
    int32_t prompt[16] = {m ? m->config.tokens.bos_id : 0}, *ids = NULL;
    size_t n_ids = 0;
    const char *text = "And God said,";
    if (st == G4_OK) st = g4_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n_ids);
    CHECK(st == G4_OK && n_ids > 0 && n_ids < 15, "prompt: %s", g4_error_message());
    if (st == G4_OK && n_ids > 0 && n_ids < 15) {
        memcpy(prompt + 1, ids, n_ids * sizeof *ids);
        check_pair("bundled pair", m, a, prompt, (int)n_ids + 1, n);
    }
    free(ids);
    g4_tokenizer_free(tok);
    g4_assistant_release(a);
    g4_model_release(m);

    g4_backend_destroy(be);
    return test_finish();
}
