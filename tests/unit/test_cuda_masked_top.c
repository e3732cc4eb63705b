/* The CUDA top_logits_masked op (constrained decoding, issue 31) against the
 * CPU op: ids exactly (-1 for a masked row's -inf slots), values bitwise,
 * lse within 1e-6 relative (the GPU sums partials in float, the CPU in its
 * own order), NaN rows NaN. Rows of the full 262,144-token vocabulary and
 * odd sizes; masks from empty through a few tokens (the structural steps of
 * a JSON grammar) to nearly all, of the matcher's 262,145-token width and
 * narrower than the row; rows without a mask among masked ones; a NaN
 * outside a mask (masked away) and inside one; ties.
 *
 * Then the engine on the GPU: the bundled model's JSON Schema requests run
 * with the masks on the device and again on the host path (the backend's
 * masked op hidden: full rows masked and sampled on the host), greedy and
 * sampled: the same tokens (the candidates carry the logits' own bits) and
 * log-probabilities within 1e-4 (the device's lse against the host's sum);
 * every constrained row decided on the device. Exits 77 (skipped) without a
 * usable GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "support/candidates.h"
#include "support/constrained_engine.h"
#include "support/cuda_device.h"
#include "test_util.h"

static g4_backend *gpu, *cpu;

static void *up(const void *host, size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes ? bytes : 4);
    if (d && bytes) gpu->ops->to_device(gpu, d, host, bytes);
    return d;
}

/* a device buffer of NaN bytes, so that a slot the op leaves unwritten shows */
static void *poisoned(size_t bytes) {
    void *h = malloc(bytes);
    memset(h, 0xff, bytes);
    void *d = up(h, bytes);
    free(h);
    return d;
}

/* rows logit rows, row r through mask r % n_masks (none for every fifth) */
static void check(int rows, int vocab, int k, int mask_words, const double *density, int n_masks, int ties,
                  long nan_at) {
    float *x = malloc((size_t)rows * vocab * sizeof *x);
    for (size_t i = 0; i < (size_t)rows * vocab; i++) {
        float v = (float)((uniform01() * 2 - 1) * 30);
        if (ties == 1) v = roundf(v * 4) / 4;
        if (ties == 2 && next_u64() % 10) v = 7.25f;
        x[i] = v;
    }
    if (nan_at >= 0) x[nan_at] = NAN;
    uint32_t *masks = malloc((size_t)n_masks * mask_words * sizeof *masks);
    for (int m = 0; m < n_masks; m++) random_mask(masks + (size_t)m * mask_words, mask_words, density[m]);
    int32_t *slot = malloc((size_t)rows * sizeof *slot);
    for (int r = 0; r < rows; r++) slot[r] = r % 5 == 4 ? -1 : r % n_masks;
    const size_t nk = (size_t)rows * k;
    int32_t *want_ids = malloc(nk * 4), *got_ids = malloc(nk * 4);
    float *want_v = malloc(nk * 4), *got_v = malloc(nk * 4);
    double *want_lse = malloc((size_t)rows * 8), *got_lse = malloc((size_t)rows * 8);
    cpu->ops->top_logits_masked(cpu, want_ids, want_v, want_lse, x, rows, vocab, k, masks, mask_words, slot);
    float *dx = up(x, (size_t)rows * vocab * 4), *dv = poisoned(nk * 4);
    uint32_t *dm = up(masks, (size_t)n_masks * mask_words * 4);
    int32_t *ds = up(slot, (size_t)rows * 4), *di = poisoned(nk * 4);
    double *dl = poisoned((size_t)rows * 8);
    gpu->ops->top_logits_masked(gpu, di, dv, dl, dx, rows, vocab, k, dm, mask_words, ds);
    gpu->ops->to_host(gpu, got_ids, di, nk * 4);
    gpu->ops->to_host(gpu, got_v, dv, nk * 4);
    gpu->ops->to_host(gpu, got_lse, dl, (size_t)rows * 8);
    double worst = 0;
    int ids_ok = 1, values_ok = 1, nan_ok = 1;
    for (int r = 0; r < rows; r++) {
        if (isnan(want_lse[r])) { /* the CPU saw a NaN the mask lets through */
            nan_ok &= isnan(got_lse[r]) != 0;
            continue;
        }
        ids_ok &= !memcmp(got_ids + (size_t)r * k, want_ids + (size_t)r * k, (size_t)k * 4);
        values_ok &= !memcmp(got_v + (size_t)r * k, want_v + (size_t)r * k, (size_t)k * 4);
        double err = want_lse[r] == got_lse[r] ? 0 : fabs(got_lse[r] - want_lse[r]) / fmax(fabs(want_lse[r]), 1.0);
        if (!(err <= worst)) worst = err; /* NaN counts as worst */
    }
    char what[160];
    snprintf(what, sizeof what, "%d x %d, k=%d, %d-word masks %g..%g%s%s", rows, vocab, k, mask_words, density[0],
             density[n_masks - 1], ties == 1 ? ", quarters" : ties == 2 ? ", 90%% equal" : "",
             nan_at >= 0 ? ", a NaN" : "");
    printf("  %-70s ids %s, values %s, lse rel %.2e\n", what, ids_ok ? "equal" : "DIFFER",
           values_ok ? "bitwise" : "DIFFER", worst);
    CHECK(ids_ok, "masked top_logits %s: ids differ from the CPU", what);
    CHECK(values_ok, "masked top_logits %s: values differ from the CPU", what);
    CHECK(worst <= 1e-6 && nan_ok, "masked top_logits %s: lse off by %.3e relative (or NaN lost)", what, worst);
    gpu->ops->release(gpu, dx), gpu->ops->release(gpu, dv), gpu->ops->release(gpu, dm);
    gpu->ops->release(gpu, ds), gpu->ops->release(gpu, di), gpu->ops->release(gpu, dl);
    free(x), free(masks), free(slot), free(want_ids), free(got_ids), free(want_v), free(got_v), free(want_lse);
    free(got_lse);
}

