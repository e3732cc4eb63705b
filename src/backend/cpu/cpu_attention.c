#include "backend/cpu/cpu_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_matmul.h"
#include "tensor/dtype.h"
#include "tensor/fp8.h"

/* K and V: [n_blocks * block_size][n_kv_heads][head_dim] values of `type`;
 * with FP8 also one scale per (slot, KV head) row. */
typedef struct {
    g4_kv_type type;
    void *k, *v;
    float *k_scale, *v_scale; /* FP8 only: [slots][n_kv_heads] */
    size_t allocated;         /* bytes of the four arrays */
    int n_blocks, block_size, n_kv_heads, head_dim;
} cpu_kv;

size_t cpu_kv_value_bytes(g4_kv_type type) { return type == G4_KV_F32 ? 4 : type == G4_KV_BF16 ? 2 : 1; }

void *cpu_kv_alloc(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim, g4_kv_type type) {
    (void)be;
    if (type != G4_KV_F32 && type != G4_KV_BF16 && type != G4_KV_FP8) return NULL;
    cpu_kv *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    const size_t rows = (size_t)n_blocks * block_size * n_kv_heads, n = rows * head_dim;
    const size_t bytes = (n ? n : 1) * cpu_kv_value_bytes(type);
    c->type = type;
    c->k = calloc(1, bytes);
    c->v = calloc(1, bytes);
    int ok = c->k && c->v;
    if (type == G4_KV_FP8) {
        c->k_scale = calloc(rows ? rows : 1, sizeof *c->k_scale);
        c->v_scale = calloc(rows ? rows : 1, sizeof *c->v_scale);
        ok = ok && c->k_scale && c->v_scale;
    }
    if (!ok) {
        free(c->k), free(c->v), free(c->k_scale), free(c->v_scale);
        free(c);
        return NULL;
    }
    c->allocated = 2 * bytes + (type == G4_KV_FP8 ? 2 * (rows ? rows : 1) * sizeof *c->k_scale : 0);
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = head_dim;
    return c;
}

size_t cpu_kv_allocated_bytes(const void *kv) { return kv ? ((const cpu_kv *)kv)->allocated : 0; }

void cpu_kv_free(g4_backend *be, void *kv) {
    (void)be;
    cpu_kv *c = kv;
    if (!c) return;
    free(c->k), free(c->v), free(c->k_scale), free(c->v_scale);
    free(c);
}

/* Pool slot of (sequence row, position) through the block tables. */
static size_t slot_of(const g4_attn_batch *b, int seq, int pos, int sliding) {
    int logical = pos / b->block_size;
    int block = sliding ? b->sliding_tables[(size_t)seq * b->ring_blocks + logical % b->ring_blocks]
                        : b->full_tables[(size_t)seq * b->full_table_stride + logical];
    return (size_t)block * b->block_size + (size_t)(pos % b->block_size);
}

/* Row r (= slot * n_kv_heads + head) of one pool half, written from / read
 * into floats. FP8: scale = peak / 448, codes = x / scale (an all-zero row
 * keeps scale 0). */
static void put_row(const cpu_kv *c, void *pool, float *scales, size_t r, const float *x) {
    const int D = c->head_dim;
    if (c->type == G4_KV_F32) {
        memcpy((float *)pool + r * D, x, (size_t)D * sizeof *x);
    } else if (c->type == G4_KV_BF16) {
        uint16_t *dst = (uint16_t *)pool + r * D;
        for (int d = 0; d < D; d++) dst[d] = g4_f32_to_bf16(x[d]);
    } else {
        uint8_t *dst = (uint8_t *)pool + r * D;
        float peak = 0.0f;
        for (int d = 0; d < D; d++) peak = fabsf(x[d]) > peak || isnan(x[d]) ? fabsf(x[d]) : peak;
        const float scale = peak / G4_E4M3_MAX, inv = peak > 0.0f ? G4_E4M3_MAX / peak : 0.0f;
        for (int d = 0; d < D; d++) dst[d] = g4_f32_to_e4m3(x[d] * inv);
        scales[r] = scale;
    }
}

