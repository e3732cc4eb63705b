/* Speculative decoding inside the batched engine (issue 29), on the bundled
 * model and its trained drafter: 16 requests of mixed prompt lengths, some
 * greedy, some sampled with a seed, some with drafting off, decoded together
 * with drafts verified in the same forward passes as everyone's plain rows
 * and prefill chunks. Each greedy reply must be exactly the ids of the same
 * request run alone without a drafter; every reply (sampled ones included)
 * must not depend on the slot (the same requests submitted in reverse order
 * give the same ids); the next turns, reusing prompt + reply blocks from the
 * prefix cache, must still match a cold run (no rejected position was
 * registered). Also: the adaptive draft length, the min-p floor and forced
 * acceptance; the drafter batched across sequences (a step's drafting
 * sequences share each drafter forward); the public API's draft options.
 * G4_TEST_DEVICE=cuda runs it on a GPU. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemma4.h"
#include "model/assistant.h"
#include "runtime/context.h"
#include "runtime/engine.h"
#include "text/tokenizer.h"
#include "test_util.h"

#define N_REQ 16
#define MAX_NEW 24
#define MAX_PROMPT 96

typedef struct {
    int32_t ids[2 * MAX_NEW];
    int n;
    g4_finish_reason finish;
    int n_drafted, n_accepted, n_rounds;
} collected;

static void on_token(void *user, const g4_token_event *ev) {
    collected *c = user;
    if (ev->has_token && c->n < 2 * MAX_NEW) c->ids[c->n++] = ev->sample.token;
    if (ev->finish != G4_FINISH_NONE) {
        c->finish = ev->finish;
        c->n_drafted = ev->n_drafted, c->n_accepted = ev->n_accepted, c->n_rounds = ev->n_rounds;
    }
}

typedef struct {
    int32_t ids[MAX_PROMPT + MAX_NEW];
    int n;
    int sampled;  /* temperature 0.8, top-k 40, seed r */
    int no_draft; /* "speculative": false */
} request;

static void fill_request(g4_request *req, const request *q, int r, collected *out) {
    memset(req, 0, sizeof *req);
    req->prompt = q->ids;
    req->n_prompt = q->n;
    req->max_tokens = MAX_NEW;
    req->on_token = on_token;
    req->user = out;
    req->no_speculative = q->no_draft;
    g4_sampler_params_default(&req->sampling);
    if (q->sampled) {
        req->sampling.temperature = 0.8f;
        req->sampling.top_k = 40;
        req->sampling.seed = 1000 + (uint64_t)r;
    }
}

/* Runs requests q[0..n) on engine options `opt` (order: submission order,
 * a permutation of 0..n), all at once; ids into got[]. */
static g4_status run_batch(const g4_model *m, const g4_engine_options *opt, const request *q, int n,
                           const int *order, collected *got, g4_engine_stats *stats) {
    g4_engine *e = NULL;
    g4_status st = g4_engine_create(m, opt, &e);
    memset(got, 0, (size_t)n * sizeof *got);
    for (int i = 0; i < n && st == G4_OK; i++) {
        g4_request req;
        fill_request(&req, &q[order[i]], order[i], &got[order[i]]);
        st = g4_engine_submit(e, &req, NULL);
    }
    int steps = 0;
    while (st == G4_OK && steps++ < 100000) {
        int left = g4_engine_step(e);
        if (left < 0) st = G4_ERR_INTERNAL;
        if (left <= 0) break;
    }
    if (e && stats) g4_engine_get_stats(e, stats);
    g4_engine_destroy(e);
    return st;
}

/* One request alone on an engine without a drafter (nor a prefix cache). */
static g4_status run_alone(const g4_model *m, const request *q, int r, collected *got) {
    g4_engine_options opt = {.max_seqs = 1, .n_ctx = MAX_PROMPT + 2 * MAX_NEW + 8, .no_prefix_cache = 1};
    request plain = *q;
    int order = 0;
    (void)r;
    return run_batch(m, &opt, &plain, 1, &order, got, NULL);
}

