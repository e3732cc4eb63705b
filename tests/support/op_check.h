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

#include <stdio.h>
#include <string.h>

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
