/* Sampling from the row's largest logits only:
 *  - the CPU top_logits op against a plain sort of (value desc, id asc) and
 *    a long-double log-sum-exp, over sizes 1..262144, odd k, ties, NaN rows;
 *  - g4_sampler_sample_top against g4_sampler_sample on the full row over
 *    many random rows and parameter sets: the same tokens, log-probabilities
 *    (bit for bit) and random stream position, the tie fallback included;
 *  - generation on the `dense` fixture through g4_session_eval_sample equal
 *    to g4_session_eval + g4_sampler_sample. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "support/candidates.h"
#include "test_util.h"

static g4_backend *cpu;

/* ties: 0 none to speak of, 1 values in steps of 0.5 (many equal, -0 and +0 too), 2 most of the row equal */
static void fill_row(float *x, int n, float scale, int ties) {
    for (int i = 0; i < n; i++) {
        float v = (float)((uniform01() * 2 - 1) * scale);
        if (ties == 1) v = roundf(v * 2.0f) / 2.0f;
        if (ties == 2 && next_u64() % 10) v = 3.5f;
        x[i] = v;
    }
}

/* ---- the CPU op against a sort ---- */

static void check_op(int rows, int vocab, int k, int ties, int nan_row) {
    float *x = malloc((size_t)rows * vocab * sizeof *x);
    for (int r = 0; r < rows; r++) fill_row(x + (size_t)r * vocab, vocab, 20.0f, ties);
    if (nan_row >= 0) x[(size_t)nan_row * vocab + vocab / 3] = NAN;
    int32_t *ids = malloc((size_t)rows * k * sizeof *ids);
    float *values = malloc((size_t)rows * k * sizeof *values);
    double *lse = malloc((size_t)rows * sizeof *lse);
    cpu->ops->top_logits(cpu, ids, values, lse, x, rows, vocab, k);
    rank_pair *sorted = malloc((size_t)vocab * sizeof *sorted);
    int bad_order = 0, bad_lse = 0;
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * vocab;
        if (r == nan_row) {
            bad_lse += !isnan(lse[r]);
            continue;
        }
        rank_row(row, vocab, sorted);
        for (int j = 0; j < k; j++) {
            const int32_t want_id = j < vocab ? sorted[j].id : -1;
            const float want_v = j < vocab ? sorted[j].v : -INFINITY;
            bad_order += ids[(size_t)r * k + j] != want_id ||
                         memcmp(&values[(size_t)r * k + j], &want_v, sizeof want_v) != 0;
        }
        long double m = sorted[0].v, z = 0;
        for (int i = 0; i < vocab; i++) z += expl((long double)row[i] - m);
        const double ref = (double)(m + logl(z));
        bad_lse += !(fabs(lse[r] - ref) <= 1e-6 * fabs(ref) + 1e-12);
    }
    CHECK(bad_order == 0, "top_logits %d x %d k=%d ties %d: %d entries differ from the sort", rows, vocab, k, ties,
          bad_order);
    CHECK(bad_lse == 0, "top_logits %d x %d k=%d ties %d: %d rows with a wrong lse", rows, vocab, k, ties, bad_lse);
    free(x), free(ids), free(values), free(lse), free(sorted);
}