/* The sanitizer build (G4_TEST_SANITIZED=1) runs each path once: no
 * repeat in reverse order, no middle min-p floor. */
static int sanitized(void) {
    const char *v = getenv("G4_TEST_SANITIZED");
    return v && !strcmp(v, "1");
}

static int same_ids(const collected *a, const collected *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof a->ids[0]);
}

static const char *const texts[] = {
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep.",
    "And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them,",
    "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that mourn: for they "
    "shall be comforted.",
    "And God said, Let there be light: and there was light. And God saw the light, that it was good:",
};

static void make_requests(const g4_model *m, g4_tokenizer *tok, request *q) {
    for (int r = 0; r < N_REQ; r++) {
        const char *t = texts[r % 4];
        int32_t *ids = NULL;
        size_t n = 0;
        memset(&q[r], 0, sizeof q[r]);
        if (g4_tokenizer_encode(tok, t, strlen(t), 0, &ids, &n) != G4_OK) continue;
        int len = 3 + (r * 7) % 29; /* 3..31 tokens of text: prefill and decode mix within steps */
        if (len > (int)n) len = (int)n;
        q[r].ids[0] = m->config.tokens.bos_id;
        memcpy(q[r].ids + 1, ids, (size_t)len * sizeof *ids);
        q[r].n = len + 1;
        free(ids);
        q[r].sampled = r % 5 == 4;
        q[r].no_draft = r % 4 == 3;
    }
}