static void get_row(const cpu_kv *c, const void *pool, const float *scales, size_t r, float *x) {
    const int D = c->head_dim;
    if (c->type == G4_KV_F32) {
        memcpy(x, (const float *)pool + r * D, (size_t)D * sizeof *x);
    } else if (c->type == G4_KV_BF16) {
        const uint16_t *src = (const uint16_t *)pool + r * D;
        for (int d = 0; d < D; d++) x[d] = g4_bf16_to_f32(src[d]);
    } else {
        const uint8_t *src = (const uint8_t *)pool + r * D;
        for (int d = 0; d < D; d++) x[d] = g4_e4m3_to_f32(src[d]) * scales[r];
    }
}

/* The address of row r in a pool half. */
static const void *row_at(const cpu_kv *c, const void *pool, size_t r) {
    return (const char *)pool + r * (size_t)c->head_dim * cpu_kv_value_bytes(c->type);
}

void cpu_kv_put(void *kv, const g4_attn_batch *b, int t, int sliding, int head, const float *k, const float *v) {
    const cpu_kv *c = kv;
    const size_t r = slot_of(b, b->seq[t], b->pos[t], sliding) * c->n_kv_heads + head;
    put_row(c, c->k, c->k_scale, r, k);
    put_row(c, c->v, c->v_scale, r, v);
}

void cpu_kv_store(g4_backend *be, void *kv, const float *k, const float *v, const g4_attn_batch *b, int sliding) {
    (void)be;
    const cpu_kv *c = kv;
    const size_t row = (size_t)c->n_kv_heads * c->head_dim;
    for (int t = 0; t < b->n_tokens; t++)
        for (int h = 0; h < c->n_kv_heads; h++)
            cpu_kv_put(kv, b, t, sliding, h, k + t * row + (size_t)h * c->head_dim, v + t * row + (size_t)h * c->head_dim);
}

void cpu_kv_read(g4_backend *be, const void *kv, float *k, float *v, const g4_attn_batch *b, int sliding) {
    (void)be;
    const cpu_kv *c = kv;
    const size_t row = (size_t)c->n_kv_heads * c->head_dim;
    for (int t = 0; t < b->n_tokens; t++) {
        const size_t s = slot_of(b, b->seq[t], b->pos[t], sliding);
        for (int h = 0; h < c->n_kv_heads; h++) {
            const size_t r = s * c->n_kv_heads + h;
            get_row(c, c->k, c->k_scale, r, k + t * row + (size_t)h * c->head_dim);
            get_row(c, c->v, c->v_scale, r, v + t * row + (size_t)h * c->head_dim);
        }
    }
}

void cpu_kv_copy_blocks(g4_backend *be, void *kv, const int32_t *src, const int32_t *dst, int n) {
    (void)be;
    cpu_kv *c = kv;
    const size_t rows = (size_t)c->block_size * c->n_kv_heads; /* rows of one block */
    const size_t block = rows * c->head_dim * cpu_kv_value_bytes(c->type);
    for (int i = 0; i < n;) {
        /* runs of consecutive blocks on both sides in one copy */
        int run = 1;
        while (i + run < n && src[i + run] == src[i] + run && dst[i + run] == dst[i] + run) run++;
        memcpy((char *)c->k + dst[i] * block, (const char *)c->k + src[i] * block, run * block);
        memcpy((char *)c->v + dst[i] * block, (const char *)c->v + src[i] * block, run * block);
        if (c->type == G4_KV_FP8) { /* the rows' scales travel with their codes */
            memcpy(c->k_scale + dst[i] * rows, c->k_scale + src[i] * rows, run * rows * sizeof *c->k_scale);
            memcpy(c->v_scale + dst[i] * rows, c->v_scale + src[i] * rows, run * rows * sizeof *c->v_scale);
        }
        i += run;
    }
}

