/* The engine's prefix cache against a cold engine (no_prefix_cache), on the
 * CPU's exact path, where every row's result is independent of its batch:
 * each request's tokens and log-probabilities (the chosen token's and the
 * top 20, logit minus the log-sum-exp over the whole row) must be
 * bit-identical, while n_cached says how much of the prompt was reused:
 *   - a 10-turn conversation (each prompt = previous prompt + reply + new
 *     tokens) reuses everything up to the block where the reply ended, with
 *     prompts far beyond the fixtures' sliding window of 8 (ring wraps);
 *   - several sequences running at once share one cached prefix;
 *   - a pool too small for everything evicts (and still admits a request
 *     that needs the whole pool), snapshots are evicted too;
 *   - images: a prefix that ends inside an image (bidirectional attention,
 *     both mask rules), and a different image never matches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kv_cache.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "runtime/session.h"
#include "test_util.h"

#define MAX_NEW 6
#define MAX_IDS 64

typedef struct {
    int32_t ids[MAX_IDS];
    g4_sample samples[MAX_IDS];
    int n, n_cached, events;
    g4_finish_reason finish;
} collected;

static void on_token(void *user, const g4_token_event *ev) {
    collected *c = user;
    c->events++;
    c->n_cached = ev->n_cached;
    if (ev->has_token && c->n < MAX_IDS) {
        c->samples[c->n] = ev->sample;
        c->ids[c->n++] = ev->sample.token;
    }
    if (ev->finish != G4_FINISH_NONE) c->finish = ev->finish;
}

typedef struct {
    const int32_t *prompt;
    int n;
    int max_tokens;
    /* optional soft tokens: rows and a seed for their embeddings */
    int n_media;
    const int32_t *media_rows;
    unsigned media_seed;
} request;

static g4_request_media make_media(const g4_model *m, const request *r) {
    g4_request_media md = {0};
    if (r->n_media == 0) return md;
    g4_backend *be = m->backend;
    const int d = m->config.text.hidden_size;
    md.n = r->n_media;
    md.rows = malloc((size_t)r->n_media * sizeof *md.rows);
    md.embeds = be->ops->alloc(be, (size_t)r->n_media * d * sizeof(float));
    float *host = malloc((size_t)r->n_media * d * sizeof *host);
    unsigned x = r->media_seed * 2654435761u + 1;
    for (int i = 0; i < r->n_media * d; i++) {
        x = x * 1664525u + 1013904223u;
        host[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    memcpy(md.rows, r->media_rows, (size_t)r->n_media * sizeof *md.rows);
    be->ops->to_device(be, md.embeds, host, (size_t)r->n_media * d * sizeof(float));
    free(host);
    return md;
}

/* Submits requests [0, n) at once and steps until all are done. */
static void run_batch(g4_engine *e, const g4_model *m, const request *reqs, int n, collected *out) {
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        g4_request rq = {.prompt = reqs[i].prompt, .n_prompt = reqs[i].n,
                         .max_tokens = reqs[i].max_tokens ? reqs[i].max_tokens : MAX_NEW, .on_token = on_token,
                         .user = &out[i]};
        g4_sampler_params_default(&rq.sampling);
        rq.sampling.logprobs = 1;
        rq.sampling.top_logprobs = G4_SAMPLER_MAX_TOP_LOGPROBS;
        rq.media = make_media(m, &reqs[i]);
        g4_status st = g4_engine_submit(e, &rq, NULL);
        CHECK(st == G4_OK, "submit: %s", g4_error_message());
    }
    for (int steps = 0; g4_engine_step(e) > 0 && steps < 100000; steps++) {}
}

static int same_samples(const collected *a, const collected *b) {
    if (a->n != b->n || a->finish != b->finish) return 0;
    for (int i = 0; i < a->n; i++) {
        const g4_sample *x = &a->samples[i], *y = &b->samples[i];
        if (x->token != y->token || memcmp(&x->logprob, &y->logprob, sizeof x->logprob) || x->n_top != y->n_top)
            return 0;
        for (int k = 0; k < x->n_top; k++)
            if (x->top[k].id != y->top[k].id || memcmp(&x->top[k].logprob, &y->top[k].logprob, sizeof(float)))
                return 0;
    }
    return 1;
}

typedef struct {
    g4_backend *be;
    g4_model *m;
    g4_engine *warm, *cold;
    int cuda; /* not batch-invariant: same tokens, log-probabilities within CUDA_LOGPROB_TOL */
} engines;

static const double CUDA_LOGPROB_TOL = 1e-2;
static double worst_logprob_gap;

/* The largest log-probability difference, when the tokens are the same (else infinity). */
static double logprob_gap(const collected *a, const collected *b) {
    if (a->n != b->n) return INFINITY;
    double worst = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->samples[i].token != b->samples[i].token) return INFINITY;
        double d = fabs((double)a->samples[i].logprob - b->samples[i].logprob);
        if (d > worst) worst = d;
    }
    return worst;
}

