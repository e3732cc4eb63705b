#include "backend/cpu/cpu_sampling.h"

#include <math.h>
#include <stdlib.h>

#include "tensor/logsumexp.h"

typedef struct {
    float v;
    int32_t id;
} ranked;

/* a ranks below b: smaller value, or equal value and larger id */
static int ranks_below(ranked a, ranked b) { return a.v < b.v || (a.v == b.v && a.id > b.id); }

static void sift_down(ranked *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_below(h[l], h[m])) m = l;
        if (r < n && ranks_below(h[r], h[m])) m = r;
        if (m == i) return;
        ranked t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int descending(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The best k (<= n) of x by a size-k min-heap (root = the k-th best): a
 * later equal value never displaces a lower id. Then sorted best first. */
static void best_k(const float *x, int n, ranked *h, int k) {
    for (int i = 0; i < k; i++) h[i] = (ranked){x[i], i};
    for (int i = k / 2; i-- > 0;) sift_down(h, k, i);
    for (int i = k; i < n; i++)
        if (x[i] > h[0].v) {
            h[0] = (ranked){x[i], i};
            sift_down(h, k, 0);
        }
    qsort(h, (size_t)k, sizeof *h, descending);
}

static void one_row(int32_t *ids, float *values, double *lse, const float *x, int vocab, int k, ranked *heap) {
    unsigned bad = 0;
#pragma omp simd reduction(+ : bad)
    for (int i = 0; i < vocab; i++) bad += x[i] != x[i];
    const int kept = k < vocab ? k : vocab;
    if (bad) {
        *lse = NAN;
        for (int j = 0; j < k; j++) ids[j] = -1, values[j] = NAN;
        return;
    }
    best_k(x, vocab, heap, kept);
    for (int j = 0; j < kept; j++) ids[j] = heap[j].id, values[j] = heap[j].v;
    for (int j = kept; j < k; j++) ids[j] = -1, values[j] = -INFINITY;
    const float m = g4_max_of(x, (size_t)vocab);
    /* the same call as the sampler's, so its log-probabilities match bit for bit */
    *lse = isinf(m) ? (double)m : g4_log_sum_exp(x, (size_t)vocab, m);
}

void cpu_top_logits(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                    int vocab, int k) {
    (void)be;
    if (rows <= 0 || k <= 0 || vocab <= 0) return;
    const int kept = k < vocab ? k : vocab;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int r = 0; r < rows; r++) {
        ranked *heap = malloc((size_t)kept * sizeof *heap);
        if (!heap) { /* the op cannot fail: a row without memory reads as NaN */
            lse[r] = NAN;
            continue;
        }
        one_row(ids + (size_t)r * k, values + (size_t)r * k, lse + r, logits + (size_t)r * vocab, vocab, k, heap);
        free(heap);
    }
}
