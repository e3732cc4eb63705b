#include "backend/cpu/cpu_sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/logsumexp.h"
#include "tensor/top_k.h"

static void one_row(int32_t *ids, float *values, double *lse, const float *x, int vocab, int k, g4_scored *heap) {
    unsigned bad = 0;
#pragma omp simd reduction(+ : bad)
    for (int i = 0; i < vocab; i++) bad += x[i] != x[i];
    const int kept = k < vocab ? k : vocab;
    if (bad) {
        *lse = NAN;
        for (int j = 0; j < k; j++) ids[j] = -1, values[j] = NAN;
        return;
    }
    /* the best `kept`, best first */
    g4_top_k_heap(x, (size_t)vocab, heap, (size_t)kept);
    qsort(heap, (size_t)kept, sizeof *heap, g4_scored_best_first);
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
        g4_scored *heap = malloc((size_t)kept * sizeof *heap);
        if (!heap) { /* the op cannot fail: a row without memory reads as NaN */
            lse[r] = NAN;
            continue;
        }
        one_row(ids + (size_t)r * k, values + (size_t)r * k, lse + r, logits + (size_t)r * vocab, vocab, k, heap);
        free(heap);
    }
}

/* The row with every token outside the mask at -inf, into out[vocab]
 * (words of none or all 32 tokens, most of a grammar's, in one go). */
static void masked_row(float *out, const float *x, int vocab, const uint32_t *mask, int mask_words) {
    const int covered = mask_words * 32 < vocab ? mask_words * 32 : vocab;
    for (int w = 0; w * 32 < covered; w++) {
        const uint32_t bits = mask[w];
        const int lo = w * 32, end = lo + 32 < covered ? lo + 32 : covered;
        if (bits == 0) {
            for (int i = lo; i < end; i++) out[i] = -INFINITY;
        } else if (bits == 0xffffffffu) {
            memcpy(out + lo, x + lo, (size_t)(end - lo) * sizeof *out);
        } else {
            for (int i = lo; i < end; i++) out[i] = (bits >> (i & 31)) & 1 ? x[i] : -INFINITY;
        }
    }
    for (int i = covered; i < vocab; i++) out[i] = -INFINITY;
}

void cpu_top_logits_masked(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                           int vocab, int k, const uint32_t *masks, int mask_words, const int32_t *slot) {
    (void)be;
    if (rows <= 0 || k <= 0 || vocab <= 0) return;
    const int kept = k < vocab ? k : vocab;
#pragma omp parallel if (rows > 1)
    {
        /* one masked row and heap per thread for the whole call */
        g4_scored *heap = malloc((size_t)kept * sizeof *heap);
        float *row = malloc((size_t)vocab * sizeof *row);
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            if (!heap || !row) { /* the op cannot fail: a row without memory reads as NaN */
                lse[r] = NAN;
                continue;
            }
            const float *x = logits + (size_t)r * vocab;
            /* the masked row itself, so that every value and the lse are the
             * bits top_logits (and the sampler) give for it */
            if (slot[r] >= 0) masked_row(row, x, vocab, masks + (size_t)slot[r] * mask_words, mask_words);
            int32_t *ri = ids + (size_t)r * k;
            float *rv = values + (size_t)r * k;
            one_row(ri, rv, lse + r, slot[r] >= 0 ? row : x, vocab, k, heap);
            if (slot[r] >= 0)
                for (int j = 0; j < k; j++)
                    if (rv[j] == -INFINITY) ri[j] = -1;
        }
        free(heap), free(row);
    }
}