/* 0 (and a "skipped" line) when the backend is not there. */
static int open_engines_on(int cuda, const char *fixture, const g4_engine_options *opt, engines *en) {
    memset(en, 0, sizeof *en);
    en->cuda = cuda;
    g4_status st = cuda ? g4_backend_cuda_create(0, &en->be) : g4_backend_cpu_create(0, &en->be);
    if (cuda && st == G4_ERR_UNSUPPORTED) {
        printf("  CUDA cases skipped: %s\n", g4_error_message());
        return 0;
    }
    if (st == G4_OK) st = g4_model_load_dir(test_fixture(fixture), en->be, &en->m);
    g4_engine_options cold = *opt;
    cold.no_prefix_cache = 1;
    if (st == G4_OK) st = g4_engine_create(en->m, opt, &en->warm);
    if (st == G4_OK) st = g4_engine_create(en->m, &cold, &en->cold);
    CHECK(st == G4_OK, "%s: %s", fixture, g4_error_message());
    return st == G4_OK;
}

static int open_engines(const char *fixture, const g4_engine_options *opt, engines *en) {
    return open_engines_on(0, fixture, opt, en);
}

static void close_engines(engines *en) {
    g4_engine_stats stats;
    if (en->warm) {
        g4_engine_get_stats(en->warm, &stats);
        CHECK(stats.kv_blocks_used == 0 && stats.running == 0, "every block returned (%d held)", stats.kv_blocks_used);
    }
    g4_engine_destroy(en->warm);
    g4_engine_destroy(en->cold);
    g4_model_release(en->m);
    g4_backend_destroy(en->be);
}

/* Runs the same batch on both engines and compares. */
static void both(engines *en, const request *reqs, int n, collected *warm, const char *what) {
    collected cold[8];
    run_batch(en->warm, en->m, reqs, n, warm);
    run_batch(en->cold, en->m, reqs, n, cold);
    for (int i = 0; i < n; i++) {
        CHECK(warm[i].n == (reqs[i].max_tokens ? reqs[i].max_tokens : MAX_NEW), "%s %d: %d tokens", what, i,
              warm[i].n);
        if (en->cuda) {
            double gap = logprob_gap(&warm[i], &cold[i]);
            if (gap > worst_logprob_gap) worst_logprob_gap = gap;
            CHECK(gap < CUDA_LOGPROB_TOL, "%s %d (CUDA): reused prefix (%d cached): tokens differ from cold or a "
                  "log-probability by %.3g", what, i, warm[i].n_cached, gap);
        } else {
            CHECK(same_samples(&warm[i], &cold[i]), "%s %d: reused prefix (%d cached) differs from cold", what, i,
                  warm[i].n_cached);
        }
        CHECK(cold[i].n_cached == 0, "the cold engine reuses nothing (%d)", cold[i].n_cached);
    }
}

static int32_t text_token(unsigned k, int vocab) { return (int32_t)((k * 2654435761u >> 7) % (unsigned)(vocab - 300)) + 200; }

/* The cache's element type check_conversation runs with: on the exact CPU
 * path a row's K and V do not depend on its batch, so their bf16 or fp8
 * rounding does not either, and reuse stays bit-identical at every type. */
static g4_kv_type conv_kv_type = G4_KV_F32;

