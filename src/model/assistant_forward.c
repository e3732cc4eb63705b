/* One drafter call (SPEC-gemma4-unified-assistant B3), written against the
 * backend interface: one query row through the query-only layers onto the
 * target's cache, then the LM head (dense, or the centroid head computed on
 * the chosen clusters' tokens only) and post_projection. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "model/assistant.h"

struct g4_drafter_scratch {
    g4_backend *be;
    float *x;         /* [2 d_t]: embedding | hidden */
    float *h, *a, *t1, *ha; /* [d_a] */
    float *q, *attn;  /* [Hq * D] */
    float *gate, *up; /* [I] */
    float *projected; /* [d_t] */
    float *logits;    /* dense head: [V]; centroid head: [n_centroids] */
    /* centroid head */
    float *cand_rows; /* [k*K][d_a]: the candidates' embedding rows */
    float *cand_logits; /* [k*K] */
    int32_t *cand_ids;  /* [k*K] (backend) */
    int32_t *top_ids;   /* [k] (backend) */
    float *top_values;  /* [k] */
    double *top_lse;    /* [1] */
    int32_t *cand_host; /* [k*K] */
    float *cand_logits_host;
    /* attention batch of one row (backend) */
    int32_t *pos, *seq, *kv_range, *token;
    int32_t *full_table, *ring;
    size_t full_table_cap, ring_cap;
    int backbone;      /* d_t */
    int has_projected; /* a previous step left its projected state */
};

void g4_drafter_kv_window(const g4_assistant *a, int ctx, g4_drafter_kv *kv) {
    const int W = a->model->config.text.sliding_window;
    kv->lo[G4_LAYER_FULL] = 0;
    kv->hi[G4_LAYER_FULL] = ctx - 1;
    kv->lo[G4_LAYER_SLIDING] = ctx - 1 - W < 0 ? 0 : ctx - 1 - W;
    kv->hi[G4_LAYER_SLIDING] = ctx - 1;
}

static void *alloc_buf(g4_backend *be, size_t bytes, int *ok) {
    void *p = be->ops->alloc(be, bytes ? bytes : 4);
    if (!p) *ok = 0;
    return p;
}

g4_status g4_drafter_scratch_create(const g4_assistant *a, g4_drafter_scratch **out) {
    *out = NULL;
    const g4_text_config *tc = &a->model->config.text;
    g4_backend *be = a->model->backend;
    g4_drafter_scratch *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->be = be;
    s->backbone = a->backbone_hidden;
    int dmax = 0, wmax = 0;
    for (int i = 0; i < tc->n_layers; i++) {
        if (tc->layers[i].head_dim > dmax) dmax = tc->layers[i].head_dim;
        if (tc->layers[i].mlp_width > wmax) wmax = tc->layers[i].mlp_width;
    }
    const size_t d = (size_t)tc->hidden_size, dt = (size_t)a->backbone_hidden;
    int ok = 1;
    s->x = alloc_buf(be, 2 * dt * 4, &ok);
    s->h = alloc_buf(be, d * 4, &ok);
    s->a = alloc_buf(be, d * 4, &ok);
    s->t1 = alloc_buf(be, d * 4, &ok);
    s->ha = alloc_buf(be, d * 4, &ok);
    s->q = alloc_buf(be, (size_t)tc->n_heads * dmax * 4, &ok);
    s->attn = alloc_buf(be, (size_t)tc->n_heads * dmax * 4, &ok);
    s->gate = alloc_buf(be, (size_t)wmax * 4, &ok);
    s->up = alloc_buf(be, (size_t)wmax * 4, &ok);
    s->projected = alloc_buf(be, dt * 4, &ok);
    s->logits = alloc_buf(be, (size_t)(a->ordered ? a->n_centroids : tc->vocab_size) * 4, &ok);
    s->top_ids = alloc_buf(be, (size_t)(a->ordered ? a->centroid_top_k : 1) * 4, &ok);
    s->top_values = alloc_buf(be, (size_t)(a->ordered ? a->centroid_top_k : 1) * 4, &ok);
    s->top_lse = alloc_buf(be, sizeof(double), &ok);
    if (a->ordered) {
        const size_t n = (size_t)a->centroid_top_k * a->tokens_per_centroid;
        s->cand_rows = alloc_buf(be, n * d * 4, &ok);
        s->cand_logits = alloc_buf(be, n * 4, &ok);
        s->cand_ids = alloc_buf(be, n * 4, &ok);
        s->cand_host = malloc(n * sizeof *s->cand_host);
        s->cand_logits_host = malloc(n * sizeof *s->cand_logits_host);
        if (!s->cand_host || !s->cand_logits_host) ok = 0;
    }
    s->pos = alloc_buf(be, 4, &ok);
    s->seq = alloc_buf(be, 4, &ok);
    s->kv_range = alloc_buf(be, 16, &ok);
    s->token = alloc_buf(be, 4, &ok);
    if (!ok) {
        g4_drafter_scratch_free(s);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the drafter's activations");
    }
    int32_t zero = 0;
    be->ops->to_device(be, s->seq, &zero, 4);
    *out = s;
    return G4_OK;
}

