#include "backend/cpu/cpu_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_matmul.h"

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

void cpu_kv_copy_blocks(g4_backend *be, void *kv, const int32_t *src, const int32_t *dst, int n) {
    (void)be;
    cpu_kv *c = kv;
    const size_t block = (size_t)c->block_size * c->n_kv_heads * c->head_dim * sizeof *c->k;
    for (int i = 0; i < n;) {
        /* runs of consecutive blocks on both sides in one copy */
        int run = 1;
        while (i + run < n && src[i + run] == src[i] + run && dst[i + run] == dst[i] + run) run++;
        memcpy((char *)c->k + dst[i] * block, (const char *)c->k + src[i] * block, run * block);
        memcpy((char *)c->v + dst[i] * block, (const char *)c->v + src[i] * block, run * block);
        i += run;
    }
}

void cpu_kv_slot_rows(void *kv, const g4_attn_batch *b, int t, int sliding, float **k, float **v) {
    cpu_kv *c = kv;
    size_t row = (size_t)c->n_kv_heads * c->head_dim;
    size_t s = slot_of(b, b->seq[t], b->pos[t], sliding);
    *k = c->k + s * row;
    *v = c->v + s * row;
}

static int max_kv_span(const g4_attn_batch *b, int sliding) {
    int max_span = 1;
    for (int t = 0; t < b->n_tokens; t++) {
        const int32_t *r = b->kv_range + 4 * t + (sliding ? 0 : 2);
        if (r[1] - r[0] + 1 > max_span) max_span = r[1] - r[0] + 1;
    }
    return max_span;
}

/* The fast path: float32 sums (cpu_fast.h's attention kernels), the query
 * heads of each KV head together, so that each K and V row read serves all
 * of them. One work item per token and KV head. */
static void attention_fast(const cpu_kv *c, float *out, const float *q, const g4_attn_batch *b, int sliding,
                           int n_heads, float scale) {
    enum { HEADS_AT_ONCE = 8 };
    const int D = c->head_dim, Hkv = c->n_kv_heads, group = n_heads / Hkv;
    const size_t kv_row = (size_t)Hkv * D;
    const cpu_fast_table *f = cpu_fast_for(cpu_isa_active());
    const int simd = D % 16 == 0;
    void (*scores_fn)(const float *, int, int64_t, const float *const *, int, int, float, float *) =
        simd ? f->attn_scores : cpu_attn_scores_ref;
    void (*softmax_fn)(float *, int, int) = simd ? f->softmax_rows : cpu_softmax_rows_ref;
    void (*mix_fn)(const float *, int, const float *const *, int, int, float *, int64_t) =
        simd ? f->attn_mix : cpu_attn_mix_ref;
    const int max_span = max_kv_span(b, sliding);
#pragma omp parallel if (b->n_tokens * Hkv > 1)
    {
        const float **krows = malloc((size_t)max_span * sizeof *krows);
        const float **vrows = malloc((size_t)max_span * sizeof *vrows);
        float *p = malloc((size_t)HEADS_AT_ONCE * (size_t)max_span * sizeof *p);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int t = 0; t < b->n_tokens; t++) {
            for (int kvh = 0; kvh < Hkv; kvh++) {
                if (!krows || !vrows || !p) continue;
                const int32_t *r = b->kv_range + 4 * t + (sliding ? 0 : 2);
                const int lo = r[0], n = r[1] - r[0] + 1;
                float *o = out + ((size_t)t * n_heads + (size_t)kvh * group) * D;
                if (n <= 0) {
                    memset(o, 0, (size_t)group * D * sizeof *o);
                    continue;
                }
                for (int j = 0; j < n; j++) {
                    const size_t slot = slot_of(b, b->seq[t], lo + j, sliding);
                    krows[j] = c->k + slot * kv_row + (size_t)kvh * D;
                    vrows[j] = c->v + slot * kv_row + (size_t)kvh * D;
                }
                for (int h0 = 0; h0 < group; h0 += HEADS_AT_ONCE) {
                    const int nq = group - h0 < HEADS_AT_ONCE ? group - h0 : HEADS_AT_ONCE;
                    const float *qh = q + ((size_t)t * n_heads + (size_t)kvh * group + h0) * D;
                    scores_fn(qh, nq, D, krows, n, D, scale, p);
                    softmax_fn(p, nq, n);
                    mix_fn(p, nq, vrows, n, D, o + (size_t)h0 * D, D);
                }
            }
        }
        free(krows);
        free(vrows);
        free(p);
    }
}

void cpu_attention(g4_backend *be, float *out, const float *q, const void *kv, const g4_attn_batch *b,
                   int sliding, int n_heads, float scale) {
    const cpu_kv *c = kv;
    if (cpu_backend_precision(be) == G4_PRECISION_FAST && n_heads % c->n_kv_heads == 0) {
        attention_fast(c, out, q, b, sliding, n_heads, scale);
        return;
    }
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