static void check_conversation(const char *fixture, int cuda) {
    enum { BS = 4, TURNS = 10 };
    g4_engine_options opt = {.max_seqs = 4, .n_ctx = 256, .block_size = BS, .max_batch_tokens = 16,
                             .kv_type = conv_kv_type};
    engines en;
    if (!open_engines_on(cuda, fixture, &opt, &en)) return;
    const int V = en.m->config.text.vocab_size;
    int32_t conv[256];
    int n = 0;
    conv[n++] = 2;
    int reused_total = 0, prompt_total = 0;
    for (int turn = 0; turn < TURNS; turn++) {
        int new_tokens = 5 + turn % 4 + (turn == 0 ? 20 : 0);
        for (int i = 0; i < new_tokens; i++) conv[n++] = text_token((unsigned)(turn * 100 + i), V);
        request rq = {.prompt = conv, .n = n};
        collected got;
        char what[64];
        snprintf(what, sizeof what, "%s turn %d", fixture, turn + 1);
        int previous = n - new_tokens; /* the last prompt + reply, all but the reply's last token computed */
        both(&en, &rq, 1, &got, what);
        int expect = turn == 0 ? 0 : (previous - 1) / BS * BS;
        CHECK(got.n_cached == expect, "%s: %d prompt tokens cached, expected %d (the block where the reply ended)",
              what, got.n_cached, expect);
        reused_total += got.n_cached;
        prompt_total += n;
        for (int i = 0; i < got.n; i++) conv[n++] = got.ids[i];
        /* another request in between takes the ring blocks this turn just
         * gave back: the next turn's window must come from the snapshot */
        int32_t noise[40];
        noise[0] = 2;
        for (int i = 1; i < 40; i++) noise[i] = text_token((unsigned)(90000 + turn * 50 + i), V);
        request nq = {.prompt = noise, .n = 40};
        both(&en, &nq, 1, &got, "noise");
        CHECK(got.n_cached == 0, "an unrelated prompt reuses nothing (%d)", got.n_cached);
        prompt_total += 40;
    }
    g4_engine_stats st;
    g4_engine_get_stats(en.warm, &st);
    printf("  %-7s%s 10 turns and 10 unrelated prompts: %d of %d prompt tokens reused, prefilled %llu (cold engine: all); hits %llu misses %llu, "
           "%d blocks + %d snapshots cached (%llu bytes)\n",
           fixture, cuda ? " (CUDA)" : "", reused_total, prompt_total, (unsigned long long)st.tokens_prefilled,
           (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_misses, st.prefix_cached_blocks,
           st.prefix_snapshots, (unsigned long long)st.prefix_cached_bytes);
    CHECK(st.prefix_hits == TURNS - 1 && st.prefix_misses == TURNS + 1, "hits %llu misses %llu",
          (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_misses);
    CHECK(st.tokens_prefilled == (uint64_t)(prompt_total - reused_total), "prefilled %llu = prompts - reused",
          (unsigned long long)st.tokens_prefilled);
    close_engines(&en);
}

/* A shared system prompt: one request leaves it cached, the second (which
 * branches off it) leaves a snapshot at the branch, then four running at
 * once all borrow its blocks. */
static void check_shared_prefix(void) {
    enum { BS = 4 };
    g4_engine_options opt = {.max_seqs = 4, .n_ctx = 128, .block_size = BS, .max_batch_tokens = 24};
    engines en;
    if (!open_engines("dense", &opt, &en)) return;
    const int V = en.m->config.text.vocab_size;
    int32_t prompts[6][48];
    request reqs[6];
    for (int r = 0; r < 6; r++) {
        prompts[r][0] = 2;
        for (int i = 1; i < 30; i++) prompts[r][i] = text_token((unsigned)i, V); /* the shared 30 */
        for (int i = 30; i < 30 + 6 + r; i++) prompts[r][i] = text_token((unsigned)(1000 * r + i), V);
        reqs[r] = (request){.prompt = prompts[r], .n = 36 + r};
    }
    collected got[4];
    both(&en, &reqs[0], 1, got, "first");
    CHECK(got[0].n_cached == 0, "first: nothing cached yet (%d)", got[0].n_cached);
    both(&en, &reqs[1], 1, got, "branch");
    CHECK(got[0].n_cached == 0, "the branch point had no snapshot yet (%d)", got[0].n_cached);
    both(&en, &reqs[2], 4, got, "shared");
    for (int i = 0; i < 4; i++)
        CHECK(got[i].n_cached == 28, "shared %d: %d cached, expected the 7 blocks of the common 30", i,
              got[i].n_cached);
    close_engines(&en);
}

/* A pool that holds 24 blocks: sequences of 12 leave more cached than fits,
 * so blocks and snapshots are evicted; a request that needs all 24 blocks is
 * still admitted at once; everything equals the cold engine. */
static void check_eviction(void) {
    enum { BS = 4 };
    g4_engine_options opt = {.max_seqs = 2, .n_ctx = 96, .block_size = BS, .kv_blocks = 24, .max_batch_tokens = 16,
                             .cache_snapshots = 2};
    engines en;
    if (!open_engines("e2b", &opt, &en)) return;
    const int V = en.m->config.text.vocab_size;
    int32_t p[5][96];
    request reqs[5];
    for (int r = 0; r < 5; r++) {
        p[r][0] = 2;
        for (int i = 1; i < 40; i++) p[r][i] = text_token((unsigned)(r * 977 + i), V);
        reqs[r] = (request){.prompt = p[r], .n = 40};
    }
    collected got[2];
    for (int r = 0; r < 4; r++) both(&en, &reqs[r], 1, got, "distinct");
    /* prompt 3 again with a different tail: still cached (the newest) */
    for (int i = 40; i < 48; i++) p[3][i] = text_token((unsigned)(5000 + i), V);
    reqs[3].n = 48;
    both(&en, &reqs[3], 1, got, "newest again");
    CHECK(got[0].n_cached == 40, "the newest prompt is still cached (%d)", got[0].n_cached);
    /* prompt 0 again: its blocks went first */
    for (int i = 40; i < 48; i++) p[0][i] = text_token((unsigned)(6000 + i), V);
    reqs[0].n = 48;
    both(&en, &reqs[0], 1, got, "oldest again");
    CHECK(got[0].n_cached == 0, "the oldest prompt was evicted (%d cached)", got[0].n_cached);
    g4_engine_stats st;
    g4_engine_get_stats(en.warm, &st);
    CHECK(st.prefix_blocks_evicted > 0 && st.prefix_snapshots_evicted > 0, "evictions: %llu blocks, %llu snapshots",
          (unsigned long long)st.prefix_blocks_evicted, (unsigned long long)st.prefix_snapshots_evicted);
    /* the whole pool for one request, with the cache full of idle blocks */
    CHECK(st.prefix_idle_blocks > 0, "idle cached blocks before the big request (%d)", st.prefix_idle_blocks);
    reqs[4].max_tokens = 96 - 40;
    both(&en, &reqs[4], 1, got, "whole pool");
    g4_engine_get_stats(en.warm, &st);
    printf("  eviction: %llu blocks and %llu snapshots evicted; a 24-block request admitted with the cache full\n",
           (unsigned long long)st.prefix_blocks_evicted, (unsigned long long)st.prefix_snapshots_evicted);
    close_engines(&en);
}

/* The host-RAM tier: the eviction scenario again, now with what the pool
 * gives back kept in host memory. The oldest prompt, evicted from the pool,
 * is reused whole from host RAM (its blocks and its window snapshot copied
 * back), equal to the cold engine; with a budget of a few blocks the tier
 * evicts too and everything still equals cold. */
static void check_host_tier(g4_kv_type type, int cuda) {
    enum { BS = 4 };
    const char *tname = g4_kv_type_name(type);
    for (int small = 0; small <= 1; small++) {
        g4_engine_options opt = {.max_seqs = 2, .n_ctx = 96, .block_size = BS, .kv_blocks = 24,
                                 .max_batch_tokens = 16, .cache_snapshots = 2, .kv_type = type};
        engines en;
        if (!open_engines_on(cuda, "e2b", &opt, &en)) return;
        const uint64_t block = (uint64_t)BS * (g4_kv_bytes_per_position(en.m, type, G4_LAYER_FULL) +
                                               g4_kv_bytes_per_position(en.m, type, G4_LAYER_SLIDING));
        /* generous: everything; small: about six blocks and a window */
        const uint64_t budget = small ? 6 * block + (uint64_t)g4_prefix_snapshot_blocks(en.m, BS) * block : 64u << 20;
        g4_engine_destroy(en.warm);
        opt.cache_ram_bytes = budget;
        g4_status st = g4_engine_create(en.m, &opt, &en.warm);
        CHECK(st == G4_OK, "engine with a host tier: %s", g4_error_message());
        if (st != G4_OK) {
            en.warm = NULL;
            close_engines(&en);
            return;
        }
        const int V = en.m->config.text.vocab_size;
        int32_t p[4][48];
        request reqs[4];
        for (int r = 0; r < 4; r++) {
            p[r][0] = 2;
            for (int i = 1; i < 40; i++) p[r][i] = text_token((unsigned)(r * 977 + i), V);
            reqs[r] = (request){.prompt = p[r], .n = 40};
        }
        collected got[1];
        char what[96];
        snprintf(what, sizeof what, "host tier %s%s%s", tname, small ? " (small)" : "", cuda ? " (CUDA)" : "");
        for (int r = 0; r < 4; r++) both(&en, &reqs[r], 1, got, what);
        /* prompt 0 again: gone from the pool, kept in host RAM */
        for (int i = 40; i < 48; i++) p[0][i] = text_token((unsigned)(6000 + i), V);
        reqs[0].n = 48;
        both(&en, &reqs[0], 1, got, what);
        g4_engine_stats es;
        g4_engine_get_stats(en.warm, &es);
        if (!small) {
            CHECK(got[0].n_cached == 40, "%s: the oldest prompt reused from host RAM (%d cached, expected 40)", what,
                  got[0].n_cached);
            CHECK(es.prefix_host_blocks_restored >= 10 && es.prefix_host_windows_restored == 1,
                  "%s: %llu blocks and %llu windows restored", what,
                  (unsigned long long)es.prefix_host_blocks_restored,
                  (unsigned long long)es.prefix_host_windows_restored);
        } else {
            CHECK(es.prefix_host_evicted > 0 && es.prefix_host_bytes <= budget,
                  "%s: the tier evicts to stay in its budget (%llu evicted, %llu of %llu bytes)", what,
                  (unsigned long long)es.prefix_host_evicted, (unsigned long long)es.prefix_host_bytes,
                  (unsigned long long)budget);
        }
        /* and the others again, whatever each tier still has */
        for (int r = 1; r < 4; r++) {
            for (int i = 40; i < 48; i++) p[r][i] = text_token((unsigned)(7000 + r * 50 + i), V);
            reqs[r].n = 48;
            both(&en, &reqs[r], 1, got, what);
        }
        g4_engine_get_stats(en.warm, &es);
        printf("  %s: %llu blocks + %llu windows saved, %llu + %llu restored, %llu host entries evicted, "
               "%llu of %llu bytes held\n", what, (unsigned long long)es.prefix_host_blocks_saved,
               (unsigned long long)es.prefix_host_windows_saved, (unsigned long long)es.prefix_host_blocks_restored,
               (unsigned long long)es.prefix_host_windows_restored, (unsigned long long)es.prefix_host_evicted,
               (unsigned long long)es.prefix_host_bytes, (unsigned long long)budget);
        CHECK(es.prefix_host_blocks_saved > 0, "%s: blocks saved to host", what);
        close_engines(&en);
    }
}

/* Images on a model whose image tokens attend both ways: the prompt ends
 * right after an image whose last rows share a block with what follows, so
 * the next prompt resumes inside the image; a different image matches
 * nothing from its first block on. */
static void check_images(g4_vision_mask mask) {
    enum { BS = 4 };
    g4_engine_options opt = {.max_seqs = 2, .n_ctx = 128, .block_size = BS, .max_batch_tokens = 32,
                             .vision_mask = mask};
    engines en;
    if (!open_engines("unified", &opt, &en)) return;
    const g4_model *m = en.m;
    const int V = m->config.text.vocab_size;
    const int img = m->config.tokens.image_id;
    int32_t a[64], b[64];
    int32_t rows[16];
    a[0] = 2;
    for (int i = 1; i < 10; i++) a[i] = text_token((unsigned)i, V);
    for (int i = 0; i < 16; i++) a[10 + i] = img, rows[i] = 10 + i; /* image at 10..25 */
    memcpy(b, a, sizeof a);
    for (int i = 26; i < 34; i++) b[i] = text_token((unsigned)(700 + i), V);
    request ra = {.prompt = a, .n = 26, .n_media = 16, .media_rows = rows, .media_seed = 1};
    request rb = {.prompt = b, .n = 34, .n_media = 16, .media_rows = rows, .media_seed = 1};
    request rc = {.prompt = b, .n = 34, .n_media = 16, .media_rows = rows, .media_seed = 2};
    collected got[1];
    const char *name = mask == G4_VISION_MASK_ALL_LAYERS ? "image (all layers)" : "image";
    both(&en, &ra, 1, got, name);
    both(&en, &rb, 1, got, name);
    CHECK(got[0].n_cached == 24, "%s: resumed inside the image at 24 (%d)", name, got[0].n_cached);
    both(&en, &rc, 1, got, name);
    CHECK(got[0].n_cached <= 8, "%s: another image reuses nothing past its start (%d cached)", name, got[0].n_cached);
    close_engines(&en);
}

/* Random traffic on a tight pool: prompts that continue, cut or branch off
 * earlier prompts + replies, in batches of 1-4 at once; every request must
 * equal the cold engine's, and every block come back. */
static void check_random_traffic(void) {
    enum { BS = 4, N_REQ = 48, MAXLEN = 90 };
    g4_engine_options opt = {.max_seqs = 3, .n_ctx = 96, .block_size = BS, .kv_blocks = 80, .max_batch_tokens = 20,
                             .cache_snapshots = 6};
    engines en;
    if (!open_engines("dense", &opt, &en)) return;
    const int V = en.m->config.text.vocab_size;
    static int32_t hist[N_REQ][MAXLEN + MAX_NEW];
    int hist_n[N_REQ];
    int n_hist = 0, reused = 0;
    unsigned x = 12345;
    for (int done = 0; done < N_REQ;) {
        x = x * 1103515245u + 12345u;
        int batch = 1 + (int)((x >> 16) % 4);
        if (batch > N_REQ - done) batch = N_REQ - done;
        static int32_t prompts[4][MAXLEN];
        request reqs[4];
        for (int b = 0; b < batch; b++) {
            int n = 0;
            prompts[b][n++] = 2;
            x = x * 1103515245u + 12345u;
            const unsigned kind = (x >> 16) % 4;
            if (n_hist > 0 && kind != 0) { /* from an earlier prompt + reply: all of it, or cut anywhere */
                int from = (int)((x >> 8) % (unsigned)n_hist);
                x = x * 1103515245u + 12345u;
                int keep = kind == 1 ? 1 + (int)((x >> 16) % (unsigned)hist_n[from]) : hist_n[from];
                if (keep > MAXLEN - 12) keep = MAXLEN - 12;
                memcpy(prompts[b], hist[from], (size_t)keep * sizeof(int32_t));
                n = keep;
            }
            x = x * 1103515245u + 12345u;
            int extra = 1 + (int)((x >> 16) % 11);
            for (int i = 0; i < extra; i++) prompts[b][n++] = text_token(x + (unsigned)i * 7919u, V);
            reqs[b] = (request){.prompt = prompts[b], .n = n};
        }
        collected got[4];
        both(&en, reqs, batch, got, "random");
        for (int b = 0; b < batch; b++) {
            reused += got[b].n_cached;
            if (reqs[b].n + got[b].n <= MAXLEN + MAX_NEW) {
                memcpy(hist[n_hist], reqs[b].prompt, (size_t)reqs[b].n * sizeof(int32_t));
                memcpy(hist[n_hist] + reqs[b].n, got[b].ids, (size_t)got[b].n * sizeof(int32_t));
                hist_n[n_hist++] = reqs[b].n + got[b].n;
            }
        }
        done += batch;
    }
    g4_engine_stats st;
    g4_engine_get_stats(en.warm, &st);
    printf("  random traffic: %d requests, %d prompt tokens reused, %llu hits, %llu blocks and %llu snapshots "
           "evicted\n", N_REQ, reused, (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_blocks_evicted,
           (unsigned long long)st.prefix_snapshots_evicted);
    CHECK(st.prefix_hits > 8 && reused > 150 && st.prefix_blocks_evicted > 0, "random traffic reused and evicted (%llu hits, %d tokens)",
          (unsigned long long)st.prefix_hits, reused);
    close_engines(&en);
}

int main(void) {
    check_conversation("dense", 0);
    check_conversation("e2b", 0); /* KV-shared layers */
    check_conversation("moe", 0);
    for (int t = G4_KV_BF16; t <= G4_KV_FP8; t++) { /* snapshots and reused blocks of each type */
        conv_kv_type = (g4_kv_type)t;
        check_conversation("e2b", 0);
        check_conversation("dense", 0);
    }
    conv_kv_type = G4_KV_F32;
    check_shared_prefix();
    check_eviction();
    /* the sanitizer build (G4_TEST_SANITIZED=1): fp8 only, the type with the most parts per block */
    const int sanitized = getenv("G4_TEST_SANITIZED") != NULL;
    for (int t = sanitized ? G4_KV_FP8 : G4_KV_F32; t <= G4_KV_FP8; t++) check_host_tier((g4_kv_type)t, 0);
    check_random_traffic();
    check_images(G4_VISION_MASK_DEFAULT);
    check_images(G4_VISION_MASK_ALL_LAYERS);
    /* the same conversations on CUDA where there is a GPU (the exact path there
     * is not batch-invariant: tokens must agree, log-probabilities closely) */
    check_conversation("dense", 1);
    check_conversation("e2b", 1);
    check_host_tier(G4_KV_F32, 1); /* f32: bf16's rounding of decode-computed vs prefilled K/V exceeds the gap bound */
    if (worst_logprob_gap > 0) printf("  CUDA: worst log-probability gap to the cold engine %.3g\n", worst_logprob_gap);
    return test_finish();
}
