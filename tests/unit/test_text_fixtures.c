/* The text decoder against transformers' float64 references: logits at every
 * position (one prefill, and one token at a time through the KV cache), the
 * residual stream at four points, and greedy continuation, for every
 * vendored fixture (dense 31B-like, MoE 26B-like in shards, E2B-like with
 * per-layer embeddings and KV sharing, real head sizes with a wrapping ring,
 * and the MLX-quantised conversions). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_model.h"
#include "model/model.h"
#include "runtime/session.h"
#include "test_util.h"

#define TOLERANCE 1e-4

typedef struct {
    g4_backend *be;
    const fixture_ref *ref;
    const char *fixture;
} hidden_check;

static void check_hidden(void *ctx, const char *name, const float *data, int rows, int dim) {
    hidden_check *hc = ctx;
    char key[64];
    snprintf(key, sizeof key, "text.hidden.%s", name);
    size_t n;
    const float *want = fixture_ref_tensor(hc->ref, key, &n);
    if (!want) return; /* only the four named points are referenced */
    CHECK(n == (size_t)rows * dim, "%s %s: %zu reference values for %d x %d", hc->fixture, key, n, rows, dim);
    if (n != (size_t)rows * dim) return;
    float *got = malloc(n * sizeof *got);
    hc->be->ops->to_host(hc->be, got, data, n * sizeof *got);
    double err = test_rel_rms(got, want, n);
    printf("  %-10s %-22s rel_rms %.2e\n", hc->fixture, key, err);
    CHECK(err < TOLERANCE, "%s %s rel_rms %.3e", hc->fixture, key, err);
    free(got);
}

static void check_fixture(const char *name) {
    fixture_ref ref;
    g4_backend *be;
    g4_model *m;
    g4_status st = g4_backend_cpu_create_with(0, G4_PRECISION_EXACT, &be);
    CHECK(st == G4_OK, "cpu backend: %s", g4_error_message());
    if (st != G4_OK) return;
    if (!fixture_model_open(name, be, &ref, &m)) {
        g4_backend_destroy(be);
        return;
    }
    int n_all, n_prompt, n_greedy;
    int32_t *all = fixture_ref_ids(&ref, "text", "all_ids", &n_all);
    int32_t *prompt = fixture_ref_ids(&ref, "text", "prompt_ids", &n_prompt);
    int32_t *greedy = fixture_ref_ids(&ref, "text", "greedy_ids", &n_greedy);
    size_t n_ref = 0;
    const float *want = fixture_ref_tensor(&ref, "text.logits", &n_ref);
    const int V = m->config.text.vocab_size;
    CHECK(want && n_ref == (size_t)n_all * V, "%s: text.logits has %zu values", name, n_ref);
    float *logits = malloc((size_t)n_all * V * sizeof *logits);

    /* one prefill, with the hidden-state hook */
    g4_session_options opt = {.n_ctx = n_all + 1};
    g4_session *s;
    st = g4_session_create(m, &opt, &s);
    CHECK(st == G4_OK, "%s: session: %s", name, g4_error_message());
    hidden_check hc = {be, &ref, name};
    s->hook = check_hidden;
    s->hook_ctx = &hc;
    st = g4_session_eval(s, all, n_all, NULL, G4_LOGITS_ALL, logits);
    CHECK(st == G4_OK, "%s: prefill: %s", name, g4_error_message());
    double err = test_rel_rms(logits, want, (size_t)n_all * V);
    printf("  %-10s logits (prefill)         rel_rms %.2e\n", name, err);
    CHECK(err < TOLERANCE, "%s prefill logits rel_rms %.3e", name, err);

    /* the same ids one at a time through the KV cache */
    g4_session_reset(s);
    s->hook = NULL;
    memset(logits, 0, (size_t)n_all * V * sizeof *logits);
    for (int t = 0; t < n_all && st == G4_OK; t++)
        st = g4_session_eval(s, all + t, 1, NULL, G4_LOGITS_LAST, logits + (size_t)t * V);
    CHECK(st == G4_OK, "%s: decode: %s", name, g4_error_message());
    err = test_rel_rms(logits, want, (size_t)n_all * V);
    printf("  %-10s logits (decode)          rel_rms %.2e\n", name, err);
    CHECK(err < TOLERANCE, "%s decode logits rel_rms %.3e", name, err);

    /* small prefill chunks: the sliding ring must keep every key a chunk
     * still needs while it wraps */
    g4_session_options small = {.n_ctx = n_all + 1, .chunk = 5};
    g4_session *sc;
    st = g4_session_create(m, &small, &sc);
    if (st == G4_OK) st = g4_session_eval(sc, all, n_all, NULL, G4_LOGITS_ALL, logits);
    CHECK(st == G4_OK, "%s: chunked prefill: %s", name, g4_error_message());
    err = test_rel_rms(logits, want, (size_t)n_all * V);
    printf("  %-10s logits (chunks of 5)     rel_rms %.2e\n", name, err);
    CHECK(err < TOLERANCE, "%s chunked logits rel_rms %.3e", name, err);
    g4_session_destroy(sc);

    /* greedy continuation of the prompt */
    CHECK(test_greedy_matches(s, prompt, n_prompt, greedy, n_greedy, logits, V, name, "transformers"),
          "%s: greedy ids differ from transformers", name);

    g4_session_destroy(s);
    free(logits);
    free(all);
    free(prompt);
    free(greedy);
    g4_model_release(m);
    g4_backend_destroy(be);
    fixture_ref_close(&ref);
}

int main(int argc, char **argv) {
    const char *all[] = {"dense", "moe", "e2b", "realdims", "unified", "dense-mlx8", "moe-mlx4", "moe-mxfp4", "e2b-mlx4"};
    if (argc > 1) {
        for (int i = 1; i < argc; i++) check_fixture(argv[i]);
    } else {
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) check_fixture(all[i]);
    }
    return test_finish();
}
