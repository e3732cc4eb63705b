#include "tensor/top_k.h"

#include <math.h>

void g4_heap_sift_down(g4_scored *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && g4_scored_below(h[l], h[m])) m = l;
        if (r < n && g4_scored_below(h[r], h[m])) m = r;
        if (m == i) return;
        g4_scored t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* x[i] into the heap if it beats the root */
static void offer(const float *x, size_t i, g4_scored *h, size_t k) {
    if (x[i] > h[0].v) {
        h[0] = (g4_scored){x[i], (int32_t)i};
        g4_heap_sift_down(h, k, 0);
    }
}

void g4_top_k_heap(const float *x, size_t n, g4_scored *h, size_t k) {
    for (size_t i = 0; i < k; i++) h[i] = (g4_scored){x[i], (int32_t)i};
    for (size_t i = k / 2; i-- > 0;) g4_heap_sift_down(h, k, i);
    /* blocks of 16 whose maximum does not beat the root are skipped (a
     * vectorised max instead of 16 compares and branches) */
    const size_t block = 16;
    size_t i = k;
    for (; i < n && i % block; i++) offer(x, i, h, k);
    for (; i + block <= n; i += block) {
        float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
        for (size_t j = 0; j < block; j++) bm = x[i + j] > bm ? x[i + j] : bm;
        if (!(bm > h[0].v)) continue; /* equal values never displace a lower id */
        for (size_t j = i; j < i + block; j++) offer(x, j, h, k);
    }
    for (; i < n; i++) offer(x, i, h, k);
}

int g4_scored_best_first(const void *a, const void *b) {
    const g4_scored *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}
