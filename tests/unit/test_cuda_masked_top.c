/* The CUDA top_logits_masked op (constrained decoding, issue 31) against the
 * CPU op: ids exactly (-1 for a masked row's -inf slots), values bitwise,
 * lse within 1e-6 relative (the GPU sums partials in float, the CPU in its
 * own order), NaN rows NaN. Rows of the full 262,144-token vocabulary and
 * odd sizes; masks from empty through a few tokens (the structural steps of
 * a JSON grammar) to nearly all, of the matcher's 262,145-token width and
 * narrower than the row; rows without a mask among masked ones; a NaN
 * outside a mask (masked away) and inside one; ties. Exits 77 (skipped)
 * without a usable GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "test_util.h"

static g4_backend *gpu, *cpu;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double uniform01(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; }

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

static void fill_mask(uint32_t *mask, int words, double density) {
    memset(mask, 0, (size_t)words * sizeof *mask);
    for (int i = 0; i < words * 32; i++)
        if (density >= 1 || uniform01() < density) mask[i >> 5] |= 1u << (i & 31);
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
    for (int m = 0; m < n_masks; m++) fill_mask(masks + (size_t)m * mask_words, mask_words, density[m]);
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

int main(void) {
    g4_status st = g4_backend_cuda_create(0, &gpu);
    if (st == G4_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", g4_error_message());
        return 77;
    }
    CHECK(st == G4_OK, "CUDA backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    st = g4_backend_cpu_create(0, &cpu);
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
    g4_backend_destroy(gpu);
    g4_backend_destroy(cpu);
    return test_finish();
}
