/* The batched engine: 16 concurrent greedy requests with different prompts
 * return exactly the ids each returns alone (and alone equals the plain
 * session's greedy loop); cancellation frees the sequence at once; a full KV
 * pool makes requests wait, not fail; bad requests are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "test_util.h"

#define N_REQ 16
#define MAX_NEW 10

typedef struct {
    int32_t ids[64];
    int n;
    g4_finish_reason finish;
    int events;
} collected;

static void on_token(void *user, const g4_token_event *ev) {
    collected *c = user;
    c->events++;
    if (ev->has_token && c->n < 64) c->ids[c->n++] = ev->sample.token;
    if (ev->finish != G4_FINISH_NONE) c->finish = ev->finish;
}

static int32_t prompt_token(int req, int i, int vocab) { return (int32_t)((req * 131 + i * 37 + 5) % (vocab - 10)) + 3; }

static void run_alone(const g4_model *m, const int32_t *prompt, int n, int32_t *out, int *n_out) {
    const int V = m->config.text.vocab_size;
    g4_session_options opt = {.n_ctx = n + MAX_NEW + 1};
    g4_session *s;
    float *logits = malloc((size_t)V * sizeof *logits);
    *n_out = 0;
    if (g4_session_create(m, &opt, &s) != G4_OK) return;
    g4_status st = g4_session_eval(s, prompt, n, NULL, G4_LOGITS_LAST, logits);
    while (st == G4_OK && *n_out < MAX_NEW) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        out[(*n_out)++] = best;
        if (*n_out == MAX_NEW) break;
        int32_t next = best;
        st = g4_session_eval(s, &next, 1, NULL, G4_LOGITS_LAST, logits);
    }
    g4_session_destroy(s);
    free(logits);
}

/* On the exact path: the fast one quantises each product's activations, so
 * the last bits of a result depend on which kernel (decode or prefill) ran
 * it, and greedy ids of a random fixture can then differ. */
static void check_batching(const char *fixture) {
    g4_backend *be;
    g4_model *m;
    g4_status st = g4_backend_cpu_create(0, &be);
    if (st == G4_OK) st = g4_model_load_dir(test_fixture(fixture), be, &m);
    CHECK(st == G4_OK, "%s: load: %s", fixture, g4_error_message());
    if (st != G4_OK) return;
    const int V = m->config.text.vocab_size;
    int32_t prompts[N_REQ][40];
    int lens[N_REQ];
    int32_t alone[N_REQ][MAX_NEW];
    int n_alone[N_REQ];
    for (int r = 0; r < N_REQ; r++) {
        lens[r] = 3 + (r * 7) % 30; /* different lengths: prefill and decode mix in steps */
        prompts[r][0] = 2;
        for (int i = 1; i < lens[r]; i++) prompts[r][i] = prompt_token(r, i, V);
        run_alone(m, prompts[r], lens[r], alone[r], &n_alone[r]);
    }
    /* a small per-step budget forces prompts to be prefilled in pieces
     * while other sequences decode */
    g4_engine_options opt = {.max_seqs = 8, .n_ctx = 64, .max_batch_tokens = 24};
    g4_engine *e;
    st = g4_engine_create(m, &opt, &e);
    CHECK(st == G4_OK, "engine: %s", g4_error_message());
    collected got[N_REQ];
    memset(got, 0, sizeof got);
    for (int r = 0; r < N_REQ && st == G4_OK; r++) {
        g4_request req = {.prompt = prompts[r], .n_prompt = lens[r], .max_tokens = MAX_NEW, .on_token = on_token,
                          .user = &got[r]};
        g4_sampler_params_default(&req.sampling);
        st = g4_engine_submit(e, &req, NULL);
        CHECK(st == G4_OK, "submit %d: %s", r, g4_error_message());
    }
    int steps = 0;
    while (st == G4_OK && g4_engine_step(e) > 0 && steps < 10000) steps++;
    int exact = 0;
    for (int r = 0; r < N_REQ; r++) {
        int same = got[r].n == n_alone[r] && !memcmp(got[r].ids, alone[r], (size_t)n_alone[r] * sizeof(int32_t));
        exact += same;
        CHECK(same, "%s request %d: batched ids differ from the request alone", fixture, r);
        CHECK(got[r].finish == G4_FINISH_LENGTH, "%s request %d finished with %d", fixture, r, got[r].finish);
    }
    g4_engine_stats stats;
    g4_engine_get_stats(e, &stats);
    printf("  %-6s %d/%d requests identical to running alone; %llu steps, %llu prompt and %llu generated tokens, "
           "KV blocks in use after: %d\n",
           fixture, exact, N_REQ, (unsigned long long)stats.steps, (unsigned long long)stats.tokens_prefilled,
           (unsigned long long)stats.tokens_generated, stats.kv_blocks_used);
    CHECK(stats.kv_blocks_used == 0, "all KV blocks returned (%d in use)", stats.kv_blocks_used);
    CHECK(stats.steps < (uint64_t)N_REQ * (MAX_NEW + 2), "batching took %llu steps", (unsigned long long)stats.steps);
    g4_engine_destroy(e);
    g4_model_release(m);
    g4_backend_destroy(be);
}