static void test_op(void) {
    const int vocabs[] = {1, 2, 7, 100, 1000, 4099, 65537, 262144};
    const int ks[] = {1, 3, 40, 41, 64, 999, 1024};
    for (int v = 0; v < 8; v++)
        for (int k = 0; k < 7; k++) {
            if (vocabs[v] == 262144 && ks[k] != 1 && ks[k] != 41 && ks[k] != 1024) continue; /* the sort is slow */
            check_op(vocabs[v] >= 65537 ? 1 : 3, vocabs[v], ks[k], (v + k) % 3, -1);
        }
    check_op(4, 5000, 40, 1, 2);
    check_op(2, 1000, 1, 0, 0);
    /* an all -inf row: lse -inf, ids in order */
    float x[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t ids[2];
    float values[2];
    double lse;
    cpu->ops->top_logits(cpu, ids, values, &lse, x, 1, 5, 2);
    CHECK(lse == -INFINITY && ids[0] == 0 && ids[1] == 1, "all -inf row: lse %g, ids %d %d", lse, ids[0], ids[1]);
}

/* ---- the sampler from candidates against the full row ---- */

static int decided; /* rows chosen from the candidates alone */

static void check_sampler(const sampler_setup *ps, int vocab, int n_rows, int *fallbacks) {
    g4_sampler_params p;
    sampler_setup_params(ps, 1234, &p);
    g4_sampler *full = NULL, *top = NULL;
    CHECK(g4_sampler_create(vocab, &p, &full) == G4_OK && g4_sampler_create(vocab, &p, &top) == G4_OK,
          "sampler: %s", g4_error_message());
    const int k = g4_sampler_candidates_needed(top);
    CHECK(k > 0, "%s: the predicate refuses a candidates-only parameter set", ps->name);
    float *x = malloc((size_t)vocab * sizeof *x), *values = malloc((size_t)k * sizeof *values);
    int32_t *ids = malloc((size_t)k * sizeof *ids);
    int mismatches = 0, errors = 0;
    for (int r = 0; r < n_rows && k > 0; r++) {
        fill_row(x, vocab, r % 2 ? 4.0f : 15.0f, r % 3);
        double lse;
        cpu->ops->top_logits(cpu, ids, values, &lse, x, 1, vocab, k);
        g4_sample a, b;
        int need_full = 0;
        g4_status sa = g4_sampler_sample(full, x, &a);
        g4_status sb = g4_sampler_sample_top(top, ids, values, k, lse, &b, &need_full);
        if (sb == G4_OK && need_full) {
            (*fallbacks)++;
            sb = g4_sampler_sample(top, x, &b);
        } else {
            decided++;
        }
        errors += sa != G4_OK || sb != G4_OK;
        mismatches += !same_sample(&a, &b);
    }
    CHECK(errors == 0 && mismatches == 0, "%s (vocab %d): %d of %d rows differ, %d errors", ps->name, vocab, mismatches,
          n_rows, errors);
    CHECK(g4_sampler_next_u64(full) == g4_sampler_next_u64(top), "%s: the random streams part", ps->name);
    free(x), free(values), free(ids);
    g4_sampler_free(full);
    g4_sampler_free(top);
}

static void test_sampler(void) {
    const sampler_setup sets[] = {
        {"greedy", 0, 0, 1, 0, 0, 0, G4_LOGPROBS_RAW},
        {"greedy raw top 5", 0, 0, 1, 0, 1, 5, G4_LOGPROBS_RAW},
        {"greedy processed top 20", 0, 40, 0.5f, 0, 1, 20, G4_LOGPROBS_PROCESSED},
        {"T 0.8 top-k 40", 0.8f, 40, 1, 0, 0, 0, G4_LOGPROBS_RAW},
        {"T 1 top-k 64 top-p 0.9 raw top 5", 1.0f, 64, 0.9f, 0, 1, 5, G4_LOGPROBS_RAW},
        {"T 0.7 top-k 50 min-p 0.05 processed top 20", 0.7f, 50, 1, 0.05f, 1, 20, G4_LOGPROBS_PROCESSED},
        {"T 1.5 top-k 1000 top-p 0.95 min-p 0.01 processed top 3", 1.5f, 1000, 0.95f, 0.01f, 1, 3,
         G4_LOGPROBS_PROCESSED},
        {"T 1 top-k 1 raw", 1.0f, 1, 1, 0, 1, 0, G4_LOGPROBS_RAW},
        {"T 0.5 top-k 20 top-logprobs 20", 0.5f, 20, 0.8f, 0, 0, 20, G4_LOGPROBS_RAW},
        {"T 2 top-k 3 processed", 2.0f, 3, 0.7f, 0.2f, 1, 2, G4_LOGPROBS_PROCESSED},
    };
    int fallbacks = 0;
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        check_sampler(&sets[i], 5000, 300, &fallbacks);
        check_sampler(&sets[i], 1100, 100, &fallbacks); /* top-k 1000 + margin reaches the whole row */
    }
    check_sampler(&sets[4], 262144, 10, &fallbacks);
    printf("sampler from candidates: %d rows decided by the candidates, %d by the full row (ties across the top-k "
           "edge)\n", decided, fallbacks);
    CHECK(fallbacks > 0 && decided > 2 * fallbacks, "the candidates path or the tie fallback was hardly exercised");

    /* what the predicate refuses */
    g4_sampler_params p;
    g4_sampler *s;
    const int32_t suppress[1] = {3};
    const g4_logit_bias bias[1] = {{5, 1.0f}};
    for (int c = 0; c < 7; c++) {
        g4_sampler_params_default(&p);
        if (c == 0) p.repetition_penalty = 1.1f;
        if (c == 1) p.presence_penalty = 0.5f;
        if (c == 2) p.frequency_penalty = 0.5f;
        if (c == 3) p.suppress = suppress, p.n_suppress = 1;
        if (c == 4) p.logit_bias = bias, p.n_logit_bias = 1;
        if (c == 5) p.temperature = 1.0f; /* top-k off */
        if (c == 6) p.temperature = 1.0f, p.top_k = 1021; /* 1021 + 4 candidates exceed the op's 1024 */
        CHECK(g4_sampler_create(5000, &p, &s) == G4_OK, "sampler: %s", g4_error_message());
        CHECK(g4_sampler_candidates_needed(s) == 0, "case %d: the predicate should ask for the full row", c);
        g4_sampler_free(s);
    }
    g4_sampler_params_default(&p);
    p.top_logprobs = 7;
    g4_sampler_create(5000, &p, &s);
    CHECK(g4_sampler_candidates_needed(s) == 7, "greedy with 7 top logprobs needs 7 candidates");
    g4_sampler_free(s);
    /* NaN rows are errors as on the full row */
    g4_sampler_params_default(&p);
    g4_sampler_create(10, &p, &s);
    int32_t ids[1] = {0};
    float values[1] = {1.0f};
    g4_sample out;
    int need_full;
    CHECK(g4_sampler_sample_top(s, ids, values, 1, NAN, &out, &need_full) != G4_OK, "NaN lse accepted");
    g4_sampler_free(s);
}