static void check_batched(const g4_model *m, const g4_assistant *a, g4_tokenizer *tok) {
    static request q[N_REQ], next[N_REQ];
    static collected alone[N_REQ], got[N_REQ], reversed[N_REQ], turn2[N_REQ], turn2_alone[N_REQ];
    make_requests(m, tok, q);
    for (int r = 0; r < N_REQ; r++) CHECK(run_alone(m, &q[r], r, &alone[r]) == G4_OK, "alone %d: %s", r, g4_error_message());
    int order[N_REQ], back[N_REQ];
    for (int r = 0; r < N_REQ; r++) order[r] = r, back[r] = N_REQ - 1 - r;
    /* small steps: prompts are prefilled in pieces beside drafted decode rows */
    g4_engine_options opt = {.max_seqs = 16, .n_ctx = MAX_PROMPT + 2 * MAX_NEW + 8, .max_batch_tokens = 40,
                             .drafter = a, .draft_max = 3, .draft_max_batch = 16};
    g4_engine_stats stats, stats2;
    g4_status st = run_batch(m, &opt, q, N_REQ, order, got, &stats);
    CHECK(st == G4_OK, "drafting engine: %s", g4_error_message());
    if (sanitized()) memcpy(reversed, got, sizeof got);
    else st = run_batch(m, &opt, q, N_REQ, back, reversed, &stats2);
    CHECK(st == G4_OK, "drafting engine, reversed: %s", g4_error_message());
    int greedy_same = 0, n_greedy = 0, slot_same = 0;
    for (int r = 0; r < N_REQ; r++) {
        CHECK(got[r].finish == G4_FINISH_LENGTH || got[r].finish == G4_FINISH_STOP, "request %d finished with %d", r,
              got[r].finish);
        if (!q[r].sampled) {
            n_greedy++;
            greedy_same += same_ids(&got[r], &alone[r]);
            CHECK(same_ids(&got[r], &alone[r]), "request %d (greedy%s): drafted ids differ from the request alone", r,
                  q[r].no_draft ? ", not drafting" : "");
        } else {
            CHECK(got[r].n == alone[r].n || got[r].finish == G4_FINISH_STOP, "sampled request %d: %d tokens", r,
                  got[r].n);
        }
        slot_same += same_ids(&got[r], &reversed[r]);
        CHECK(same_ids(&got[r], &reversed[r]), "request %d: ids depend on the slot", r);
        CHECK(got[r].n_drafted == reversed[r].n_drafted && got[r].n_accepted == reversed[r].n_accepted,
              "request %d: acceptance depends on the slot (%d/%d vs %d/%d)", r, got[r].n_accepted, got[r].n_drafted,
              reversed[r].n_accepted, reversed[r].n_drafted);
        if (q[r].no_draft) CHECK(got[r].n_drafted == 0, "request %d opted out but drafted %d", r, got[r].n_drafted);
    }
    printf("engine, 16 requests: %d/%d greedy identical to alone, %d/%d identical in reverse order; %llu rounds, "
           "%llu of %llu drafts kept (by position %llu/%llu %llu/%llu %llu/%llu), %llu steps\n",
           greedy_same, n_greedy, slot_same, N_REQ, (unsigned long long)stats.draft_rounds,
           (unsigned long long)stats.drafts_accepted, (unsigned long long)stats.drafts_proposed,
           (unsigned long long)stats.accepted_at[0], (unsigned long long)stats.drafted_at[0],
           (unsigned long long)stats.accepted_at[1], (unsigned long long)stats.drafted_at[1],
           (unsigned long long)stats.accepted_at[2], (unsigned long long)stats.drafted_at[2],
           (unsigned long long)stats.steps);
    CHECK(stats.draft_rounds > 0 && stats.drafts_accepted > 0, "the engine drafted (%llu rounds, %llu kept)",
          (unsigned long long)stats.draft_rounds, (unsigned long long)stats.drafts_accepted);
    CHECK(stats.drafts_accepted < stats.drafts_proposed, "some drafts were rejected (the rollback ran)");
    CHECK(stats.kv_blocks_used == 0, "all KV blocks returned (%d in use)", stats.kv_blocks_used);
    uint64_t sum_at = 0;
    for (int i = 0; i < G4_DRAFT_MAX; i++) sum_at += stats.drafted_at[i];
    CHECK(sum_at == stats.drafts_proposed, "drafts by position add up (%llu of %llu)", (unsigned long long)sum_at,
          (unsigned long long)stats.drafts_proposed);
    CHECK(stats.tokens_generated < stats.steps * 16 + 1, "tokens counted");

    /* the next turn: prompt + reply + more text, through one engine whose
     * prefix cache holds the first turn's blocks (its reply's registered at
     * its end): it must equal a cold run of the same prompt */
    g4_engine *e = NULL;
    st = g4_engine_create(m, &opt, &e);
    for (int r = 0; r < N_REQ && st == G4_OK; r++) {
        g4_request req;
        fill_request(&req, &q[r], r, &got[r]);
        memset(&got[r], 0, sizeof got[r]);
        st = g4_engine_submit(e, &req, NULL);
    }
    while (st == G4_OK && g4_engine_step(e) > 0) {
    }
    for (int r = 0; r < N_REQ; r++) {
        next[r] = q[r];
        next[r].sampled = 0;
        int n = q[r].n;
        memcpy(next[r].ids + n, got[r].ids, (size_t)got[r].n * sizeof got[r].ids[0]);
        n += got[r].n;
        next[r].ids[n++] = q[r].ids[1];
        next[r].n = n;
    }
    for (int r = 0; r < N_REQ && st == G4_OK; r++) {
        g4_request req;
        fill_request(&req, &next[r], r, &turn2[r]);
        st = g4_engine_submit(e, &req, NULL);
    }
    while (st == G4_OK && g4_engine_step(e) > 0) {
    }
    g4_engine_get_stats(e, &stats);
    g4_engine_destroy(e);
    CHECK(st == G4_OK, "second turn: %s", g4_error_message());
    int cached_same = 0;
    for (int r = 0; r < N_REQ; r++) {
        CHECK(run_alone(m, &next[r], r, &turn2_alone[r]) == G4_OK, "turn 2 alone %d", r);
        cached_same += same_ids(&turn2[r], &turn2_alone[r]);
        CHECK(same_ids(&turn2[r], &turn2_alone[r]), "request %d, next turn: ids differ from a cold run", r);
    }
    printf("next turn through the prefix cache: %d/%d identical to a cold run (%llu prompt tokens reused)\n",
           cached_same, N_REQ, (unsigned long long)stats.prefix_tokens_reused);
    CHECK(stats.prefix_tokens_reused > 0, "the prefix cache was used");
}

