/* The best k entries of a float vector (by value, ties to the lower id),
 * one implementation for the sampler and the CPU backend's top_logits op. */
#ifndef G4_TENSOR_TOP_K_H
#define G4_TENSOR_TOP_K_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float v;
    int32_t id;
} g4_scored;

/* a ranks below b: smaller value, or equal value and larger id */
static inline int g4_scored_below(g4_scored a, g4_scored b) { return a.v < b.v || (a.v == b.v && a.id > b.id); }

/* Restores the min-heap order of h[0..n) below i (root: the lowest ranked). */
void g4_heap_sift_down(g4_scored *h, size_t n, size_t i);

/* The best k (1 <= k <= n) entries of x into h[0..k) as a min-heap (root:
 * the k-th best); a later equal value never displaces a lower id. */
void g4_top_k_heap(const float *x, size_t n, g4_scored *h, size_t k);

/* qsort order: best first (larger value, then lower id) */
int g4_scored_best_first(const void *a, const void *b);

#endif
