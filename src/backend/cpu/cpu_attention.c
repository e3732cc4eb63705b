#include "backend/cpu/cpu_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *k, *v; /* [n_blocks * block_size][n_kv_heads][head_dim] */
    int n_blocks, block_size, n_kv_heads, head_dim;
} cpu_kv;

void *cpu_kv_alloc(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim) {
    (void)be;
    cpu_kv *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    size_t n = (size_t)n_blocks * block_size * n_kv_heads * head_dim;
    c->k = calloc(n ? n : 1, sizeof *c->k);
    c->v = calloc(n ? n : 1, sizeof *c->v);
    if (!c->k || !c->v) {
        free(c->k);
        free(c->v);
        free(c);
        return NULL;
    }
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = head_dim;
    return c;
}

void cpu_kv_free(g4_backend *be, void *kv) {
    (void)be;
    cpu_kv *c = kv;
    if (!c) return;
    free(c->k);
    free(c->v);
    free(c);
}

/* Pool slot of (sequence row, position) through the block tables. */
static size_t slot_of(const g4_attn_batch *b, int seq, int pos, int sliding) {
    int logical = pos / b->block_size;
    int block = sliding ? b->sliding_tables[(size_t)seq * b->ring_blocks + logical % b->ring_blocks]
                        : b->full_tables[(size_t)seq * b->full_table_stride + logical];
    return (size_t)block * b->block_size + (size_t)(pos % b->block_size);
}

void cpu_kv_store(g4_backend *be, void *kv, const float *k, const float *v, const g4_attn_batch *b, int sliding) {
    (void)be;
    cpu_kv *c = kv;
    size_t row = (size_t)c->n_kv_heads * c->head_dim;
    for (int t = 0; t < b->n_tokens; t++) {
        size_t s = slot_of(b, b->seq[t], b->pos[t], sliding);
        memcpy(c->k + s * row, k + (size_t)t * row, row * sizeof(float));
        memcpy(c->v + s * row, v + (size_t)t * row, row * sizeof(float));
    }
}

void cpu_kv_read(g4_backend *be, const void *kv, float *k, float *v, const g4_attn_batch *b, int sliding) {
    (void)be;
    const cpu_kv *c = kv;
    size_t row = (size_t)c->n_kv_heads * c->head_dim;
    for (int t = 0; t < b->n_tokens; t++) {
        size_t s = slot_of(b, b->seq[t], b->pos[t], sliding);
        memcpy(k + (size_t)t * row, c->k + s * row, row * sizeof(float));
        memcpy(v + (size_t)t * row, c->v + s * row, row * sizeof(float));
    }
}

void cpu_kv_slot_rows(void *kv, const g4_attn_batch *b, int t, int sliding, float **k, float **v) {
    cpu_kv *c = kv;
    size_t row = (size_t)c->n_kv_heads * c->head_dim;
    size_t s = slot_of(b, b->seq[t], b->pos[t], sliding);
    *k = c->k + s * row;
    *v = c->v + s * row;
}

void cpu_attention(g4_backend *be, float *out, const float *q, const void *kv, const g4_attn_batch *b,
                   int sliding, int n_heads, float scale) {
    (void)be;
    const cpu_kv *c = kv;
    const int D = c->head_dim, Hkv = c->n_kv_heads;
    const int group = n_heads / Hkv;
    const size_t kv_row = (size_t)Hkv * D;
    int max_span = 1;
    for (int t = 0; t < b->n_tokens; t++) {
        const int32_t *r = b->kv_range + 4 * t + (sliding ? 0 : 2);
        if (r[1] - r[0] + 1 > max_span) max_span = r[1] - r[0] + 1;
    }
#pragma omp parallel
    {
        double *scores = malloc((size_t)max_span * sizeof *scores);
        size_t *slots = malloc((size_t)max_span * sizeof *slots);
        double *acc = malloc((size_t)D * sizeof *acc);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int t = 0; t < b->n_tokens; t++) {
            for (int h = 0; h < n_heads; h++) {
                const int32_t *r = b->kv_range + 4 * t + (sliding ? 0 : 2);
                const int lo = r[0], n = r[1] - r[0] + 1;
                const float *qh = q + ((size_t)t * n_heads + h) * D;
                float *oh = out + ((size_t)t * n_heads + h) * D;
                const int kvh = h / group;
                double max_score = -INFINITY;
                for (int j = 0; j < n; j++) {
                    slots[j] = slot_of(b, b->seq[t], lo + j, sliding);
                    const float *kj = c->k + slots[j] * kv_row + (size_t)kvh * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += (double)qh[d] * kj[d];
                    scores[j] = dot * scale;
                    if (scores[j] > max_score) max_score = scores[j];
                }
                double total = 0;
                for (int j = 0; j < n; j++) {
                    scores[j] = exp(scores[j] - max_score);
                    total += scores[j];
                }
                for (int d = 0; d < D; d++) acc[d] = 0;
                for (int j = 0; j < n; j++) {
                    const float *vj = c->v + slots[j] * kv_row + (size_t)kvh * D;
                    double p = scores[j] / total;
                    for (int d = 0; d < D; d++) acc[d] += p * vj[d];
                }
                for (int d = 0; d < D; d++) oh[d] = (float)acc[d];
                if (n <= 0)
                    for (int d = 0; d < D; d++) oh[d] = 0;
            }
        }
        free(scores);
        free(slots);
        free(acc);
    }
}
