/* Opening a fixture for a golden test: its references and its model loaded
 * on a backend, with a failed CHECK (and nothing left open) when either
 * cannot be had. */
#ifndef G4_TEST_FIXTURE_MODEL_H
#define G4_TEST_FIXTURE_MODEL_H

#include "fixture_ref.h"
#include "model/model.h"
#include "runtime/session.h"
#include "test_util.h"

/* 1 when both *ref and *m are open (close them with fixture_ref_close and
 * g4_model_release), 0 otherwise. */
static inline int fixture_model_open(const char *name, g4_backend *be, fixture_ref *ref, g4_model **m) {
    *m = NULL;
    const char *dir = test_fixture(name);
    if (fixture_ref_open(dir, ref) != 0) {
        CHECK(0, "cannot open references of %s", name);
        return 0;
    }
    g4_status st = g4_model_load_dir(dir, be, m);
    CHECK(st == G4_OK, "%s: load on %s failed: %s", name, be->ops->name, g4_error_message());
    if (st != G4_OK) {
        fixture_ref_close(ref);
        *m = NULL;
        return 0;
    }
    return 1;
}

/* Index of the largest value (the first of equals). */
static inline int test_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy decoding from the prompt after a session reset: 1 when the ids
 * equal the n_greedy of `greedy` (the first difference is printed, `who`
 * naming the reference), 0 otherwise or on an error. logits: V floats of
 * scratch. */
static inline int test_greedy_matches(g4_session *s, const int32_t *prompt, int n_prompt, const int32_t *greedy,
                                      int n_greedy, float *logits, int V, const char *name, const char *who) {
    g4_session_reset(s);
    g4_status st = g4_session_eval(s, prompt, n_prompt, NULL, G4_LOGITS_LAST, logits);
    for (int i = 0; i < n_greedy && st == G4_OK; i++) {
        int32_t next = test_argmax(logits, V);
        if (next != greedy[i]) {
            fprintf(stderr, "%s: greedy step %d: got %d, %s %d\n", name, i, next, who, greedy[i]);
            return 0;
        }
        st = g4_session_eval(s, &next, 1, NULL, G4_LOGITS_LAST, logits);
    }
    return st == G4_OK;
}

/* Logits [2n][vocab] (malloc'd): of a prefill of all ids, then of a decode
 * of them one by one (a failed check on an error). */
static inline float *test_prefill_decode_logits(g4_model *m, const int32_t *ids, int n) {
    const int V = m->config.text.vocab_size;
    float *logits = malloc((size_t)2 * n * V * sizeof *logits);
    g4_session_options opt = {.n_ctx = n + 1};
    g4_session *s = NULL;
    g4_status st = g4_session_create(m, &opt, &s);
    if (st == G4_OK) st = g4_session_eval(s, ids, n, NULL, G4_LOGITS_ALL, logits);
    if (st == G4_OK) g4_session_reset(s);
    for (int t = 0; t < n && st == G4_OK; t++)
        st = g4_session_eval(s, ids + t, 1, NULL, G4_LOGITS_LAST, logits + (size_t)(n + t) * V);
    CHECK(st == G4_OK, "session: %s", g4_error_message());
    g4_session_destroy(s);
    return logits;
}

#endif