void g4_drafter_scratch_free(g4_drafter_scratch *s) {
    if (!s) return;
    void *bufs[] = {s->x, s->h, s->a, s->t1, s->ha, s->q, s->attn, s->gate, s->up, s->projected, s->logits,
                    s->cand_rows, s->cand_logits, s->cand_ids, s->top_ids, s->top_values, s->top_lse, s->pos,
                    s->seq, s->kv_range, s->token, s->full_table, s->ring};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) s->be->ops->release(s->be, bufs[i]);
    free(s->cand_host);
    free(s->cand_logits_host);
    free(s);
}

void g4_drafter_set_input(g4_drafter_scratch *s, const float *inputs) {
    s->be->ops->to_device(s->be, s->x, inputs, (size_t)2 * s->backbone * sizeof(float));
}

g4_status g4_drafter_set_token(g4_drafter_scratch *s, const g4_model *target, int32_t token, const float *hidden) {
    g4_backend *be = s->be;
    const int dt = target->config.text.hidden_size;
    if (dt != s->backbone)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter input: target width %d, the drafter's backbone %d", dt,
                       s->backbone);
    if (token < 0 || token >= target->config.text.vocab_size)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter input token %d is outside the vocabulary [0, %d)", token,
                       target->config.text.vocab_size);
    if (!hidden && !s->has_projected)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter input: no hidden state given and no previous step");
    be->ops->to_device(be, s->token, &token, 4);
    /* the target's own scaled embedding (its get_input_embeddings, B4) */
    be->ops->embed(be, s->x, &target->text.embed, s->token, 1, target->text.embed_scale);
    if (hidden)
        be->ops->to_device(be, s->x + dt, hidden, (size_t)dt * sizeof(float));
    else
        be->ops->copy(be, s->x + dt, s->projected, (size_t)dt * sizeof(float));
    return G4_OK;
}

static g4_status upload_table(g4_backend *be, int32_t **buf, size_t *cap, const int32_t *host, size_t n) {
    if (n > *cap) {
        if (*buf) be->ops->release(be, *buf);
        size_t c = n < 256 ? 256 : n * 2;
        *buf = be->ops->alloc(be, c * sizeof(int32_t));
        *cap = *buf ? c : 0;
        if (!*buf) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the drafter's block tables");
    }
    if (n) be->ops->to_device(be, *buf, host, n * sizeof(int32_t));
    return G4_OK;
}

/* The centroid ("ordered embeddings") head: the top clusters of
 * centroids(h_a), then exact logits of their tokens only. Returns the argmax
 * token (ties: lowest id, as argmax over transformers' scattered row). */