/* The min-p floor: a floor of 1 stops every round before its first draft
 * (no drafter step is that sure), a middle one drafts less than none. */
static void check_min_p(const g4_model *m, const g4_assistant *a, g4_tokenizer *tok) {
    static request q[N_REQ];
    static collected alone[4], got[4];
    make_requests(m, tok, q);
    int order[4] = {0, 1, 2, 5};
    request pick[4] = {q[0], q[1], q[2], q[5]};
    for (int i = 0; i < 4; i++) run_alone(m, &pick[i], i, &alone[i]);
    int idx[4] = {0, 1, 2, 3};
    (void)order;
    uint64_t proposed[3] = {0};
    const float floors[3] = {0, 0.5f, 1.0f};
    for (int f = 0; f < 3; f++) {
        if (f == 1 && sanitized()) continue;
        g4_engine_options opt = {.max_seqs = 4, .n_ctx = MAX_PROMPT + 2 * MAX_NEW + 8, .drafter = a, .draft_max = 3,
                                 .draft_min_p = floors[f], .draft_max_batch = 4};
        g4_engine_stats stats;
        g4_status st = run_batch(m, &opt, pick, 4, idx, got, &stats);
        CHECK(st == G4_OK, "min-p %.1f: %s", floors[f], g4_error_message());
        for (int i = 0; i < 4; i++) CHECK(same_ids(&got[i], &alone[i]), "min-p %.1f, request %d: ids differ", floors[f], i);
        proposed[f] = stats.drafts_proposed;
    }
    printf("min-p floor 0 / 0.5 / 1: %llu / %llu / %llu drafts\n", (unsigned long long)proposed[0],
           (unsigned long long)proposed[1], (unsigned long long)proposed[2]);
    CHECK(proposed[2] == 0, "a floor of 1 drafts nothing (%llu)", (unsigned long long)proposed[2]);
    CHECK(sanitized() || (proposed[1] < proposed[0] && proposed[1] > 0), "a floor of 0.5 drafts less (%llu of %llu)",
          (unsigned long long)proposed[1], (unsigned long long)proposed[0]);
}

/* The adaptive length: nothing kept shortens a sequence's rounds by one
 * each round down to 1; everything kept lengthens them back to the most. */
