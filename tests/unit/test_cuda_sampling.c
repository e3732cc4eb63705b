/* The CUDA backend's sampling support (top_logits: the k largest logits of
 * each row, ordered by value then id, and the row's log-sum-exp) against the
 * float64 reference (tests/support/op_reference.c): the 262144-logit LM head
 * at k = 1, 40, 64, 1024, rows of ties (quarters, +0 and -0; 90% one
 * value), odd vocabularies (fewer logits than k, chunks that do not divide
 * the row) and rows holding a NaN. Ids must equal the reference's, values
 * its bits. Exits 77 (skipped) without a usable GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/cuda_harness.h"

/* lse, relative (absolute near 0): provisional, the bound this test used
 * against the CPU backend, until an H200 run gives the reached value */
static const double lse_tol = 1e-6;

/* Random logits in [-30, 30]; ties: 1 rounds them to quarters (thousands of
 * equal values, +0 and -0 among them), 2 makes most of the row one value. */
static float *top_logits_input(int rows, int vocab, int ties) {
    float *x = rand_floats((size_t)rows * vocab, 0.001f, 30.0f);
    for (size_t i = 0; i < (size_t)rows * vocab; i++) {
        if (ties == 1) x[i] = roundf(x[i] * 4.0f) / 4.0f; /* small magnitudes round to +0 or -0 */
        if (ties == 2 && rand_int(10)) x[i] = 7.25f;
    }
    return x;
}

/* The op against the reference: ids exactly, values bitwise, lse within
 * lse_tol relative; a row with a NaN must give lse NaN (the rest is
 * unspecified). */
static void check_top_logits(int rows, int vocab, int k, int ties, int nan_row) {
    float *x = top_logits_input(rows, vocab, ties);
    if (nan_row >= 0) x[(size_t)nan_row * vocab + vocab / 2] = NAN;
    const size_t nk = (size_t)rows * k;
    int32_t *want_ids = malloc(nk * 4), *got_ids = malloc(nk * 4);
    float *want_v = malloc(nk * 4), *got_v = malloc(nk * 4);
    double *want_lse = malloc((size_t)rows * 8), *got_lse = malloc((size_t)rows * 8);
    ref_top_logits(want_ids, want_v, want_lse, x, rows, vocab, k);
    float *dx = up(x, (size_t)rows * vocab * 4), *dv = poisoned(nk);
    int32_t *di = (int32_t *)poisoned(nk);
    double *dl = (double *)poisoned((size_t)rows * 2);
    gpu->ops->top_logits(gpu, di, dv, dl, dx, rows, vocab, k);
    gpu->ops->to_host(gpu, got_ids, di, nk * 4);
    gpu->ops->to_host(gpu, got_v, dv, nk * 4);
    gpu->ops->to_host(gpu, got_lse, dl, (size_t)rows * 8);
    double worst = 0;
    int ids_ok = 1, values_ok = 1, lse_ok = 1;
    for (int r = 0; r < rows; r++) {
        if (r == nan_row) {
            lse_ok &= isnan(got_lse[r]);
            continue;
        }
        ids_ok &= !memcmp(got_ids + (size_t)r * k, want_ids + (size_t)r * k, (size_t)k * 4);
        values_ok &= !memcmp(got_v + (size_t)r * k, want_v + (size_t)r * k, (size_t)k * 4);
        double err = fabs(got_lse[r] - want_lse[r]) / fmax(fabs(want_lse[r]), 1.0); /* relative, absolute near 0 */
        if (!(err <= worst)) worst = err; /* NaN counts as worst */
    }
    lse_ok &= worst <= lse_tol;
    char what[128];
    snprintf(what, sizeof what, "%d x %d, k=%d%s%s", rows, vocab, k, ties == 1 ? ", quarters" : ties == 2 ? ", 90% equal" : "",
             nan_row >= 0 ? ", a NaN row" : "");
    printf("  %-12s %-52s ids %s, values %s, lse rel %.2e\n", "top_logits", what, ids_ok ? "equal" : "DIFFER",
           values_ok ? "bitwise" : "DIFFER", worst);
    CHECK(ids_ok, "top_logits %s: ids differ from the reference", what);
    CHECK(values_ok, "top_logits %s: values differ from the reference", what);
    CHECK(lse_ok, "top_logits %s: lse off by %.3e relative (or a NaN row without NaN)", what, worst);
    op_record("top_logits lse", worst, 0, lse_tol, 0);
    release(dx), release(dv), release(di), release(dl);
    free(x), free(want_ids), free(got_ids), free(want_v), free(got_v), free(want_lse), free(got_lse);
}

static void test_top_logits(void) {
    const int ks[] = {1, 40, 64, 1024};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++) {
            check_top_logits(1, 262144, ks[i], t, -1);
            check_top_logits(8, 262144, ks[i], t, -1);
        }
    /* odd sizes: fewer logits than k, chunks that do not divide the row */
    const int vocabs[] = {1, 7, 1000, 4099, 100003};
    for (int v = 0; v < 5; v++)
        for (int i = 0; i < 4; i++) check_top_logits(3, vocabs[v], ks[i], v % 2, -1);
    check_top_logits(8, 262144, 40, 0, 5);
    check_top_logits(8, 262144, 1, 1, 0);
    check_top_logits(2, 1000, 1024, 2, 1);
}

int main(void) {
    const int rc = harness_open();
    if (rc) return rc == 77 ? 77 : test_finish();
    test_top_logits();
    op_report();
    return harness_close();
}