static g4_status centroid_head(const g4_assistant *a, g4_drafter_scratch *s, g4_drafter_result *res) {
    g4_backend *be = s->be;
    const g4_model *m = a->model;
    const int d = m->config.text.hidden_size, V = m->config.text.vocab_size;
    const int k = a->centroid_top_k, K = a->tokens_per_centroid, n = k * K;
    be->ops->matmul(be, s->logits, s->ha, 1, &a->centroids);
    be->ops->top_logits(be, s->top_ids, s->top_values, s->top_lse, s->logits, 1, a->n_centroids, k);
    int32_t top[G4_TOP_CENTROIDS_MAX];
    be->ops->to_host(be, top, s->top_ids, (size_t)k * sizeof *top);
    for (int j = 0; j < k; j++) {
        if (top[j] < 0 || top[j] >= a->n_centroids)
            return g4_fail(G4_ERR_FORMAT, "drafter centroid scores hold NaN (cluster %d)", top[j]);
        memcpy(s->cand_host + (size_t)j * K, a->token_ordering + (size_t)top[j] * K, (size_t)K * sizeof(int32_t));
    }
    be->ops->to_device(be, s->cand_ids, s->cand_host, (size_t)n * sizeof(int32_t));
    /* the candidates' rows of the tied embedding, then one product */
    be->ops->embed(be, s->cand_rows, &m->text.embed, s->cand_ids, n, 1.0f);
    g4_matrix rows = {.format = G4_WEIGHT_F32, .rows = n, .cols = d, .data = s->cand_rows,
                      .row_bytes = (size_t)d * sizeof(float)};
    be->ops->matmul(be, s->cand_logits, s->ha, 1, &rows);
    be->ops->to_host(be, s->cand_logits_host, s->cand_logits, (size_t)n * sizeof(float));
    int best = 0;
    float lowest = FLT_MAX;
    for (int i = 0; i < n; i++) {
        float v = s->cand_logits_host[i], b = s->cand_logits_host[best];
        if (v != v) return g4_fail(G4_ERR_FORMAT, "drafter logits hold NaN");
        if (v > b || (v == b && s->cand_host[i] < s->cand_host[best])) best = i;
        if (v < lowest) lowest = v;
    }
    res->token = s->cand_host[best];
    if (res->logits) {
        for (int i = 0; i < V; i++) res->logits[i] = lowest - 1.0f;
        for (int i = 0; i < n; i++) res->logits[s->cand_host[i]] = s->cand_logits_host[i];
    }
    if (res->candidates) memcpy(res->candidates, s->cand_host, (size_t)n * sizeof(int32_t));
    return G4_OK;
}