static void check_adaptive(const g4_model *m, const g4_assistant *a, g4_tokenizer *tok) {
    g4_draft_length dl;
    g4_draft_length_init(&dl, 4);
    int lens[8], n = 0;
    for (int i = 0; i < 4; i++) lens[n++] = dl.len, g4_draft_length_update(&dl, dl.len, 0);
    for (int i = 0; i < 4; i++) lens[n++] = dl.len, g4_draft_length_update(&dl, dl.len, dl.len);
    static const int want[8] = {4, 3, 2, 1, 1, 2, 3, 4};
    CHECK(!memcmp(lens, want, sizeof want), "draft lengths %d %d %d %d %d %d %d %d", lens[0], lens[1], lens[2],
          lens[3], lens[4], lens[5], lens[6], lens[7]);
    g4_draft_length_update(&dl, 4, 2); /* half kept: stays */
    CHECK(dl.len == 4, "half kept keeps the length (%d)", dl.len);
    g4_draft_length_update(&dl, 4, 1);
    CHECK(dl.len == 3, "a quarter kept shortens (%d)", dl.len);

    /* forced acceptance of 0 in the engine: one request's rounds draft 4, 3,
     * 2, then 1 draft each; of all: every round drafts 4 and keeps them */
    static request q[N_REQ];
    make_requests(m, tok, q);
    for (int forced = 0; forced <= 4; forced += 4) {
        g4_engine_options opt = {.max_seqs = 1, .n_ctx = MAX_PROMPT + 2 * MAX_NEW + 8, .drafter = a, .draft_max = 4,
                                 .draft_force = 1, .draft_forced_accept = forced};
        collected got;
        g4_engine_stats stats;
        int order = 0;
        request one = q[1];
        g4_status st = run_batch(m, &opt, &one, 1, &order, &got, &stats);
        CHECK(st == G4_OK, "forced %d: %s", forced, g4_error_message());
        if (forced == 0) {
            const uint64_t R = stats.draft_rounds;
            CHECK(R >= 5 && stats.drafted_at[0] == R && stats.drafted_at[1] == 3 && stats.drafted_at[2] == 2 &&
                      stats.drafted_at[3] == 1 && stats.drafts_accepted == 0,
                  "forced 0: %llu rounds, drafted by position %llu %llu %llu %llu",
                  (unsigned long long)R, (unsigned long long)stats.drafted_at[0],
                  (unsigned long long)stats.drafted_at[1], (unsigned long long)stats.drafted_at[2],
                  (unsigned long long)stats.drafted_at[3]);
        } else {
            /* 24 tokens: the first from the prefill, then rounds of 5 (4 kept + 1) while the budget allows */
            CHECK(got.n == MAX_NEW && stats.drafted_at[3] >= 4 && stats.drafts_accepted == stats.drafts_proposed,
                  "forced 4: %d tokens, %llu rounds, %llu of %llu kept", got.n, (unsigned long long)stats.draft_rounds,
                  (unsigned long long)stats.drafts_accepted, (unsigned long long)stats.drafts_proposed);
            CHECK(stats.draft_rounds <= 6, "forced 4: %llu rounds for %d tokens", (unsigned long long)stats.draft_rounds,
                  got.n);
        }
        printf("forced acceptance %d: %d tokens in %llu rounds, %llu of %llu drafts kept\n", forced, got.n,
               (unsigned long long)stats.draft_rounds, (unsigned long long)stats.drafts_accepted,
               (unsigned long long)stats.drafts_proposed);
    }
}

/* The drafter runs once per draft position for all of a step's drafting
 * sequences: 4 requests decoding in lockstep (one prompt length, forced
 * acceptance of every draft, so every round drafts 3 but the last, which
 * drafts 2) make 6 rounds of 17 drafts each, in 17 drafter forwards, not 68.
 * The emitted ids are then the drafter's own (forced), and must equal each
 * request's alone on a one-sequence engine (its drafter forwards of 1 row). */
static void check_drafter_batched(const g4_model *m, const g4_assistant *a, g4_tokenizer *tok) {
    enum { N = 4, P = 12 };
    static request q[N];
    static collected got[N], alone[N];
    for (int r = 0; r < N; r++) {
        int32_t *ids = NULL;
        size_t n = 0;
        memset(&q[r], 0, sizeof q[r]);
        CHECK(g4_tokenizer_encode(tok, texts[r], strlen(texts[r]), 0, &ids, &n) == G4_OK && n >= P, "prompt %d", r);
        q[r].ids[0] = m->config.tokens.bos_id;
        if (ids && n >= P) memcpy(q[r].ids + 1, ids, (size_t)(P - 1) * sizeof *ids);
        q[r].n = P;
        free(ids);
    }
    g4_engine_options opt = {.max_seqs = N, .n_ctx = MAX_PROMPT + 2 * MAX_NEW + 8, .drafter = a, .draft_max = 3,
                             .draft_max_batch = N, .draft_force = 1, .draft_forced_accept = 3};
    int order[N] = {0, 1, 2, 3};
    g4_engine_stats stats, one;
    g4_status st = run_batch(m, &opt, q, N, order, got, &stats);
    CHECK(st == G4_OK, "batched drafter: %s", g4_error_message());
    /* 24 tokens: 1 from the prefill, rounds of 3 kept + 1 while the budget allows, the last of 2 + 1 */
    const uint64_t per_seq = 5 * 3 + 2;
    CHECK(stats.drafts_proposed == N * per_seq && stats.draft_rounds == N * 6,
          "lockstep: %llu drafts in %llu rounds (want %llu in %d)", (unsigned long long)stats.drafts_proposed,
          (unsigned long long)stats.draft_rounds, (unsigned long long)(N * per_seq), N * 6);
    CHECK(stats.draft_forwards == per_seq, "4 drafting sequences: %llu drafter forwards for %llu drafts (want %llu)",
          (unsigned long long)stats.draft_forwards, (unsigned long long)stats.drafts_proposed,
          (unsigned long long)per_seq);
    opt.max_seqs = 1;
    opt.draft_max_batch = 1;
    int same = 0;
    for (int r = 0; r < N; r++) {
        int o = 0;
        st = run_batch(m, &opt, &q[r], 1, &o, &alone[r], &one);
        CHECK(st == G4_OK && one.draft_forwards == per_seq, "request %d alone: %llu forwards: %s", r,
              (unsigned long long)one.draft_forwards, g4_error_message());
        same += same_ids(&got[r], &alone[r]);
        CHECK(same_ids(&got[r], &alone[r]), "request %d: the batched drafter's drafts differ from its drafts alone", r);
    }
    printf("batched drafter: 4 sequences, %llu drafts in %llu drafter forwards (%llu a sequence alone); "
           "%d/4 forced replies identical to alone\n", (unsigned long long)stats.drafts_proposed,
           (unsigned long long)stats.draft_forwards, (unsigned long long)per_seq, same);
}