static void check_limits(void) {
    g4_backend *be;
    g4_model *m;
    g4_status st = g4_backend_cpu_create(0, &be);
    if (st == G4_OK) st = g4_model_load_dir(test_fixture("dense"), be, &m);
    if (st != G4_OK) {
        CHECK(0, "load dense: %s", g4_error_message());
        return;
    }
    /* room for exactly one sequence of 32 positions */
    g4_engine_options opt = {.max_seqs = 4, .n_ctx = 32, .kv_blocks = 2, .block_size = 16, .max_queue = 2};
    g4_engine *e;
    st = g4_engine_create(m, &opt, &e);
    CHECK(st == G4_OK, "engine: %s", g4_error_message());
    int32_t prompt[8] = {2, 10, 20, 30, 40, 50, 60, 70};
    collected c[4];
    memset(c, 0, sizeof c);
    g4_request req = {.prompt = prompt, .n_prompt = 8, .max_tokens = 20, .on_token = on_token};
    g4_sampler_params_default(&req.sampling);
    uint64_t ids[3];
    for (int i = 0; i < 2; i++) {
        req.user = &c[i];
        st = g4_engine_submit(e, &req, &ids[i]);
        CHECK(st == G4_OK, "submit %d: %s", i, g4_error_message());
    }
    req.user = &c[2];
    st = g4_engine_submit(e, &req, &ids[2]);
    CHECK(st == G4_ERR_LIMIT, "third request: queue of 2 is full: %s", g4_error_message());
    g4_engine_step(e);
    g4_engine_stats stats;
    g4_engine_get_stats(e, &stats);
    CHECK(stats.running == 1 && stats.waiting == 1, "the pool holds one sequence: running %d waiting %d",
          stats.running, stats.waiting);
    g4_engine_cancel(e, ids[0]);
    g4_engine_step(e); /* cancellation frees the blocks, the second is admitted */
    CHECK(c[0].finish == G4_FINISH_CANCELLED, "cancelled request finished with %d", c[0].finish);
    g4_engine_get_stats(e, &stats);
    CHECK(stats.running == 1 && stats.waiting == 0, "after cancel: running %d waiting %d", stats.running,
          stats.waiting);
    while (g4_engine_step(e) > 0) {}
    CHECK(c[1].finish == G4_FINISH_LENGTH && c[1].n == 20, "second request ran to max_tokens (%d tokens)", c[1].n);
    req.max_tokens = 30;
    st = g4_engine_submit(e, &req, NULL);
    CHECK(st == G4_ERR_LIMIT, "prompt + max_tokens beyond the context is refused: %s", g4_error_message());
    int32_t bad[2] = {2, 5000};
    req.prompt = bad;
    req.n_prompt = 2;
    req.max_tokens = 4;
    st = g4_engine_submit(e, &req, NULL);
    CHECK(st == G4_ERR_INVALID_ARGUMENT, "out-of-vocabulary prompt refused: %s", g4_error_message());
    req.n_prompt = 0;
    st = g4_engine_submit(e, &req, NULL);
    CHECK(st == G4_ERR_INVALID_ARGUMENT, "empty prompt refused: %s", g4_error_message());
    g4_engine_destroy(e);
    g4_model_release(m);
    g4_backend_destroy(be);
}

/* More sequences finishing in one step than any fixed array would hold (the
 * step's finished list was a 512-entry stack array while --max-seqs had no
 * cap): 600 one-token requests prefilled and sampled in a single step. */
static void check_many_finishing(void) {
    enum { N = 600 };
    g4_backend *be;
    g4_model *m;
    g4_status st = g4_backend_cpu_create(0, &be);
    if (st == G4_OK) st = g4_model_load_dir(test_fixture("dense"), be, &m);
    if (st != G4_OK) {
        CHECK(0, "load dense: %s", g4_error_message());
        return;
    }
    g4_engine_options opt = {.max_seqs = N, .n_ctx = 8, .max_batch_tokens = 2 * N, .max_queue = N};
    g4_engine *e;
    st = g4_engine_create(m, &opt, &e);
    CHECK(st == G4_OK, "engine of %d sequences: %s", N, g4_error_message());
    static collected got[N];
    memset(got, 0, sizeof got);
    int32_t prompt[2] = {2, 40};
    for (int r = 0; r < N && st == G4_OK; r++) {
        g4_request req = {.prompt = prompt, .n_prompt = 2, .max_tokens = 1, .on_token = on_token, .user = &got[r]};
        g4_sampler_params_default(&req.sampling);
        st = g4_engine_submit(e, &req, NULL);
    }
    CHECK(st == G4_OK, "%d submissions: %s", N, g4_error_message());
    if (st == G4_OK) g4_engine_step(e);
    int finished = 0;
    for (int r = 0; r < N; r++) finished += got[r].finish == G4_FINISH_LENGTH && got[r].n == 1;
    CHECK(finished == N, "%d of %d sequences finished in one step", finished, N);
    g4_engine_stats stats;
    g4_engine_get_stats(e, &stats);
    CHECK(stats.running == 0 && stats.kv_blocks_used == 0, "all %d freed (running %d, KV blocks %d)", N, stats.running,
          stats.kv_blocks_used);
    g4_engine_destroy(e);
    g4_model_release(m);
    g4_backend_destroy(be);
}

int main(void) {
    check_many_finishing();
    check_batching("dense");
    check_batching("moe");
    check_batching("e2b");
    check_limits();
    return test_finish();
}