g4_status g4_drafter_forward(const g4_assistant *a, g4_drafter_scratch *s, int pos, const g4_drafter_kv *kv,
                             g4_drafter_result *res) {
    g4_backend *be = s->be;
    const g4_model *m = a->model;
    const g4_text_config *tc = &m->config.text;
    const int d = tc->hidden_size;
    if (a->target_layer[0] < 0 || a->target_layer[1] < 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter %s is not attached to a target", m->path);
    if (kv->lo[G4_LAYER_FULL] > kv->hi[G4_LAYER_FULL] || kv->lo[G4_LAYER_SLIDING] > kv->hi[G4_LAYER_SLIDING])
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter step at position %d: the target has no keys to show", pos);
    const int32_t range[4] = {kv->lo[G4_LAYER_SLIDING], kv->hi[G4_LAYER_SLIDING], kv->lo[G4_LAYER_FULL],
                              kv->hi[G4_LAYER_FULL]};
    be->ops->to_device(be, s->pos, &pos, 4);
    be->ops->to_device(be, s->kv_range, range, sizeof range);
    g4_status st = upload_table(be, &s->full_table, &s->full_table_cap, kv->full_table, (size_t)kv->full_table_stride);
    if (st == G4_OK) st = upload_table(be, &s->ring, &s->ring_cap, kv->ring, (size_t)kv->kv->ring_blocks);
    if (st != G4_OK) return st;
    const g4_attn_batch ab = {
        .n_tokens = 1,
        .pos = s->pos,
        .seq = s->seq,
        .kv_range = s->kv_range,
        .full_tables = s->full_table,
        .full_table_stride = kv->full_table_stride,
        .sliding_tables = s->ring,
        .ring_blocks = kv->kv->ring_blocks,
        .block_size = kv->kv->block_size,
    };

    /* no sqrt(d_a) scaling: the input is an embedding already (B3) */
    be->ops->matmul(be, s->h, s->x, 1, &a->pre_projection);
    be->ops->rmsnorm(be, s->a, s->h, m->text.layers[0].input_norm, 1, d, tc->rms_eps);
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_layer_config *lc = &tc->layers[i];
        const g4_text_layer *w = &m->text.layers[i];
        const int sliding = lc->kind == G4_LAYER_SLIDING;
        be->ops->matmul(be, s->q, s->a, 1, &w->q);
        be->ops->rmsnorm_rope(be, s->q, w->q_norm, 1, tc->n_heads, lc->head_dim, s->pos, lc->rope_theta,
                              lc->rope_pairs, tc->rms_eps);
        be->ops->attention(be, s->attn, s->q, kv->kv->layer_kv[a->target_layer[lc->kind]], &ab, sliding, tc->n_heads,
                           1.0f);
        be->ops->matmul(be, s->t1, s->attn, 1, &w->o);
        be->ops->add_rmsnorm(be, s->h, s->t1, w->post_attn_norm, 1, d, tc->rms_eps, 1.0f, s->a, w->pre_ffn_norm);
        be->ops->matmul(be, s->up, s->a, 1, &w->up);
        be->ops->matmul_gelu_mul(be, s->gate, s->a, 1, &w->gate, s->up);
        be->ops->matmul(be, s->t1, s->gate, 1, &w->down);
        const float *next = i + 1 < tc->n_layers ? m->text.layers[i + 1].input_norm : NULL;
        be->ops->add_rmsnorm(be, s->h, s->t1, w->post_ffn_norm, 1, d, tc->rms_eps, w->layer_scalar,
                             next ? s->a : NULL, next);
    }
    be->ops->rmsnorm(be, s->ha, s->h, m->text.final_norm, 1, d, tc->rms_eps);
    be->ops->matmul(be, s->projected, s->ha, 1, &a->post_projection);
    s->has_projected = 1;
    if (res->projected)
        be->ops->to_host(be, res->projected, s->projected, (size_t)a->backbone_hidden * sizeof(float));

    if (a->ordered) {
        st = centroid_head(a, s, res);
        if (st == G4_OK && res->dense_logits) {
            /* the reference for tests: every token's logit (reuses no buffer
             * of the sparse path) */
            float *full = be->ops->alloc(be, (size_t)tc->vocab_size * sizeof(float));
            if (!full) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            be->ops->matmul(be, full, s->ha, 1, &m->text.embed);
            be->ops->to_host(be, res->dense_logits, full, (size_t)tc->vocab_size * sizeof(float));
            be->ops->release(be, full);
        }
    } else {
        /* tied head, no final softcap (B3); argmax on the backend */
        be->ops->matmul(be, s->logits, s->ha, 1, &m->text.embed);
        be->ops->top_logits(be, s->top_ids, s->top_values, s->top_lse, s->logits, 1, tc->vocab_size, 1);
        double lse;
        be->ops->to_host(be, &res->token, s->top_ids, sizeof res->token);
        be->ops->to_host(be, &lse, s->top_lse, sizeof lse);
        if (lse != lse) return g4_fail(G4_ERR_FORMAT, "drafter logits hold NaN");
        if (res->logits) be->ops->to_host(be, res->logits, s->logits, (size_t)tc->vocab_size * sizeof(float));
        if (res->dense_logits)
            be->ops->to_host(be, res->dense_logits, s->logits, (size_t)tc->vocab_size * sizeof(float));
    }
    if (st == G4_OK) st = be->ops->status(be);
    return st;
}
