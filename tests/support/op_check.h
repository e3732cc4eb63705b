/* Checking an op's output against its float64 reference (op_reference.h)
 * with a tolerance per op family, and the table of what each family reached.
 *
 * Two numbers per check (ref_compare): the relative RMS over the whole
 * output and the worst row's max |error| over that row's RMS. Each test
 * program names its families' tolerances in one table (op_tolerance); the
 * rule is about 3x the worst value reached over all its cases on the
 * machines it runs on, which the final table prints beside each tolerance
 * (the "3x" column) so that a tolerance can be re-derived after a change. */
#ifndef G4_TESTS_OP_CHECK_H
#define G4_TESTS_OP_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kv_cache.h"
#include "support/op_reference.h"
#include "test_util.h"

typedef struct {
    const char *op;
    double rel_rms, row_max;
} op_tolerance;

typedef struct {
    char op[48];
    double worst_rms, worst_row, tol_rms, tol_row;
    int cases;
} op_stat;

enum { OP_STATS_MAX = 160 };
static op_stat op_stats[OP_STATS_MAX];
static int n_op_stats;
static const op_tolerance *op_tolerances;
static int n_op_tolerances;

/* A double array of n (at least one) elements. */
static inline double *doubles(size_t n) { return malloc((n ? n : 1) * sizeof(double)); }

static inline void op_check_init(const op_tolerance *table, int n) {
    op_tolerances = table;
    n_op_tolerances = n;
}

static inline const op_tolerance *op_tolerance_of(const char *op) {
    for (int i = 0; i < n_op_tolerances; i++)
        if (!strcmp(op_tolerances[i].op, op)) return &op_tolerances[i];
    return NULL;
}

static inline void op_record(const char *op, double rms, double row, double tol_rms, double tol_row) {
    int i = 0;
    while (i < n_op_stats && strcmp(op_stats[i].op, op)) i++;
    if (i == OP_STATS_MAX) return;
    if (i == n_op_stats) {
        memset(&op_stats[i], 0, sizeof op_stats[i]);
        snprintf(op_stats[i].op, sizeof op_stats[i].op, "%s", op);
        n_op_stats++;
    }
    op_stat *s = &op_stats[i];
    if (rms > s->worst_rms) s->worst_rms = rms;
    if (row > s->worst_row) s->worst_row = row;
    s->tol_rms = tol_rms;
    s->tol_row = tol_row;
    s->cases++;
}

/* got [rows][cols] against want; prints one line, records the family's
 * worst, fails past the family's tolerance (or when it has none). */
static inline void op_check(const char *op, const char *what, const float *got, const double *want, size_t rows,
                            size_t cols) {
    const op_tolerance *t = op_tolerance_of(op);
    const ref_error e = ref_compare(got, want, rows, cols);
    CHECK(t != NULL, "%s: no tolerance in this test's table", op);
    if (!t) return;
    printf("  %-24s %-56s rel_rms %.2e (tol %.1e)  row max %.2e (tol %.1e)\n", op, what, e.rel_rms, t->rel_rms,
           e.row_max, t->row_max);
    CHECK(e.rel_rms <= t->rel_rms, "%s %s: rel_rms %.3e above %.1e", op, what, e.rel_rms, t->rel_rms);
    CHECK(e.row_max <= t->row_max, "%s %s: a row's max error %.3e of its RMS, above %.1e", op, what, e.row_max,
          t->row_max);
    op_record(op, e.rel_rms, e.row_max, t->rel_rms, t->row_max);
}

/* An exact op (copies, kv_store of f32...): every element equal to the reference. */
static inline void op_check_exact(const char *op, const char *what, const float *got, const double *want, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += (double)got[i] != want[i];
    printf("  %-24s %-56s %s\n", op, what, bad ? "DIFFERS" : "exact");
    CHECK(bad == 0, "%s %s: %zu of %zu elements differ from the reference", op, what, bad, n);
    op_record(op, bad ? 1.0 : 0.0, bad ? 1.0 : 0.0, 0, 0);
}

/* One step of `type` at the magnitude of v (bf16: 8 significant bits; fp8
 * e4m3: 4, subnormal below 2^-6, in units of the row's scale). */
static inline double kv_step(double v, g4_kv_type type, double scale) {
    const double a = fabs(v);
    if (type == G4_KV_BF16) return a > 0 ? ldexp(1.0, ilogb(a) - 7) : 0;
    const double u = a / scale;
    return scale * (u < ldexp(1.0, -6) ? ldexp(1.0, -9) : ldexp(1.0, ilogb(u) - 3));
}

/* got [rows][D] (what the cache returns) against the reference's rounding
 * of x, code by code (fp8 values also differ by the float32 rounding of the
 * row's scale: far below a step). f32, and bf16 of the op's own input
 * (exact), must equal it; otherwise (computed values) every value must be
 * within one step plus 1e-6 of the row's peak (the computation's own error,
 * which near zero is more than a step) and at most 1 in 1000 off the
 * reference's code (values that straddle a rounding point). */
static inline void op_check_rounded(const char *what, const float *got, const float *x, size_t rows, int D, g4_kv_type type,
                         int exact) {
    double *want = doubles((size_t)D);
    size_t off = 0, beyond = 0;
    for (size_t r = 0; r < rows; r++) {
        ref_kv_round(want, x + r * D, D, type);
        double peak = 0;
        for (int d = 0; d < D; d++) peak = fabs(x[r * D + d]) > peak ? fabs(x[r * D + d]) : peak;
        for (int d = 0; d < D; d++) {
            const double diff = fabs(got[r * D + d] - want[d]);
            const double step = type == G4_KV_F32 ? 0 : kv_step(want[d], type, peak / 448.0);
            if (!(diff <= 1e-3 * step)) off++; /* (NaN counts) */
            if (!(diff <= 1.0001 * step + 1e-6 * peak)) beyond++;
        }
    }
    const size_t n = rows * (size_t)D;
    const int strict = type == G4_KV_F32 || (type == G4_KV_BF16 && exact);
    printf("  %-24s %-56s %zu of %zu values off the reference's rounding (%zu by more than a step)\n", "kv stored", what,
           off, n, beyond);
    CHECK(beyond == 0 && (strict ? off == 0 : off * 1000 <= n),
          "%s: %zu values off the reference's %s rounding, %zu beyond a step", what, off, g4_kv_type_name(type), beyond);
    free(want);
}

static inline void op_report(void) {
    printf("\n| op | cases | worst rel_rms | tolerance | 3x | worst row max | tolerance | 3x |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n_op_stats; i++) {
        const op_stat *s = &op_stats[i];
        printf("| %s | %d | %.2e | %.1e | %.1e | %.2e | %.1e | %.1e |\n", s->op, s->cases, s->worst_rms, s->tol_rms,
               3 * s->worst_rms, s->worst_row, s->tol_row, 3 * s->worst_row);
    }
}

#endif