/* One block's four parts (K, V, K scales, V scales) and their sizes. */
static void block_parts(const cpu_kv *c, int32_t block, char *part[4], size_t size[4]) {
    const size_t rows = (size_t)c->block_size * c->n_kv_heads;
    const size_t values = rows * c->head_dim * cpu_kv_value_bytes(c->type);
    const size_t scales = c->type == G4_KV_FP8 ? rows * sizeof(float) : 0;
    part[0] = (char *)c->k + block * values;
    part[1] = (char *)c->v + block * values;
    part[2] = scales ? (char *)(c->k_scale + block * rows) : NULL;
    part[3] = scales ? (char *)(c->v_scale + block * rows) : NULL;
    size[0] = size[1] = values;
    size[2] = size[3] = scales;
}

void cpu_kv_save_blocks(g4_backend *be, const void *kv, const int32_t *blocks, int n, void *host) {
    (void)be;
    char *out = host;
    for (int i = 0; i < n; i++) {
        char *part[4];
        size_t size[4];
        block_parts(kv, blocks[i], part, size);
        for (int h = 0; h < 4; h++) {
            if (size[h]) memcpy(out, part[h], size[h]);
            out += size[h];
        }
    }
}

void cpu_kv_load_blocks(g4_backend *be, void *kv, const int32_t *blocks, int n, const void *host) {
    (void)be;
    const char *in = host;
    for (int i = 0; i < n; i++) {
        char *part[4];
        size_t size[4];
        block_parts(kv, blocks[i], part, size);
        for (int h = 0; h < 4; h++) {
            if (size[h]) memcpy(part[h], in, size[h]);
            in += size[h];
        }
    }
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
 * of them, in the cache's own type. One work item per token and KV head. */
static void attention_fast(const cpu_kv *c, float *out, const float *q, const g4_attn_batch *b, int sliding,
                           int n_heads, float scale) {
    enum { HEADS_AT_ONCE = 8 };
    const int D = c->head_dim, Hkv = c->n_kv_heads, group = n_heads / Hkv;
    const cpu_fast_table *f = cpu_fast_for(cpu_isa_active());
    const int simd = D % 16 == 0;
    const int fp8 = c->type == G4_KV_FP8;
    const int max_span = max_kv_span(b, sliding);
#pragma omp parallel if (b->n_tokens * Hkv > 1)
    {
        const void **krows = malloc((size_t)max_span * sizeof *krows);
        const void **vrows = malloc((size_t)max_span * sizeof *vrows);
        float *ks = fp8 ? malloc((size_t)max_span * sizeof *ks) : NULL;
        float *vs = fp8 ? malloc((size_t)max_span * sizeof *vs) : NULL;
        float *p = malloc((size_t)HEADS_AT_ONCE * (size_t)max_span * sizeof *p);
        const int ready = krows && vrows && p && (!fp8 || (ks && vs));
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int t = 0; t < b->n_tokens; t++) {
            for (int kvh = 0; kvh < Hkv; kvh++) {
                if (!ready) continue;
                const int32_t *r = b->kv_range + 4 * t + (sliding ? 0 : 2);
                const int lo = r[0], n = r[1] - r[0] + 1;
                float *o = out + ((size_t)t * n_heads + (size_t)kvh * group) * D;
                if (n <= 0) {
                    memset(o, 0, (size_t)group * D * sizeof *o);
                    continue;
                }
                for (int j = 0; j < n; j++) {
                    const size_t row = slot_of(b, b->seq[t], lo + j, sliding) * Hkv + kvh;
                    krows[j] = row_at(c, c->k, row);
                    vrows[j] = row_at(c, c->v, row);
                    if (fp8) ks[j] = c->k_scale[row], vs[j] = c->v_scale[row];
                }
                for (int h0 = 0; h0 < group; h0 += HEADS_AT_ONCE) {
                    const int nq = group - h0 < HEADS_AT_ONCE ? group - h0 : HEADS_AT_ONCE;
                    const float *qh = q + ((size_t)t * n_heads + (size_t)kvh * group + h0) * D;
                    float *oh = o + (size_t)h0 * D;
                    if (c->type == G4_KV_F32) {
                        (simd ? f->attn_scores : cpu_attn_scores_ref)(qh, nq, D, (const float *const *)krows, n, D,
                                                                     scale, p);
                        (simd ? f->softmax_rows : cpu_softmax_rows_ref)(p, nq, n);
                        (simd ? f->attn_mix : cpu_attn_mix_ref)(p, nq, (const float *const *)vrows, n, D, oh, D);
                    } else if (c->type == G4_KV_BF16) {
                        (simd ? f->attn_scores_bf16 : cpu_attn_scores_bf16_ref)(
                            qh, nq, D, (const uint16_t *const *)krows, n, D, scale, p);
                        (simd ? f->softmax_rows : cpu_softmax_rows_ref)(p, nq, n);
                        (simd ? f->attn_mix_bf16 : cpu_attn_mix_bf16_ref)(p, nq, (const uint16_t *const *)vrows, n,
                                                                          D, oh, D);
                    } else {
                        /* each row's scale: into its scores, then into its probabilities */
                        (simd ? f->attn_scores_e4m3 : cpu_attn_scores_e4m3_ref)(
                            qh, nq, D, (const uint8_t *const *)krows, n, D, scale, p);
                        for (int i = 0; i < nq; i++)
                            for (int j = 0; j < n; j++) p[(size_t)i * n + j] *= ks[j];
                        (simd ? f->softmax_rows : cpu_softmax_rows_ref)(p, nq, n);
                        for (int i = 0; i < nq; i++)
                            for (int j = 0; j < n; j++) p[(size_t)i * n + j] *= vs[j];
                        (simd ? f->attn_mix_e4m3 : cpu_attn_mix_e4m3_ref)(p, nq, (const uint8_t *const *)vrows, n,
                                                                          D, oh, D);
                    }
                }
            }
        }
        free(krows), free(vrows), free(ks), free(vs), free(p);
    }
}