/* Bad drafter options are refused with a message. */
static void check_options(const g4_model *m, const g4_assistant *a) {
    g4_engine *e = NULL;
    g4_engine_options opt = {.drafter = a, .draft_max = G4_DRAFT_MAX + 1};
    CHECK(g4_engine_create(m, &opt, &e) == G4_ERR_INVALID_ARGUMENT && !e, "draft_max %d refused", G4_DRAFT_MAX + 1);
    opt = (g4_engine_options){.drafter = a, .draft_min_p = 1.5f};
    CHECK(g4_engine_create(m, &opt, &e) == G4_ERR_INVALID_ARGUMENT && !e, "min-p 1.5 refused");
    opt = (g4_engine_options){.drafter = a, .draft_max = 8, .max_seqs = 4, .max_batch_tokens = 6};
    CHECK(g4_engine_create(m, &opt, &e) == G4_ERR_INVALID_ARGUMENT && !e, "a batch shorter than a verification: %s",
          g4_error_message());
}

/* ---- the public API (gemma4.h): g4_open_options.draft, g4_params.no_speculative ---- */

typedef struct {
    int32_t ids[64];
    int n, draft_tokens, accepted_tokens, rounds;
    atomic_int done;
    char finish[16];
} api_collected;

static void on_api_event(void *user, const g4_event *ev) {
    api_collected *c = user;
    if (ev->token >= 0 && c->n < 64) c->ids[c->n++] = ev->token;
    if (ev->done) {
        c->draft_tokens = ev->draft_tokens, c->accepted_tokens = ev->accepted_tokens, c->rounds = ev->draft_rounds;
        snprintf(c->finish, sizeof c->finish, "%s", ev->finish_reason);
        atomic_store(&c->done, 1);
    }
}