/* ---- generation on a fixture: candidates vs the full row ---- */

static void test_generation(void) {
    g4_model *m = NULL;
    g4_status st = g4_model_load_dir(test_fixture("dense"), cpu, &m);
    CHECK(st == G4_OK, "dense fixture: %s", g4_error_message());
    if (st != G4_OK) return;
    const int V = m->config.text.vocab_size, N = 24;
    const sampler_setup sets[] = {
        {"greedy raw top 5", 0, 0, 1, 0, 1, 5, G4_LOGPROBS_RAW},
        {"T 0.9 top-k 40 top-p 0.9 raw top 5", 0.9f, 40, 0.9f, 0, 1, 5, G4_LOGPROBS_RAW},
        {"T 1.3 top-k 8 min-p 0.02 processed top 3", 1.3f, 8, 1, 0.02f, 1, 3, G4_LOGPROBS_PROCESSED},
    };
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = (i * 53 + 11) % (V - 4) + 2;
    for (size_t c = 0; c < sizeof sets / sizeof sets[0]; c++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = sets[c].temperature;
        p.top_k = sets[c].top_k;
        p.top_p = sets[c].top_p;
        p.min_p = sets[c].min_p;
        p.logprobs = sets[c].logprobs;
        p.top_logprobs = sets[c].top_logprobs;
        p.logprobs_mode = sets[c].mode;
        p.seed = 77 + c;
        g4_session_options opt = {.n_ctx = 64};
        g4_session *sa = NULL, *sb = NULL;
        g4_sampler *pa = NULL, *pb = NULL;
        st = g4_session_create(m, &opt, &sa);
        if (st == G4_OK) st = g4_session_create(m, &opt, &sb);
        if (st == G4_OK) st = g4_sampler_create(V, &p, &pa);
        if (st == G4_OK) st = g4_sampler_create(V, &p, &pb);
        CHECK(st == G4_OK, "setup: %s", g4_error_message());
        CHECK(g4_sampler_candidates_needed(pb) > 0, "%s: the candidates path is not taken", sets[c].name);
        int same = 1, n = 0;
        int32_t ta = 0, tb = 0;
        for (; st == G4_OK && n < N; n++) {
            g4_sample a, b;
            const int32_t *in_a = n ? &ta : prompt, *in_b = n ? &tb : prompt;
            const int len = n ? 1 : 12;
            st = g4_session_eval(sa, in_a, len, NULL, G4_LOGITS_LAST, logits);
            if (st == G4_OK) st = g4_sampler_sample(pa, logits, &a);
            if (st == G4_OK) st = g4_session_eval_sample(sb, in_b, len, NULL, pb, logits, &b);
            if (st != G4_OK) break;
            same &= same_sample(&a, &b);
            ta = a.token, tb = b.token;
            g4_sampler_accept(pa, ta);
            g4_sampler_accept(pb, tb);
        }
        CHECK(st == G4_OK && n == N, "%s: generation failed: %s", sets[c].name, g4_error_message());
        CHECK(same, "%s: generation through candidates differs from the full logits", sets[c].name);
        printf("dense fixture, %s: %d tokens %s\n", sets[c].name, n, same ? "identical" : "DIFFER");
        g4_sampler_free(pa), g4_sampler_free(pb);
        g4_session_destroy(sa), g4_session_destroy(sb);
    }
    free(logits);
    g4_model_release(m);
}

int main(void) {
    rng_state = 0x9E3779B97F4A7C15ull; /* this test's stream (support/test_random.h) */
    g4_status st = g4_backend_cpu_create(0, &cpu);
    CHECK(st == G4_OK, "CPU backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    test_op();
    test_sampler();
    test_generation();
    g4_backend_destroy(cpu);
    return test_finish();
}