/* Row r of a pool half as floats: the stored floats themselves, or its
 * values converted into tmp. */
static const float *row_f32(const cpu_kv *c, const void *pool, const float *scales, size_t r, float *tmp) {
    if (c->type == G4_KV_F32) return (const float *)pool + r * c->head_dim;
    get_row(c, pool, scales, r, tmp);
    return tmp;
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
    const int max_span = max_kv_span(b, sliding);
#pragma omp parallel
    {
        double *scores = malloc((size_t)max_span * sizeof *scores);
        size_t *rows = malloc((size_t)max_span * sizeof *rows);
        double *acc = malloc((size_t)D * sizeof *acc);
        float *tmp = malloc((size_t)D * sizeof *tmp);
        const int ready = scores && rows && acc && tmp;
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int t = 0; t < b->n_tokens; t++) {
            for (int h = 0; h < n_heads; h++) {
                if (!ready) continue;
                const int32_t *r = b->kv_range + 4 * t + (sliding ? 0 : 2);
                const int lo = r[0], n = r[1] - r[0] + 1;
                const float *qh = q + ((size_t)t * n_heads + h) * D;
                float *oh = out + ((size_t)t * n_heads + h) * D;
                const int kvh = h / group;
                double max_score = -INFINITY;
                for (int j = 0; j < n; j++) {
                    rows[j] = slot_of(b, b->seq[t], lo + j, sliding) * Hkv + kvh;
                    const float *kj = row_f32(c, c->k, c->k_scale, rows[j], tmp);
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
                    const float *vj = row_f32(c, c->v, c->v_scale, rows[j], tmp);
                    double p = scores[j] / total;
                    for (int d = 0; d < D; d++) acc[d] += p * vj[d];
                }
                for (int d = 0; d < D; d++) oh[d] = (float)acc[d];
                if (n <= 0)
                    for (int d = 0; d < D; d++) oh[d] = 0;
            }
        }
        free(scores), free(rows), free(acc), free(tmp);
    }
}
