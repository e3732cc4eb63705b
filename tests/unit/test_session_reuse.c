/* g4_session_reuse, what `gemma4 chat` keeps between turns: the next
 * prompt's logits after resuming from the kept KV cache are the same bits
 * as a fresh session's over the whole prompt (CPU, exact path), and the
 * resume point obeys its three rules: one id is always evaluated, an image
 * is never entered halfway, and nothing is kept whose sliding window the
 * ring no longer holds. The `dense` fixture: window 8, so with a prefill
 * chunk of 16 the ring holds 3 blocks (48 positions). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "runtime/session.h"
#include "test_util.h"

#define CHUNK 16

static g4_session *open_session(const g4_model *m) {
    g4_session_options o = {.n_ctx = 256, .chunk = CHUNK};
    g4_session *s = NULL;
    g4_status st = g4_session_create(m, &o, &s);
    CHECK(st == G4_OK, "session: %s", g4_error_message());
    return s;
}

/* Logits of ids[from..n) in s (which holds ids[0..from) already) against a
 * fresh session's over all of ids: 1 when every bit is equal. */
static int same_as_fresh(const g4_model *m, g4_session *s, const int32_t *ids, int n, int from, const char *what) {
    const int V = m->config.text.vocab_size;
    float *got = malloc((size_t)n * V * sizeof *got), *want = malloc((size_t)n * V * sizeof *want);
    g4_session *fresh = open_session(m);
    g4_status st = got && want && fresh ? G4_OK : G4_ERR_OUT_OF_MEMORY;
    if (st == G4_OK) st = g4_session_eval(s, ids + from, n - from, NULL, G4_LOGITS_ALL, got);
    if (st == G4_OK) st = g4_session_eval(fresh, ids, n, NULL, G4_LOGITS_ALL, want);
    CHECK(st == G4_OK, "%s: eval: %s", what, g4_error_message());
    int same = 0;
    if (st == G4_OK) {
        const size_t rows = (size_t)(n - from) * V;
        same = memcmp(got, want + (size_t)from * V, rows * sizeof *got) == 0;
        CHECK(same, "%s: logits after resuming at %d differ from a fresh prefill (max %g)", what, from,
              test_max_abs_diff(got, want + (size_t)from * V, rows));
    }
    g4_session_destroy(fresh);
    free(got);
    free(want);
    return same;
}

int main(void) {
    g4_backend *be;
    g4_model *m = NULL;
    g4_status st = g4_backend_cpu_create(0, &be);
    if (st == G4_OK) st = g4_model_load_dir(test_fixture("dense"), be, &m);
    CHECK(st == G4_OK, "dense: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    be->ops->set_precision(be, G4_PRECISION_EXACT);
    const int V = m->config.text.vocab_size, image = m->config.tokens.image_id;
    CHECK(m->config.text.sliding_window == 8 && image >= 0 && image < V, "dense: window %d, image id %d",
          m->config.text.sliding_window, image);
    g4_session *s = open_session(m);
    if (!s) return test_finish();
    CHECK(s->kv->ring_blocks * s->kv->block_size == 48, "ring of %d positions, expected 48",
          s->kv->ring_blocks * s->kv->block_size);

    int32_t a[120], b[120];
    for (int i = 0; i < 120; i++) a[i] = (i * 37 + 5) % 900 + 2, b[i] = a[i];
    float *last = malloc((size_t)V * sizeof *last);

    /* a turn, then a prompt that repeats its first 25 ids and goes on otherwise */
    st = g4_session_eval(s, a, 30, NULL, G4_LOGITS_LAST, last);
    CHECK(st == G4_OK, "turn 1: %s", g4_error_message());
    for (int i = 25; i < 40; i++) b[i] = (i * 11 + 3) % 900 + 2;
    int k = g4_session_reuse(s, b, 40);
    CHECK(k == 25 && g4_session_length(s) == 25, "the common prefix of 25 is kept: %d (length %d)", k,
          g4_session_length(s));
    same_as_fresh(m, s, b, 40, k, "diverging prompt");

    /* the same prompt again: its last id is evaluated anew */
    k = g4_session_reuse(s, b, 40);
    CHECK(k == 39, "a repeated prompt resumes before its last id: %d", k);
    same_as_fresh(m, s, b, 40, k, "repeated prompt");

    /* an image run at 10..20: a prompt that differs inside it resumes where the image starts */
    for (int i = 10; i < 20; i++) b[i] = image;
    g4_session_reset(s);
    CHECK(g4_session_reuse(s, b, 40) == 0, "an empty session keeps nothing");
    st = g4_session_eval(s, b, 40, NULL, G4_LOGITS_LAST, last);
    CHECK(st == G4_OK, "image prompt: %s", g4_error_message());
    memcpy(a, b, sizeof a);
    a[15] = (a[15] + 1) % 900 + 2; /* no longer an image token there */
    k = g4_session_reuse(s, a, 40);
    CHECK(k == 10, "a prompt that leaves the image inside it resumes at the image's start: %d", k);
    a[15] = image;
    a[20] = (a[20] + 1) % 900 + 2; /* differs just after the image */
    g4_session_reset(s);
    st = g4_session_eval(s, b, 40, NULL, G4_LOGITS_LAST, last);
    k = st == G4_OK ? g4_session_reuse(s, a, 40) : -1;
    CHECK(k == 20, "a prompt that differs right after the image keeps it: %d", k);

    /* 100 positions held: the ring keeps only 52..99, so a resume at 20 would
     * need a window (13..19) long overwritten, while one at 95 does not */
    for (int i = 0; i < 120; i++) a[i] = (i * 37 + 5) % 900 + 2, b[i] = a[i];
    g4_session_reset(s);
    st = g4_session_eval(s, a, 100, NULL, G4_LOGITS_LAST, last);
    CHECK(st == G4_OK, "100 ids: %s", g4_error_message());
    b[20] = (b[20] + 1) % 900 + 2;
    k = g4_session_reuse(s, b, 110);
    CHECK(k == 0 && g4_session_length(s) == 0, "a resume behind the ring starts over: %d", k);
    same_as_fresh(m, s, b, 110, k, "behind the ring");
    memcpy(b, a, sizeof b);
    g4_session_reset(s);
    st = g4_session_eval(s, a, 100, NULL, G4_LOGITS_LAST, last);
    b[95] = (b[95] + 1) % 900 + 2;
    k = st == G4_OK ? g4_session_reuse(s, b, 110) : -1;
    CHECK(k == 95, "a resume whose window the ring holds keeps 95: %d", k);
    same_as_fresh(m, s, b, 110, k, "inside the ring");

    free(last);
    g4_session_destroy(s);
    g4_model_release(m);
    g4_backend_destroy(be);
    return test_finish();
}