static void wait_all(api_collected *c, int n) {
    for (int spins = 0; spins < 600000; spins++) {
        int done = 0;
        for (int i = 0; i < n; i++) done += atomic_load(&c[i].done);
        if (done == n) return;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

static void check_public_api(const char *model_dir, const char *device) {
    g4_handle *h = NULL;
    g4_open_options bad = {.device = device, .exact = 1, .draft = "/nonexistent/drafter"};
    CHECK(g4_open(model_dir, &bad, &h) != G4_OK && !h && strstr(g4_error_message(), "drafter"),
          "a missing drafter is refused naming it: %s", g4_error_message());
    g4_open_options oo = {.device = device, .exact = 1, .kv_type = "f32", .max_seqs = 8, .n_ctx = 256,
                          .draft = "auto", .draft_max = 2, .draft_max_batch = 8};
    g4_status st = g4_open(model_dir, &oo, &h);
    CHECK(st == G4_OK, "g4_open with draft auto: %s", g4_error_message());
    if (st != G4_OK) return;
    static const char *const prompts[] = {"In the beginning God created", "And the LORD spake unto Moses,",
                                          "Blessed are the poor in spirit:", "And God said, Let there be light:"};
    static api_collected plain[4], drafted[4];
    memset(plain, 0, sizeof plain);
    memset(drafted, 0, sizeof drafted);
    g4_params p;
    g4_params_default(&p);
    p.max_tokens = 24;
    for (int i = 0; i < 4 && st == G4_OK; i++) {
        p.no_speculative = 1;
        st = g4_submit_text(h, prompts[i], &p, on_api_event, &plain[i], NULL);
        if (st == G4_OK) wait_all(&plain[i], 1); /* alone */
    }
    p.no_speculative = 0;
    for (int i = 0; i < 4 && st == G4_OK; i++) st = g4_submit_text(h, prompts[i], &p, on_api_event, &drafted[i], NULL);
    CHECK(st == G4_OK, "submit: %s", g4_error_message());
    wait_all(drafted, 4);
    int same = 0, rounds = 0;
    for (int i = 0; i < 4; i++) {
        const int eq = plain[i].n == drafted[i].n && plain[i].n > 0 &&
                       !memcmp(plain[i].ids, drafted[i].ids, (size_t)plain[i].n * sizeof plain[i].ids[0]);
        same += eq;
        CHECK(eq, "public API prompt %d: drafted ids differ from the opted-out run", i);
        CHECK(plain[i].draft_tokens == 0 && plain[i].rounds == 0, "prompt %d opted out but drafted", i);
        CHECK((drafted[i].rounds > 0 || drafted[i].n < 3) && drafted[i].accepted_tokens <= drafted[i].draft_tokens,
              "prompt %d: %d tokens, %d rounds, %d of %d kept (%s)", i, drafted[i].n, drafted[i].rounds,
              drafted[i].accepted_tokens, drafted[i].draft_tokens, drafted[i].finish);
        rounds += drafted[i].rounds;
    }
    printf("public API, draft auto: %d/4 drafted replies identical to opted-out ones (%d rounds)\n", same, rounds);
    CHECK(rounds > 0, "the public API's requests drafted");
    g4_close(h);
}

int main(void) {
    const char *src = getenv("G4_SOURCE"), *device = getenv("G4_TEST_DEVICE");
    char mdir[1024], adir[1024];
    snprintf(mdir, sizeof mdir, "%s/models/tiny", src ? src : ".");
    snprintf(adir, sizeof adir, "%s/models/tiny-assistant", src ? src : ".");
    g4_backend *be = NULL;
    g4_model *m = NULL;
    g4_assistant *a = NULL;
    g4_tokenizer *tok = NULL;
    g4_status st = g4_backend_open(device ? device : "cpu", 0, &be);
    if (st != G4_OK && device) {
        printf("no %s device: %s\n", device, g4_error_message());
        return 77;
    }
    /* the exact path: batched rows compute as they do alone (on the CPU bit for bit) */
    if (st == G4_OK) be->ops->set_precision(be, G4_PRECISION_EXACT);
    if (st == G4_OK) st = g4_model_load_dir(mdir, be, &m);
    if (st == G4_OK) st = g4_assistant_load_dir(adir, be, &a);
    if (st == G4_OK) st = g4_assistant_attach(a, m);
    if (st == G4_OK) st = g4_tokenizer_load(mdir, &tok);
    CHECK(st == G4_OK, "bundled model + drafter: %s", g4_error_message());
    if (st == G4_OK) {
        check_options(m, a);
        check_batched(m, a, tok);
        check_min_p(m, a, tok);
        check_adaptive(m, a, tok);
        check_drafter_batched(m, a, tok);
        check_public_api(mdir, device ? device : "cpu");
    }
    g4_tokenizer_free(tok);
    g4_assistant_release(a);
    g4_model_release(m);
    if (be) g4_backend_destroy(be);
    return test_finish();
}
