/* The sampler: filters against a brute-force double-precision reference of
 * transformers' warpers (exact kept sets), the drawn distribution against
 * the exact renormalised probabilities, the random stream and draw sequences
 * against tests/tools/sampler_reference.py, penalties and logprobs values,
 * and the stop-string matcher. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <time.h>

#include "base/file.h"
#include "runtime/sampler.h"
#include "runtime/stop_strings.h"
#include "test_util.h"

#define BIG_V 262144

/* ---- helpers ---- */

static uint64_t test_rng = 0x1234567887654321ull;
static double uniform01(void) {
    test_rng ^= test_rng << 13;
    test_rng ^= test_rng >> 7;
    test_rng ^= test_rng << 17;
    return (double)(test_rng >> 11) * 0x1.0p-53;
}
static float normal(void) {
    double u = uniform01(), v = uniform01();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

static const char *data_path(const char *rel) {
    static char buf[1024];
    const char *root = getenv("G4_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/sampler/%s", root ? root : "tests/data", rel);
    return buf;
}

typedef struct {
    double v;
    int32_t id;
} ref_entry;

static int ref_desc(const void *a, const void *b) {
    const ref_entry *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* HF warpers in double with full sorts: kept[i] = probability (0 if removed).
 * *edge gets the smallest relative distance of a top-p decision from its
 * threshold, so callers can tell a knife-edge case from a real mismatch. */
static void ref_kept(const float *logits, size_t v, double t, int top_k, double top_p, double min_p, double *kept,
                     double *edge) {
    ref_entry *e = malloc(v * sizeof *e);
    for (size_t i = 0; i < v; i++) e[i] = (ref_entry){(double)logits[i] / t, (int32_t)i};
    qsort(e, v, sizeof *e, ref_desc);
    size_t n = v; /* kept prefix of e */
    for (size_t i = 0; i < v; i++)
        if (isinf(e[i].v)) {
            n = i;
            break;
        }
    if (top_k > 0 && (size_t)top_k < n) {
        double kth = e[top_k - 1].v;
        size_t m = 0;
        while (m < n && e[m].v >= kth) m++;
        n = m;
    }
    *edge = INFINITY;
    if (top_p < 1.0) {
        double z = 0;
        for (size_t i = 0; i < n; i++) z += exp(e[i].v - e[0].v);
        double above = 0;
        size_t m = 0;
        for (; m < n; m++) {
            double d = fabs(above - top_p * z) / z;
            if (d < *edge) *edge = d;
            if (above >= top_p * z) break;
            above += exp(e[m].v - e[0].v);
        }
        n = m;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!(min_p > 0) || exp(e[i].v - e[0].v) >= min_p) e[m++] = e[i];
    n = m;
    memset(kept, 0, v * sizeof *kept);
    double z = 0;
    for (size_t i = 0; i < n; i++) z += exp(e[i].v - e[0].v);
    for (size_t i = 0; i < n; i++) kept[e[i].id] = exp(e[i].v - e[0].v) / z;
    free(e);
}

static g4_sampler *make(int32_t v, float t, int k, float p, float minp, uint64_t seed) {
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = t;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = minp;
    sp.seed = seed;
    g4_sampler *s = NULL;
    g4_status st = g4_sampler_create(v, &sp, &s);
    CHECK(st == G4_OK, "create: %s", g4_error_message());
    return s;
}

/* Kept set of the sampler == reference kept set, probabilities within 1e-6. */
static int compare_with_reference(const float *logits, size_t v, float t, int k, float p, float minp,
                                  const char *label) {
    g4_sampler *s = make((int32_t)v, t, k, p, minp, 1);
    if (!s) return 0;
    int32_t *ids = malloc(v * sizeof *ids);
    double *probs = malloc(v * sizeof *probs), *ref = malloc(v * sizeof *ref);
    size_t n = 0;
    CHECK(g4_sampler_candidates(s, logits, ids, probs, &n) == G4_OK, "%s: %s", label, g4_error_message());
    double edge;
    ref_kept(logits, v, t, k, p, minp, ref, &edge);
    size_t n_ref = 0;
    for (size_t i = 0; i < v; i++) n_ref += ref[i] > 0;
    int same = n == n_ref;
    double max_err = 0;
    for (size_t i = 0; i < n && same; i++) {
        same = ref[ids[i]] > 0 && (i == 0 || ids[i] > ids[i - 1]);
        double err = fabs(probs[i] - ref[ids[i]]);
        if (err > max_err) max_err = err;
    }
    if (!same && edge < 1e-6) {
        printf("  %s: knife-edge top-p decision (%.1e from threshold), set comparison skipped\n", label, edge);
        same = 1;
    }
    CHECK(same, "%s: kept %zu tokens, reference %zu (edge %.2e)", label, n, n_ref, edge);
    CHECK(max_err < 1e-6, "%s: probability error %.3g", label, max_err);
    free(ids);
    free(probs);
    free(ref);
    g4_sampler_free(s);
    return (int)n;
}

/* ---- filters ---- */

static void test_hand_computed(void) {
    int32_t ids[8];
    double probs[8];
    size_t n;
    /* probabilities .5 .3 .2 */
    float l3[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    struct {
        int k;
        float p, minp;
        size_t want_n;
        int32_t want[3];
    } c[] = {
        {2, 1.0f, 0, 2, {0, 1}},    {1, 1.0f, 0, 1, {0}},       {0, 0.45f, 0, 1, {0}},
        {0, 0.79f, 0, 2, {0, 1}},   {0, 0.81f, 0, 3, {0, 1, 2}}, {0, 1.0f, 0.5f, 2, {0, 1}},
        {0, 1.0f, 0.61f, 1, {0}},   {0, 0.81f, 0.39f, 3, {0, 1, 2}},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        g4_sampler *s = make(3, 1.0f, c[i].k, c[i].p, c[i].minp, 0);
        CHECK(g4_sampler_candidates(s, l3, ids, probs, &n) == G4_OK, "%s", g4_error_message());
        int ok = n == c[i].want_n;
        for (size_t j = 0; ok && j < n; j++) ok = ids[j] == c[i].want[j];
        CHECK(ok, "hand case %zu (k=%d p=%g min_p=%g): kept %zu", i, c[i].k, c[i].p, c[i].minp, n);
        g4_sampler_free(s);
    }
    /* top-k keeps ties at the k-th value (HF: remove only scores < k-th) */
    float tie[4] = {1, 2, 2, 0};
    g4_sampler *s = make(4, 1.0f, 1, 1.0f, 0, 0);
    CHECK(g4_sampler_candidates(s, tie, ids, probs, &n) == G4_OK && n == 2 && ids[0] == 1 && ids[1] == 2 &&
              fabs(probs[0] - 0.5) < 1e-12,
          "top-k ties: n=%zu", n);
    g4_sampler_free(s);
    /* top-p sees the distribution renormalised by top-k: .4 .3 .2 .1, k=2 -> .571 .429; p=.55 keeps one */
    float l4[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    s = make(4, 1.0f, 2, 0.55f, 0, 0);
    CHECK(g4_sampler_candidates(s, l4, ids, probs, &n) == G4_OK && n == 1 && ids[0] == 0, "top-k then top-p: n=%zu",
          n);
    g4_sampler_free(s);
    /* without top-k the same p keeps two (.4 above the second is < .55) */
    s = make(4, 1.0f, 0, 0.55f, 0, 0);
    CHECK(g4_sampler_candidates(s, l4, ids, probs, &n) == G4_OK && n == 2, "top-p alone: n=%zu", n);
    g4_sampler_free(s);
    /* temperature sharpens before top-p: T=0.5 squares the ratios: .4^2:.3^2:... -> p(.4)=.5333 */
    s = make(4, 0.5f, 0, 0.5f, 0, 0);
    CHECK(g4_sampler_candidates(s, l4, ids, probs, &n) == G4_OK && n == 1 && ids[0] == 0, "temperature first: n=%zu",
          n);
    g4_sampler_free(s);
    /* equal values at the top-p edge: ordered by id */
    float flat[4] = {0, 0, 0, 0};
    s = make(4, 1.0f, 0, 0.5f, 0, 0);
    CHECK(g4_sampler_candidates(s, flat, ids, probs, &n) == G4_OK && n == 2 && ids[0] == 0 && ids[1] == 1,
          "top-p ties by id: n=%zu", n);
    g4_sampler_free(s);
}

static void test_against_reference(void) {
    static const size_t sizes[] = {7, 1000, BIG_V};
    static const float temps[] = {0.5f, 1.0f, 1.7f};
    static const int ks[] = {0, 1, 5, 64, 700};
    static const float ps[] = {1.0f, 0.95f, 0.6f, 0.2f};
    static const float minps[] = {0.0f, 0.05f, 0.3f};
    int n_cases = 0;
    for (size_t si = 0; si < 3; si++) {
        size_t v = sizes[si];
        float *logits = malloc(v * sizeof *logits);
        for (size_t i = 0; i < v; i++) logits[i] = 3.0f * normal();
        if (v > 100) logits[v / 3] = logits[v / 3 + 1]; /* a tie somewhere */
        for (size_t a = 0; a < 3; a++)
            for (size_t b = 0; b < 5; b++)
                for (size_t c = 0; c < 4; c++)
                    for (size_t d = 0; d < 3; d++) {
                        if (v == BIG_V && (a != 1 || d == 2)) continue; /* keep the big ones short */
                        char label[128];
                        snprintf(label, sizeof label, "V=%zu T=%g k=%d p=%g min_p=%g", v, temps[a], ks[b], ps[c],
                                 minps[d]);
                        compare_with_reference(logits, v, temps[a], ks[b], ps[c], minps[d], label);
                        n_cases++;
                    }
        free(logits);
    }
    /* the histogram path of top-p (more than 4096 candidates): a flat-ish big distribution */
    float *logits = malloc(BIG_V * sizeof *logits);
    for (size_t i = 0; i < BIG_V; i++) logits[i] = 0.05f * normal();
    int kept = compare_with_reference(logits, BIG_V, 1.0f, 0, 0.5f, 0, "flat V=262144 p=0.5");
    CHECK(kept > 4096, "histogram path not exercised (%d kept)", kept);
    for (size_t i = 0; i < BIG_V; i++) logits[i] = 0.0f;
    kept = compare_with_reference(logits, BIG_V, 1.0f, 0, 0.5f, 0, "all equal V=262144 p=0.5");
    CHECK(kept == BIG_V / 2, "all-equal top-p keeps the lower half by id (%d)", kept);
    for (size_t i = 0; i < BIG_V; i++) logits[i] = (float)(i % 97) * 0.01f; /* many exact ties */
    compare_with_reference(logits, BIG_V, 0.8f, 0, 0.9f, 0.0f, "tied plateaus V=262144 p=0.9");
    compare_with_reference(logits, BIG_V, 0.8f, 3000, 0.9f, 0.5f, "tied plateaus V=262144 k=3000 p=0.9 min_p=.5");
    free(logits);
    printf("filters: %d parameter sets compared with the brute-force reference\n", n_cases + 4);
}

/* ---- distribution ---- */

static void test_distribution(void) {
    float logits[10];
    for (int i = 0; i < 10; i++) logits[i] = 1.5f * normal();
    const float t = 0.8f, p = 0.97f, minp = 0.01f;
    const int k = 8;
    double ref[10], edge;
    ref_kept(logits, 10, t, k, p, minp, ref, &edge);
    g4_sampler *s = make(10, t, k, p, minp, 777);
    const int draws = 200000;
    long count[10] = {0};
    for (int i = 0; i < draws; i++) {
        g4_sample out;
        CHECK(g4_sampler_sample(s, logits, &out) == G4_OK, "%s", g4_error_message());
        count[out.token]++;
    }
    g4_sampler_free(s);
    double chi2 = 0, worst_z = 0;
    int dof = -1;
    for (int i = 0; i < 10; i++) {
        if (ref[i] == 0) {
            CHECK(count[i] == 0, "token %d is filtered out but was drawn %ld times", i, count[i]);
            continue;
        }
        double e = ref[i] * draws, d = count[i] - e;
        chi2 += d * d / e;
        double z = fabs(d) / sqrt(draws * ref[i] * (1 - ref[i]) + 1e-300);
        if (z > worst_z) worst_z = z;
        dof++;
    }
    /* chi-square: 1e-6 tail for <= 9 degrees of freedom is below 45; per-token z < 5.3 (1e-7 two-sided) */
    printf("distribution: %d draws over %d kept tokens: chi2 %.2f (dof %d), worst |z| %.2f\n", draws, dof + 1, chi2,
           dof, worst_z);
    CHECK(dof >= 3, "too few kept tokens (%d) for a meaningful test", dof + 1);
    CHECK(chi2 < 45.0, "chi-square %.2f too large", chi2);
    CHECK(worst_z < 5.3, "a token frequency is %.2f sigma off", worst_z);
}

/* ---- reproducibility and the reference stream ---- */

static void test_reference_stream(void) {
    char *text;
    size_t len;
    CHECK(g4_read_file(data_path("reference.json"), 1 << 20, &text, &len) == G4_OK, "%s", g4_error_message());
    cJSON *doc = cJSON_ParseWithLength(text, len);
    free(text);
    CHECK(doc != NULL, "reference.json");
    if (!doc) return;
    const cJSON *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(doc, "streams")) {
        uint64_t seed = strtoull(cJSON_GetObjectItem(st, "seed")->valuestring, NULL, 10);
        g4_sampler *s = make(4, 1.0f, 0, 1.0f, 0, seed);
        const cJSON *u;
        int i = 0;
        cJSON_ArrayForEach(u, cJSON_GetObjectItem(st, "u64")) {
            uint64_t want = strtoull(u->valuestring, NULL, 10), got = g4_sampler_next_u64(s);
            CHECK(got == want, "seed %llu output %d: %llu vs %llu", (unsigned long long)seed, i,
                  (unsigned long long)got, (unsigned long long)want);
            i++;
        }
        cJSON_ArrayForEach(u, cJSON_GetObjectItem(st, "doubles")) {
            double got = g4_sampler_next_double(s);
            CHECK(got == u->valuedouble, "seed %llu double: %.17g vs %.17g", (unsigned long long)seed, got,
                  u->valuedouble);
        }
        g4_sampler_free(s);
    }
    const cJSON *jl = cJSON_GetObjectItem(doc, "logits");
    float logits[12];
    int v = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, jl) logits[v++] = (float)x->valuedouble;
    const cJSON *dr;
    int n_draws = 0;
    cJSON_ArrayForEach(dr, cJSON_GetObjectItem(doc, "draws")) {
        const cJSON *p = cJSON_GetObjectItem(dr, "params");
        g4_sampler *s = make(v, (float)cJSON_GetObjectItem(p, "temperature")->valuedouble,
                             cJSON_GetObjectItem(p, "top_k")->valueint,
                             (float)cJSON_GetObjectItem(p, "top_p")->valuedouble,
                             (float)cJSON_GetObjectItem(p, "min_p")->valuedouble,
                             (uint64_t)cJSON_GetObjectItem(dr, "seed")->valuedouble);
        int32_t ids[12];
        double probs[12];
        size_t n;
        CHECK(g4_sampler_candidates(s, logits, ids, probs, &n) == G4_OK, "%s", g4_error_message());
        const cJSON *kept = cJSON_GetObjectItem(dr, "kept");
        CHECK((int)n == cJSON_GetArraySize(kept), "draw set %d: %zu kept vs %d", n_draws, n, cJSON_GetArraySize(kept));
        for (size_t i = 0; i < n; i++) {
            char key[16];
            snprintf(key, sizeof key, "%d", ids[i]);
            const cJSON *want = cJSON_GetObjectItem(kept, key);
            CHECK(want && fabs(want->valuedouble - probs[i]) < 1e-6, "draw set %d token %d", n_draws, ids[i]);
        }
        const cJSON *tok;
        int step = 0, mismatches = 0;
        cJSON_ArrayForEach(tok, cJSON_GetObjectItem(dr, "tokens")) {
            g4_sample out;
            CHECK(g4_sampler_sample(s, logits, &out) == G4_OK, "%s", g4_error_message());
            mismatches += out.token != tok->valueint;
            step++;
        }
        CHECK(mismatches == 0, "draw set %d: %d of %d tokens differ from the reference sequence", n_draws, mismatches,
              step);
        g4_sampler_free(s);
        n_draws++;
    }
    printf("reference: random streams and %d draw sequences match tests/tools/sampler_reference.py\n", n_draws);
    cJSON_Delete(doc);
}

static void test_reproducible(void) {
    float *logits = malloc(BIG_V * sizeof *logits);
    for (size_t i = 0; i < BIG_V; i++) logits[i] = 2.0f * normal();
    g4_sampler *a = make(BIG_V, 1.0f, 64, 0.95f, 0, 99), *b = make(BIG_V, 1.0f, 64, 0.95f, 0, 99),
               *c = make(BIG_V, 1.0f, 64, 0.95f, 0, 100);
    int32_t first[200];
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 200; i++) {
        g4_sample x, y, z;
        g4_sampler_sample(a, logits, &x);
        g4_sampler_sample(b, logits, &y);
        g4_sampler_sample(c, logits, &z);
        first[i] = x.token;
        same_ab &= x.token == y.token;
        same_ac &= x.token == z.token;
    }
    CHECK(same_ab, "same seed, different tokens");
    CHECK(!same_ac, "different seeds gave the same 200 tokens");
    g4_sampler_reset(a, 99);
    int same_again = 1;
    for (int i = 0; i < 200; i++) {
        g4_sample x;
        g4_sampler_sample(a, logits, &x);
        same_again &= x.token == first[i];
    }
    CHECK(same_again, "reset(seed) does not replay the stream");
    g4_sampler_free(a);
    g4_sampler_free(b);
    g4_sampler_free(c);
    free(logits);
}

/* ---- greedy, penalties, logprobs ---- */

static void test_greedy(void) {
    float l[6] = {1, 5, 3, 5, -2, 5};
    g4_sampler *s = make(6, 0.0f, 0, 1.0f, 0, 0);
    g4_sample out;
    CHECK(g4_sampler_sample(s, l, &out) == G4_OK && out.token == 1, "greedy ties -> lowest id (got %d)", out.token);
    g4_sampler_free(s);
    float *big = malloc(BIG_V * sizeof *big);
    for (size_t i = 0; i < BIG_V; i++) big[i] = normal();
    size_t best = 0;
    for (size_t i = 1; i < BIG_V; i++)
        if (big[i] > big[best]) best = i;
    s = make(BIG_V, 0.0f, 40, 0.5f, 0.1f, 0); /* filters do not matter for greedy */
    CHECK(g4_sampler_sample(s, big, &out) == G4_OK && out.token == (int32_t)best, "greedy = argmax (%d vs %zu)",
          out.token, best);
    g4_sampler_free(s);
    /* top_k = 1 sampling is greedy too */
    s = make(BIG_V, 1.0f, 1, 1.0f, 0, 5);
    CHECK(g4_sampler_sample(s, big, &out) == G4_OK && out.token == (int32_t)best, "top_k=1");
    g4_sampler_free(s);
    free(big);
}

static void test_penalties(void) {
    /* logits, prompt [0 1], generated [2 2 4], bias token0 +1 and token3 +1, suppress 1 */
    float l[5] = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
    g4_logit_bias bias[2] = {{0, 1.0f}, {3, 1.0f}};
    int32_t suppress[1] = {1};
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 1.0f;
    sp.repetition_penalty = 2.0f;
    sp.presence_penalty = 0.1f;
    sp.frequency_penalty = 0.2f;
    sp.logit_bias = bias;
    sp.n_logit_bias = 2;
    sp.suppress = suppress;
    sp.n_suppress = 1;
    sp.logprobs = 1;
    sp.logprobs_mode = G4_LOGPROBS_PROCESSED;
    g4_sampler *s = NULL;
    CHECK(g4_sampler_create(5, &sp, &s) == G4_OK, "%s", g4_error_message());
    int32_t prompt[2] = {0, 1};
    g4_sampler_add_prompt(s, prompt, 2);
    g4_sampler_accept(s, 2);
    g4_sampler_accept(s, 2);
    g4_sampler_accept(s, 4);
    /* bias first: token0 (2+1)/2 = 1.5 (repetition first would give 2/2+1 = 2);
     * token1 suppressed; token2 1/2 - 0.1 - 2*0.2 = 0; token3 0.5+1 = 1.5 (unseen);
     * token4 3/2 - 0.1 - 0.2 = 1.2 */
    double want_x[5] = {1.5, -INFINITY, 0.0, 1.5, 1.2};
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp(want_x[i]);
    int32_t ids[5];
    double probs[5];
    size_t n;
    CHECK(g4_sampler_candidates(s, l, ids, probs, &n) == G4_OK && n == 4, "penalised set n=%zu", n);
    for (size_t i = 0; i < n; i++)
        CHECK(fabs(probs[i] - exp(want_x[ids[i]]) / z) < 1e-6, "penalised prob of token %d: %.7f vs %.7f", ids[i],
              probs[i], exp(want_x[ids[i]]) / z);
    g4_sample out;
    CHECK(g4_sampler_sample(s, l, &out) == G4_OK && out.token != 1, "suppressed token drawn");
    CHECK(fabs(out.logprob - (want_x[out.token] - log(z))) < 1e-5, "processed logprob %.6f vs %.6f", out.logprob,
          want_x[out.token] - log(z));
    g4_sampler_free(s);
    /* the penalty is applied once per distinct token however often it occurs (HF gather/scatter) */
    g4_sampler_params_default(&sp);
    sp.repetition_penalty = 1.5f;
    sp.temperature = 1.0f;
    CHECK(g4_sampler_create(3, &sp, &s) == G4_OK, "%s", g4_error_message());
    int32_t rep[4] = {1, 1, 1, 2};
    g4_sampler_add_prompt(s, rep, 4);
    float l3[3] = {0.0f, 3.0f, -3.0f};
    CHECK(g4_sampler_candidates(s, l3, ids, probs, &n) == G4_OK && n == 3, "rep set");
    double x3[3] = {0.0, 2.0, -4.5};
    double z3 = exp(x3[0]) + exp(x3[1]) + exp(x3[2]);
    for (size_t i = 0; i < n; i++) CHECK(fabs(probs[i] - exp(x3[ids[i]]) / z3) < 1e-6, "rep prob token %d", ids[i]);
    g4_sampler_free(s);
}

static void test_logprobs(void) {
    float *l = malloc(BIG_V * sizeof *l);
    for (size_t i = 0; i < BIG_V; i++) l[i] = 4.0f * normal();
    l[12345] = l[54321] = 20.0f; /* a tie at the top: ordered by id */
    double m = -INFINITY, z = 0;
    for (size_t i = 0; i < BIG_V; i++) m = l[i] > m ? l[i] : m;
    for (size_t i = 0; i < BIG_V; i++) z += exp((double)l[i] - m);
    double lse = m + log(z);
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 1.0f;
    sp.top_k = 64;
    sp.top_p = 0.95f;
    sp.logprobs = 1;
    sp.top_logprobs = 20;
    sp.repetition_penalty = 1.3f; /* raw logprobs ignore processing */
    sp.seed = 3;
    g4_sampler *s = NULL;
    CHECK(g4_sampler_create(BIG_V, &sp, &s) == G4_OK, "%s", g4_error_message());
    int32_t prompt[2] = {12345, 7};
    g4_sampler_add_prompt(s, prompt, 2);
    g4_sample out;
    CHECK(g4_sampler_sample(s, l, &out) == G4_OK, "%s", g4_error_message());
    double err = fabs(out.logprob - ((double)l[out.token] - lse));
    /* reference top 20 by a full sort */
    ref_entry *e = malloc(BIG_V * sizeof *e);
    for (size_t i = 0; i < BIG_V; i++) e[i] = (ref_entry){l[i], (int32_t)i};
    qsort(e, BIG_V, sizeof *e, ref_desc);
    CHECK(out.n_top == 20, "n_top %d", out.n_top);
    for (int i = 0; i < out.n_top; i++) {
        CHECK(out.top[i].id == e[i].id, "top %d: id %d vs %d", i, out.top[i].id, e[i].id);
        double d = fabs(out.top[i].logprob - (e[i].v - lse));
        if (d > err) err = d;
    }
    CHECK(out.top[0].id == 12345 && out.top[1].id == 54321, "tie order in top logprobs");
    printf("logprobs: raw log-softmax over %d tokens, max error %.2e vs double\n", BIG_V, err);
    CHECK(err < 2e-5, "raw logprob error %.3g", err);
    g4_sampler_free(s);
    /* processed: the distribution drawn from (T = 0.7, top-k 64) */
    sp.repetition_penalty = 1.0f;
    sp.temperature = 0.7f;
    sp.top_p = 1.0f;
    sp.logprobs_mode = G4_LOGPROBS_PROCESSED;
    CHECK(g4_sampler_create(BIG_V, &sp, &s) == G4_OK, "%s", g4_error_message());
    CHECK(g4_sampler_sample(s, l, &out) == G4_OK, "%s", g4_error_message());
    double zk = 0;
    for (int i = 0; i < 64; i++) zk += exp((e[i].v - e[0].v) / 0.7);
    double lzk = e[0].v / 0.7 + log(zk);
    err = fabs(out.logprob - (l[out.token] / 0.7 - lzk));
    for (int i = 0; i < out.n_top; i++) {
        CHECK(out.top[i].id == e[i].id, "processed top %d", i);
        double d = fabs(out.top[i].logprob - (e[i].v / 0.7 - lzk));
        if (d > err) err = d;
    }
    CHECK(err < 2e-5, "processed logprob error %.3g", err);
    g4_sampler_free(s);
    /* greedy raw logprobs */
    g4_sampler_params_default(&sp);
    sp.logprobs = 1;
    sp.top_logprobs = 3;
    CHECK(g4_sampler_create(BIG_V, &sp, &s) == G4_OK, "%s", g4_error_message());
    CHECK(g4_sampler_sample(s, l, &out) == G4_OK && out.token == 12345 && out.n_top == 3 &&
              fabs(out.logprob - (20.0 - lse)) < 2e-5,
          "greedy logprob %d %.6f vs %.6f", out.token, out.logprob, 20.0 - lse);
    g4_sampler_free(s);
    free(e);
    free(l);
}

static void test_errors_and_config(void) {
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    g4_sampler *s = NULL;
    sp.top_p = 0.0f;
    CHECK(g4_sampler_create(10, &sp, &s) == G4_ERR_INVALID_ARGUMENT, "top_p 0");
    g4_sampler_params_default(&sp);
    sp.top_logprobs = 21;
    CHECK(g4_sampler_create(10, &sp, &s) == G4_ERR_INVALID_ARGUMENT, "top_logprobs 21");
    g4_sampler_params_default(&sp);
    int32_t bad = 10;
    sp.suppress = &bad;
    sp.n_suppress = 1;
    CHECK(g4_sampler_create(10, &sp, &s) == G4_ERR_INVALID_ARGUMENT, "suppress out of range");
    g4_sampler_params_default(&sp);
    int32_t all[3] = {0, 1, 2};
    sp.suppress = all;
    sp.n_suppress = 3;
    sp.temperature = 1.0f;
    CHECK(g4_sampler_create(3, &sp, &s) == G4_OK, "%s", g4_error_message());
    float l[3] = {1, 2, 3};
    g4_sample out;
    CHECK(g4_sampler_sample(s, l, &out) == G4_ERR_INVALID_ARGUMENT, "all suppressed must fail");
    g4_sampler_free(s);
    s = make(3, 1.0f, 0, 1.0f, 0, 0);
    float nan_l[3] = {1, NAN, 3};
    CHECK(g4_sampler_sample(s, nan_l, &out) == G4_ERR_INVALID_ARGUMENT, "NaN logits must fail");
    CHECK(g4_sampler_accept(s, 3) == G4_ERR_INVALID_ARGUMENT, "accept out of range");
    g4_sampler_free(s);
    /* generation_config.json of the hub models (vendored copies) */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", data_path("12b"));
    g4_generation_config gc;
    CHECK(g4_generation_config_load(dir, &gc) == G4_OK, "%s", g4_error_message());
    g4_sampler_params_from_generation_config(&sp, &gc);
    CHECK(sp.temperature == 1.0f && sp.top_k == 64 && fabsf(sp.top_p - 0.95f) < 1e-7f && sp.n_suppress == 2 &&
              sp.suppress[0] == 258883 && sp.suppress[1] == 258882,
          "12B generation config: T %g k %d p %g suppress %zu", sp.temperature, sp.top_k, sp.top_p, sp.n_suppress);
    CHECK(g4_sampler_create(BIG_V, &sp, &s) == G4_OK, "%s", g4_error_message());
    float *big = calloc(BIG_V, sizeof *big);
    big[258883] = 100.0f; /* suppressed: must never come out */
    big[17] = 1.0f;
    int hit = 0;
    for (int i = 0; i < 50; i++) {
        g4_sampler_sample(s, big, &out);
        hit |= out.token == 258883;
    }
    CHECK(!hit, "a suppress_tokens id was drawn");
    g4_sampler_free(s);
    free(big);
    snprintf(dir, sizeof dir, "%s", data_path("e2b"));
    CHECK(g4_generation_config_load(dir, &gc) == G4_OK && gc.n_suppress == 0 && gc.n_eos == 3 && gc.eos_ids[2] == 50,
          "E2B generation config");
}

/* ---- speed (printed, not asserted) ---- */

static void bench(void) {
    float *l = malloc(BIG_V * sizeof *l);
    for (size_t i = 0; i < BIG_V; i++) l[i] = 3.0f * normal();
    struct {
        const char *name;
        float t;
        int k;
        float p, minp;
        int logprobs;
    } cfg[] = {{"greedy", 0, 0, 1, 0, 0},
               {"T=1 k=64 p=0.95 (Gemma default)", 1, 64, 0.95f, 0, 0},
               {"T=1 k=64 p=0.95 + raw logprobs top 5", 1, 64, 0.95f, 0, 1},
               {"T=1 p=0.95 (no top-k)", 1, 0, 0.95f, 0, 0},
               {"T=1 min_p=0.05 (no top-k)", 1, 0, 1, 0.05f, 0},
               {"T=1 no filters", 1, 0, 1, 0, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        g4_sampler_params sp;
        g4_sampler_params_default(&sp);
        sp.temperature = cfg[c].t;
        sp.top_k = cfg[c].k;
        sp.top_p = cfg[c].p;
        sp.min_p = cfg[c].minp;
        sp.logprobs = cfg[c].logprobs;
        sp.top_logprobs = cfg[c].logprobs ? 5 : 0;
        g4_sampler *s = NULL;
        g4_sampler_create(BIG_V, &sp, &s);
        g4_sample out;
        int reps = 40;
        struct timespec a, b; /* CPU time: the test machines are shared */
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
        for (int i = 0; i < reps; i++) g4_sampler_sample(s, l, &out);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
        double us = ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9) / reps * 1e6;
        printf("speed: V=%d %-40s %8.1f us/token (CPU time)\n", BIG_V, cfg[c].name, us);
        g4_sampler_free(s);
    }
    free(l);
}

/* ---- stop strings ---- */

/* Earliest-ending match over the whole text, by brute force. */
static void ref_stop(const char *text, const char *const *stops, int n, int *which, size_t *at) {
    size_t len = strlen(text);
    *which = -1;
    *at = len;
    for (size_t end = 1; end <= len && *which < 0; end++)
        for (size_t start = 0; start < end && *which < 0; start++)
            for (int i = 0; i < n; i++)
                if (strlen(stops[i]) == end - start && !memcmp(text + start, stops[i], end - start)) {
                    *which = i;
                    *at = start;
                    break;
                }
}

static void run_chunks(g4_stop_matcher *m, const char *text, const size_t *cuts, int n_cuts, char *emitted,
                       int *which, size_t *at, int *utf8_ok) {
    size_t len = strlen(text), pos = 0, out = 0;
    *which = -1;
    *utf8_ok = 1;
    g4_stop_matcher_reset(m);
    for (int c = 0; c <= n_cuts; c++) {
        size_t end = c < n_cuts ? cuts[c] : len;
        g4_stop_result r;
        CHECK(g4_stop_matcher_feed(m, text + pos, end - pos, &r) == G4_OK, "%s", g4_error_message());
        if (r.emit_len && ((unsigned char)r.emit[0] & 0xC0) == 0x80) *utf8_ok = 0;
        memcpy(emitted + out, r.emit, r.emit_len);
        out += r.emit_len;
        pos = end;
        if (r.stopped) {
            *which = r.stop_index;
            *at = r.stop_offset;
            break;
        }
    }
    if (*which < 0) {
        g4_stop_result r;
        g4_stop_matcher_flush(m, &r);
        memcpy(emitted + out, r.emit, r.emit_len);
        out += r.emit_len;
        *at = len;
    }
    emitted[out] = 0;
}

static void test_stop_strings(void) {
    const char *stops[] = {"</s>", "STOP", "ab", "aab", "é!", "\n\nUser:"};
    const int n_stops = 6;
    g4_stop_matcher *m = NULL;
    CHECK(g4_stop_matcher_create(stops, n_stops, &m) == G4_OK, "%s", g4_error_message());
    /* split across chunks */
    g4_stop_result r;
    CHECK(g4_stop_matcher_feed(m, "hello </", 8, &r) == G4_OK && r.emit_len == 6 && !memcmp(r.emit, "hello ", 6) &&
              !r.stopped,
          "held prefix: '%.*s'", (int)r.emit_len, r.emit);
    CHECK(g4_stop_matcher_feed(m, "s> tail", 7, &r) == G4_OK && r.stopped && r.stop_index == 0 && r.emit_len == 0 &&
              r.stop_offset == 6,
          "split match: stopped %d index %d offset %zu", r.stopped, r.stop_index, r.stop_offset);
    CHECK(g4_stop_matcher_feed(m, "x", 1, &r) == G4_ERR_INVALID_ARGUMENT, "feed after stop");
    /* a held prefix that does not complete is released */
    g4_stop_matcher_reset(m);
    CHECK(g4_stop_matcher_feed(m, "x</", 3, &r) == G4_OK && r.emit_len == 1, "hold '</'");
    CHECK(g4_stop_matcher_feed(m, "b>", 2, &r) == G4_OK && r.emit_len == 4 && !memcmp(r.emit, "</b>", 4),
          "release: '%.*s'", (int)r.emit_len, r.emit);
    /* an unfinished UTF-8 character is held back, then a multi-byte stop string */
    g4_stop_matcher_reset(m);
    const char *cafe = "caf\xc3\xa9!";
    CHECK(g4_stop_matcher_feed(m, cafe, 4, &r) == G4_OK && r.emit_len == 3, "partial é held (%zu)", r.emit_len);
    CHECK(g4_stop_matcher_feed(m, cafe + 4, 1, &r) == G4_OK && r.emit_len == 0 && !r.stopped, "é is a stop prefix");
    CHECK(g4_stop_matcher_feed(m, cafe + 5, 1, &r) == G4_OK && r.stopped && r.stop_index == 4 && r.stop_offset == 3,
          "é! matched at %zu", r.stop_offset);
    /* no stop strings: only unfinished UTF-8 is held; flush releases it */
    g4_stop_matcher *none = NULL;
    CHECK(g4_stop_matcher_create(NULL, 0, &none) == G4_OK, "no stops");
    CHECK(g4_stop_matcher_feed(none, "\xe2\x82", 2, &r) == G4_OK && r.emit_len == 0, "partial € held");
    CHECK(g4_stop_matcher_feed(none, "\xac", 1, &r) == G4_OK && r.emit_len == 3, "€ released");
    CHECK(g4_stop_matcher_feed(none, "a\xe2", 2, &r) == G4_OK && r.emit_len == 1 &&
              g4_stop_matcher_flush(none, &r) == G4_OK && r.emit_len == 1,
          "flush releases the tail");
    g4_stop_matcher_free(none);
    const char *empty[] = {""};
    CHECK(g4_stop_matcher_create(empty, 1, &none) == G4_ERR_INVALID_ARGUMENT, "empty stop string");
    /* chunk independence on random texts and random cuts vs the brute force */
    static const char *pieces[] = {"a", "b", "aa", "</", "s>", "S", "TOP", "\xc3", "\xa9", "!", "\n", "User:", "x",
                                   "é", "STO"};
    int n_runs = 0;
    for (int t = 0; t < 400; t++) {
        char text[512] = "";
        int n_pieces = 1 + (int)(uniform01() * 40);
        for (int i = 0; i < n_pieces; i++) strcat(text, pieces[(int)(uniform01() * 15)]);
        int want_which;
        size_t want_at;
        ref_stop(text, stops, n_stops, &want_which, &want_at);
        for (int rep = 0; rep < 5; rep++) {
            size_t len = strlen(text), cuts[64];
            int n_cuts = 0;
            for (size_t i = 1; i < len && n_cuts < 64; i++)
                if (uniform01() < (rep == 0 ? 1.0 : 0.3)) cuts[n_cuts++] = i; /* rep 0: byte by byte */
            char emitted[512];
            int which, utf8_ok;
            size_t at;
            run_chunks(m, text, cuts, n_cuts, emitted, &which, &at, &utf8_ok);
            CHECK(which == want_which && at == want_at, "text '%s': stop %d at %zu, reference %d at %zu", text, which,
                  at, want_which, want_at);
            CHECK(strlen(emitted) == want_at && !memcmp(emitted, text, want_at), "emitted text differs for '%s'",
                  text);
            n_runs++;
        }
    }
    printf("stop strings: %d chunked runs agree with the whole-text brute force\n", n_runs);
    g4_stop_matcher_free(m);
}

int main(void) {
    test_hand_computed();
    test_against_reference();
    test_distribution();
    test_reference_stream();
    test_reproducible();
    test_greedy();
    test_penalties();
    test_logprobs();
    test_errors_and_config();
    test_stop_strings();
    bench();
    return test_finish();
}