/* ---- the engine on the GPU: masks on the device against the host path ---- */

#define MAX_NEW 40
#define N_REQ 3

/* the person schema's requests */
static const constrained_run_options opts = {.max_new = MAX_NEW};

static void test_engine(void) {
    g4_context *c = constrained_model_open("cuda", 0);
    if (!c) return;
    g4_prompt p;
    constrained_prompt(c, "Who was Methuselah? Answer in JSON.", &p);
    g4_backend *with_masks = c->model->backend;
    host_path_backend host_only;
    host_path_backend_init(&host_only, with_masks);
    for (int u = 0; u < 3; u++) {
        g4_sampler_params sp;
        g4_sampler_params_default(&sp);
        if (u > 0) sp.temperature = 1.0f, sp.top_k = u == 1 ? 64 : 0, sp.top_p = 0.95f;
        sp.logprobs = 1;
        sp.top_logprobs = 3;
        sp.seed = 900 + (uint64_t)u * 10;
        constrained_reply device[N_REQ], host[N_REQ];
        g4_engine_stats sd, sh;
        constrained_run(c, &p, &opts, &sp, N_REQ, device, &sd);
        c->model->backend = &host_only.backend;
        constrained_run(c, &p, &opts, &sp, N_REQ, host, &sh);
        c->model->backend = with_masks;
        double worst = 0;
        int same = 1, tokens = 0;
        for (int i = 0; i < N_REQ; i++) {
            same &= device[i].n == host[i].n && device[i].finish == host[i].finish;
            for (int t = 0; same && t < device[i].n; t++) {
                const g4_sample *a = &device[i].samples[t], *b = &host[i].samples[t];
                same &= a->token == b->token && a->n_top == b->n_top;
                double d = fabs((double)a->logprob - (double)b->logprob);
                for (int j = 0; same && j < a->n_top; j++) {
                    same &= a->top[j].id == b->top[j].id;
                    const double dj = a->top[j].logprob == b->top[j].logprob
                                          ? 0
                                          : fabs((double)a->top[j].logprob - (double)b->top[j].logprob);
                    d = dj > d ? dj : d;
                }
                if (!(d <= worst)) worst = d;
            }
            tokens += device[i].n;
        }
        printf("  engine on the GPU, %s: %d tokens %s the host path's, log-probabilities within %.2e; %llu masked "
               "rows, %llu uploads, %llu on the host\n",
               u == 0 ? "greedy" : u == 1 ? "T 1 top-k 64" : "T 1 no top-k", tokens, same ? "equal" : "DIFFER from",
               worst, (unsigned long long)sd.masked_rows, (unsigned long long)sd.mask_uploads,
               (unsigned long long)sd.masked_rows_on_host);
        CHECK(same && worst <= 1e-4, "engine on the GPU, setup %d: masks on the device differ from the host path", u);
        CHECK(sh.masked_rows == 0 && sh.masked_rows_on_host > 0, "setup %d: the host run took the host path", u);
        CHECK(sd.masked_rows > 0 && (u == 2 || sd.masked_rows_on_host == 0),
              "setup %d: the constrained rows were decided on the device", u);
    }
    g4_prompt_free(c, &p);
    g4_context_close(c);
}

int main(void) {
    rng_state = 0x9E3779B97F4A7C15ull; /* this test's stream (support/test_random.h) */
    const int rc = cuda_device_open(&gpu);
    if (rc) return rc == 77 ? 77 : test_finish();
    g4_status st = g4_backend_cpu_create(0, &cpu);
    CHECK(st == G4_OK, "CPU backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    const int V = 262144, W = 8193; /* the matcher's 262,145 ids */
    const double json[4] = {0, 0.00002, 0.0005, 0.02}; /* none, a few, ~130, ~5,000 tokens */
    const double wide[3] = {0.3, 0.97, 1};
    const int ks[] = {1, 5, 44, 256, 1024};
    for (int i = 0; i < 5; i++) {
        check(8, V, ks[i], W, json, 4, 0, -1);
        check(8, V, ks[i], W, wide, 3, i % 3, -1);
    }
    /* odd sizes, masks narrower than the row (the rest not allowed) */
    const int vocabs[] = {7, 1000, 4099, 100003};
    const double mixed[3] = {0.01, 0.5, 1};
    for (int v = 0; v < 4; v++)
        for (int i = 0; i < 5; i++) {
            check(5, vocabs[v], ks[i], (vocabs[v] + 31) / 32, mixed, 3, v % 2, -1);
            check(5, vocabs[v], ks[i], vocabs[v] / 64 + 1, mixed, 3, 0, -1);
        }
    /* a NaN in row 0 (mask 0: allows none, so masked away) and in row 2 (mask 2: all) */
    const double edge[3] = {0, 0.5, 1};
    check(6, V, 40, W, edge, 3, 0, 12345);
    check(6, V, 40, W, edge, 3, 0, 2L * V + 777);
    check(6, V, 1, W, edge, 3, 0, 2L * V + 777);
    CHECK(gpu->ops->status(gpu) == G4_OK, "no CUDA failure recorded: %s", g4_error_message());
    test_engine();
    g4_backend_destroy(gpu);
    g4_backend_destroy(cpu);
    return test_finish();
}
