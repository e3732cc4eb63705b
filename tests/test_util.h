/* A tiny test harness: CHECK(...) records failures without stopping, and
 * test_finish() prints "N passed, N failed" (the line CI reads) and returns
 * the exit status. Helpers load fixtures and compare float arrays. */
#ifndef G4_TEST_UTIL_H
#define G4_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed, test_failed;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond) {                                                            \
            test_passed++;                                                     \
        } else {                                                               \
            test_failed++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
        }                                                                      \
    } while (0)

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}

/* Path of a vendored fixture folder (G4_FIXTURES is set by ctest). */
static inline const char *test_fixture(const char *name) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("G4_FIXTURES");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : "build/fixtures", name);
    return b;
}

static inline const char *test_tmp_path(const char *name) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("G4_TMP");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : "/tmp", name);
    return b;
}

/* ||a-b|| / ||b||, computed in double; NaN anywhere gives +inf. */
static inline double test_rel_rms(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline double test_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

#endif
