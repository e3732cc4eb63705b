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
    int max_rows;     /* rows one forward takes: every buffer below holds that many */
    float *x;         /* [rows][2 d_t]: embedding | hidden */
    float *emb;       /* [rows][d_t]: the tokens' scaled target embeddings */
    float *h, *a, *t1, *ha; /* [rows][d_a] */
    float *q, *attn;  /* [rows][Hq * D] */
    float *gate, *up; /* [rows][I] */
    float *projected; /* [rows][d_t] */
    float *logits;    /* dense head: [rows][V]; centroid head: [rows][n_centroids] */
    /* centroid head */
    float *cand_rows; /* [k*K][d_a]: one row's candidates' embedding rows (rows take turns) */
    float *cand_logits; /* [rows][k*K] */
    int32_t *cand_ids;  /* [rows][k*K] (backend) */
    int32_t *top_ids;   /* [rows][k] (backend) */
    float *top_values;  /* [rows][k] */
    double *top_lse;    /* [rows] */
    int32_t *cand_host; /* [rows][k*K] */
    float *cand_logits_host;
    int32_t *top_host;  /* [rows][k] */
    double *lse_host;   /* [rows] */
    /* the attention batch (backend), its host staging */
    int32_t *pos, *seq, *kv_range, *token;
    int32_t *full_table, *ring;
    size_t full_table_cap, ring_cap;
    int32_t *table_host;
    size_t table_host_cap;
    int32_t *pos_host, *range_host; /* [rows], [rows][4] */
    int backbone;      /* d_t */
    int n_projected;   /* rows the previous forward left a projected state in */
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

g4_status g4_drafter_scratch_create_rows(const g4_assistant *a, int max_rows, g4_drafter_scratch **out) {
    *out = NULL;
    if (max_rows < 1) return g4_fail(G4_ERR_INVALID_ARGUMENT, "a drafter scratch of %d rows", max_rows);
    const g4_text_config *tc = &a->model->config.text;
    g4_backend *be = a->model->backend;
    g4_drafter_scratch *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->be = be;
    s->max_rows = max_rows;
    s->backbone = a->backbone_hidden;
    int dmax = 0, wmax = 0;
    for (int i = 0; i < tc->n_layers; i++) {
        if (tc->layers[i].head_dim > dmax) dmax = tc->layers[i].head_dim;
        if (tc->layers[i].mlp_width > wmax) wmax = tc->layers[i].mlp_width;
    }
    const size_t R = (size_t)max_rows, d = (size_t)tc->hidden_size, dt = (size_t)a->backbone_hidden;
    const size_t top_k = (size_t)(a->ordered ? a->centroid_top_k : 1);
    int ok = 1;
    s->x = alloc_buf(be, R * 2 * dt * 4, &ok);
    s->emb = alloc_buf(be, R * dt * 4, &ok);
    s->h = alloc_buf(be, R * d * 4, &ok);
    s->a = alloc_buf(be, R * d * 4, &ok);
    s->t1 = alloc_buf(be, R * d * 4, &ok);
    s->ha = alloc_buf(be, R * d * 4, &ok);
    s->q = alloc_buf(be, R * tc->n_heads * dmax * 4, &ok);
    s->attn = alloc_buf(be, R * tc->n_heads * dmax * 4, &ok);
    s->gate = alloc_buf(be, R * wmax * 4, &ok);
    s->up = alloc_buf(be, R * wmax * 4, &ok);
    s->projected = alloc_buf(be, R * dt * 4, &ok);
    s->logits = alloc_buf(be, R * (size_t)(a->ordered ? a->n_centroids : tc->vocab_size) * 4, &ok);
    s->top_ids = alloc_buf(be, R * top_k * 4, &ok);
    s->top_values = alloc_buf(be, R * top_k * 4, &ok);
    s->top_lse = alloc_buf(be, R * sizeof(double), &ok);
    s->top_host = malloc(R * top_k * sizeof *s->top_host);
    s->lse_host = malloc(R * sizeof *s->lse_host);
    if (a->ordered) {
        const size_t n = (size_t)a->centroid_top_k * a->tokens_per_centroid;
        s->cand_rows = alloc_buf(be, n * d * 4, &ok);
        s->cand_logits = alloc_buf(be, R * n * 4, &ok);
        s->cand_ids = alloc_buf(be, R * n * 4, &ok);
        s->cand_host = malloc(R * n * sizeof *s->cand_host);
        s->cand_logits_host = malloc(R * n * sizeof *s->cand_logits_host);
        if (!s->cand_host || !s->cand_logits_host) ok = 0;
    }
    s->pos = alloc_buf(be, R * 4, &ok);
    s->seq = alloc_buf(be, R * 4, &ok);
    s->kv_range = alloc_buf(be, R * 16, &ok);
    s->token = alloc_buf(be, R * 4, &ok);
    s->pos_host = malloc(R * sizeof *s->pos_host);
    s->range_host = malloc(R * 4 * sizeof *s->range_host);
    if (!s->top_host || !s->lse_host || !s->pos_host || !s->range_host) ok = 0;
    if (!ok) {
        g4_drafter_scratch_free(s);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the drafter's activations (%d rows)", max_rows);
    }
    /* row r reads block-table row r */
    for (int r = 0; r < max_rows; r++) s->pos_host[r] = r;
    be->ops->to_device(be, s->seq, s->pos_host, R * 4);
    *out = s;
    return G4_OK;
}

g4_status g4_drafter_scratch_create(const g4_assistant *a, g4_drafter_scratch **out) {
    return g4_drafter_scratch_create_rows(a, 1, out);
}

int g4_drafter_scratch_rows(const g4_drafter_scratch *s) { return s->max_rows; }

void g4_drafter_scratch_free(g4_drafter_scratch *s) {
    if (!s) return;
    void *bufs[] = {s->x, s->emb, s->h, s->a, s->t1, s->ha, s->q, s->attn, s->gate, s->up, s->projected,
                    s->logits, s->cand_rows, s->cand_logits, s->cand_ids, s->top_ids, s->top_values, s->top_lse,
                    s->pos, s->seq, s->kv_range, s->token, s->full_table, s->ring};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) s->be->ops->release(s->be, bufs[i]);
    free(s->cand_host);
    free(s->cand_logits_host);
    free(s->top_host);
    free(s->lse_host);
    free(s->table_host);
    free(s->pos_host);
    free(s->range_host);
    free(s);
}

void g4_drafter_set_input(g4_drafter_scratch *s, const float *inputs) { g4_drafter_set_input_row(s, 0, inputs); }

void g4_drafter_set_input_row(g4_drafter_scratch *s, int row, const float *inputs) {
    if (row < 0 || row >= s->max_rows) return;
    const size_t w = (size_t)2 * s->backbone;
    s->be->ops->to_device(s->be, s->x + (size_t)row * w, inputs, w * sizeof(float));
}

g4_status g4_drafter_set_token(g4_drafter_scratch *s, const g4_model *target, int32_t token, const float *hidden) {
    const float *const hiddens[1] = {hidden};
    return g4_drafter_set_tokens(s, target, 1, &token, hiddens, NULL);
}

g4_status g4_drafter_set_tokens(g4_drafter_scratch *s, const g4_model *target, int n, const int32_t *tokens,
                                const float *const *hidden, const int *from) {
    g4_backend *be = s->be;
    const int dt = target->config.text.hidden_size;
    if (dt != s->backbone)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter input: target width %d, the drafter's backbone %d", dt,
                       s->backbone);
    if (n < 1 || n > s->max_rows)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter input of %d rows (the scratch holds %d)", n, s->max_rows);
    for (int r = 0; r < n; r++) {
        if (tokens[r] < 0 || tokens[r] >= target->config.text.vocab_size)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter input token %d is outside the vocabulary [0, %d)",
                           tokens[r], target->config.text.vocab_size);
        const int src = from ? from[r] : r;
        if (!(hidden && hidden[r]) && (src < 0 || src >= s->n_projected))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter input row %d: no hidden state given and no previous step",
                           r);
    }
    be->ops->to_device(be, s->token, tokens, (size_t)n * sizeof *tokens);
    /* the target's own scaled embedding (its get_input_embeddings, B4) */
    be->ops->embed(be, s->emb, &target->text.embed, s->token, n, target->text.embed_scale);
    const size_t row_bytes = (size_t)dt * sizeof(float);
    for (int r = 0; r < n; r++) {
        float *x = s->x + (size_t)r * 2 * dt;
        be->ops->copy(be, x, s->emb + (size_t)r * dt, row_bytes);
        if (hidden && hidden[r])
            be->ops->to_device(be, x + dt, hidden[r], row_bytes);
        else
            be->ops->copy(be, x + dt, s->projected + (size_t)(from ? from[r] : r) * dt, row_bytes);
    }
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

/* Host staging of n * stride table entries. */
static int32_t *table_stage(g4_drafter_scratch *s, size_t n) {
    if (n > s->table_host_cap) {
        int32_t *t = realloc(s->table_host, n * sizeof *t);
        if (!t) return NULL;
        s->table_host = t;
        s->table_host_cap = n;
    }
    return s->table_host;
}

/* The rows' block tables, one row of the attention batch's tables each:
 * full layers up to the last block a row sees (the rows' own strides
 * differ), sliding layers the pool's ring. Entries past a row's table are
 * never read (its key range ends before them). */
static g4_status upload_tables(g4_drafter_scratch *s, int n, const g4_drafter_kv *kv, int *full_stride) {
    const int bs = kv[0].kv->block_size, ring = kv[0].kv->ring_blocks;
    int stride = 1;
    for (int r = 0; r < n; r++) {
        if (kv[r].kv != kv[0].kv)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter rows on different KV pools in one forward");
        const int need = kv[r].hi[G4_LAYER_FULL] / bs + 1;
        if (need > kv[r].full_table_stride)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter row %d: key %d beyond its block table (%d blocks)", r,
                           kv[r].hi[G4_LAYER_FULL], kv[r].full_table_stride);
        if (need > stride) stride = need;
    }
    int32_t *t = table_stage(s, (size_t)n * (stride > ring ? stride : ring));
    if (!t) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the drafter's block tables");
    for (int r = 0; r < n; r++) {
        const int have = kv[r].full_table_stride < stride ? kv[r].full_table_stride : stride;
        memcpy(t + (size_t)r * stride, kv[r].full_table, (size_t)have * sizeof *t);
        for (int b = have; b < stride; b++) t[(size_t)r * stride + b] = 0;
    }
    g4_status st = upload_table(s->be, &s->full_table, &s->full_table_cap, t, (size_t)n * stride);
    for (int r = 0; st == G4_OK && r < n; r++) memcpy(t + (size_t)r * ring, kv[r].ring, (size_t)ring * sizeof *t);
    if (st == G4_OK) st = upload_table(s->be, &s->ring, &s->ring_cap, t, (size_t)n * ring);
    *full_stride = stride;
    return st;
}

/* The centroid ("ordered embeddings") head of rows 0..n: the top clusters of
 * centroids(h_a), then exact logits of their tokens only, one row's
 * candidates at a time. Each row's token is its argmax (ties: lowest id, as
 * argmax over transformers' scattered row). */
static g4_status centroid_head(const g4_assistant *a, g4_drafter_scratch *s, int n_rows, g4_drafter_result *res) {
    g4_backend *be = s->be;
    const g4_model *m = a->model;
    const int d = m->config.text.hidden_size, V = m->config.text.vocab_size;
    const int k = a->centroid_top_k, K = a->tokens_per_centroid, n = k * K;
    be->ops->matmul(be, s->logits, s->ha, n_rows, &a->centroids);
    be->ops->top_logits(be, s->top_ids, s->top_values, s->top_lse, s->logits, n_rows, a->n_centroids, k);
    be->ops->to_host(be, s->top_host, s->top_ids, (size_t)n_rows * k * sizeof *s->top_host);
    for (int r = 0; r < n_rows; r++)
        for (int j = 0; j < k; j++) {
            const int32_t c = s->top_host[(size_t)r * k + j];
            if (c < 0 || c >= a->n_centroids)
                return g4_fail(G4_ERR_FORMAT, "drafter centroid scores hold NaN (cluster %d)", c);
            memcpy(s->cand_host + ((size_t)r * k + j) * K, a->token_ordering + (size_t)c * K,
                   (size_t)K * sizeof(int32_t));
        }
    be->ops->to_device(be, s->cand_ids, s->cand_host, (size_t)n_rows * n * sizeof(int32_t));
    /* per row: its candidates' rows of the tied embedding, then one product */
    g4_matrix rows = {.format = G4_WEIGHT_F32, .rows = n, .cols = d, .data = s->cand_rows,
                      .row_bytes = (size_t)d * sizeof(float)};
    for (int r = 0; r < n_rows; r++) {
        be->ops->embed(be, s->cand_rows, &m->text.embed, s->cand_ids + (size_t)r * n, n, 1.0f);
        be->ops->matmul(be, s->cand_logits + (size_t)r * n, s->ha + (size_t)r * d, 1, &rows);
    }
    be->ops->to_host(be, s->cand_logits_host, s->cand_logits, (size_t)n_rows * n * sizeof(float));
    for (int r = 0; r < n_rows; r++) {
        const int32_t *ids = s->cand_host + (size_t)r * n;
        const float *vals = s->cand_logits_host + (size_t)r * n;
        int best = 0;
        float lowest = FLT_MAX;
        for (int i = 0; i < n; i++) {
            float v = vals[i], b = vals[best];
            if (v != v) return g4_fail(G4_ERR_FORMAT, "drafter logits hold NaN");
            if (v > b || (v == b && ids[i] < ids[best])) best = i;
            if (v < lowest) lowest = v;
        }
        res[r].token = ids[best];
        if (res[r].logits) {
            for (int i = 0; i < V; i++) res[r].logits[i] = lowest - 1.0f;
            for (int i = 0; i < n; i++) res[r].logits[ids[i]] = vals[i];
        }
        if (res[r].candidates) memcpy(res[r].candidates, ids, (size_t)n * sizeof(int32_t));
    }
    return G4_OK;
}

g4_status g4_drafter_forward(const g4_assistant *a, g4_drafter_scratch *s, int pos, const g4_drafter_kv *kv,
                             g4_drafter_result *res) {
    return g4_drafter_forward_rows(a, s, 1, &pos, kv, res);
}

g4_status g4_drafter_forward_rows(const g4_assistant *a, g4_drafter_scratch *s, int n, const int *pos,
                                  const g4_drafter_kv *kv, g4_drafter_result *res) {
    g4_backend *be = s->be;
    const g4_model *m = a->model;
    const g4_text_config *tc = &m->config.text;
    const int d = tc->hidden_size, dt = a->backbone_hidden;
    if (a->target_layer[0] < 0 || a->target_layer[1] < 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter %s is not attached to a target", m->path);
    if (n < 1 || n > s->max_rows)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter forward of %d rows (the scratch holds %d)", n, s->max_rows);
    for (int r = 0; r < n; r++) {
        if (kv[r].lo[G4_LAYER_FULL] > kv[r].hi[G4_LAYER_FULL] ||
            kv[r].lo[G4_LAYER_SLIDING] > kv[r].hi[G4_LAYER_SLIDING])
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter step at position %d: the target has no keys to show",
                           pos[r]);
        s->pos_host[r] = pos[r];
        const int32_t range[4] = {kv[r].lo[G4_LAYER_SLIDING], kv[r].hi[G4_LAYER_SLIDING], kv[r].lo[G4_LAYER_FULL],
                                  kv[r].hi[G4_LAYER_FULL]};
        memcpy(s->range_host + (size_t)r * 4, range, sizeof range);
    }
    be->ops->to_device(be, s->pos, s->pos_host, (size_t)n * sizeof(int32_t));
    be->ops->to_device(be, s->kv_range, s->range_host, (size_t)n * 4 * sizeof(int32_t));
    int full_stride = 0;
    g4_status st = upload_tables(s, n, kv, &full_stride);
    if (st != G4_OK) return st;
    const g4_kv_pool *pool = kv[0].kv;
    const g4_attn_batch ab = {
        .n_tokens = n,
        .pos = s->pos,
        .seq = s->seq,
        .kv_range = s->kv_range,
        .full_tables = s->full_table,
        .full_table_stride = full_stride,
        .sliding_tables = s->ring,
        .ring_blocks = pool->ring_blocks,
        .block_size = pool->block_size,
    };

    /* no sqrt(d_a) scaling: the input is an embedding already (B3) */
    be->ops->matmul(be, s->h, s->x, n, &a->pre_projection);
    be->ops->rmsnorm(be, s->a, s->h, m->text.layers[0].input_norm, n, d, tc->rms_eps);
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_layer_config *lc = &tc->layers[i];
        const g4_text_layer *w = &m->text.layers[i];
        const int sliding = lc->kind == G4_LAYER_SLIDING;
        be->ops->matmul(be, s->q, s->a, n, &w->q);
        be->ops->rmsnorm_rope(be, s->q, w->q_norm, n, tc->n_heads, lc->head_dim, s->pos, lc->rope_theta,
                              lc->rope_pairs, tc->rms_eps);
        be->ops->attention(be, s->attn, s->q, pool->layer_kv[a->target_layer[lc->kind]], &ab, sliding, tc->n_heads,
                           1.0f);
        be->ops->matmul(be, s->t1, s->attn, n, &w->o);
        be->ops->add_rmsnorm(be, s->h, s->t1, w->post_attn_norm, n, d, tc->rms_eps, 1.0f, s->a, w->pre_ffn_norm);
        be->ops->matmul(be, s->up, s->a, n, &w->up);
        be->ops->matmul_gelu_mul(be, s->gate, s->a, n, &w->gate, s->up);
        be->ops->matmul(be, s->t1, s->gate, n, &w->down);
        const float *next = i + 1 < tc->n_layers ? m->text.layers[i + 1].input_norm : NULL;
        be->ops->add_rmsnorm(be, s->h, s->t1, w->post_ffn_norm, n, d, tc->rms_eps, w->layer_scalar,
                             next ? s->a : NULL, next);
    }
    be->ops->rmsnorm(be, s->ha, s->h, m->text.final_norm, n, d, tc->rms_eps);
    be->ops->matmul(be, s->projected, s->ha, n, &a->post_projection);
    s->n_projected = n;
    for (int r = 0; r < n; r++)
        if (res[r].projected)
            be->ops->to_host(be, res[r].projected, s->projected + (size_t)r * dt, (size_t)dt * sizeof(float));

    if (a->ordered) {
        st = centroid_head(a, s, n, res);
        for (int r = 0; st == G4_OK && r < n; r++) {
            if (!res[r].dense_logits) continue;
            /* the reference for tests: every token's logit (reuses no buffer
             * of the sparse path) */
            float *full = be->ops->alloc(be, (size_t)tc->vocab_size * sizeof(float));
            if (!full) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            be->ops->matmul(be, full, s->ha + (size_t)r * d, 1, &m->text.embed);
            be->ops->to_host(be, res[r].dense_logits, full, (size_t)tc->vocab_size * sizeof(float));
            be->ops->release(be, full);
        }
    } else {
        /* tied head, no final softcap (B3); argmax on the backend */
        const size_t V = (size_t)tc->vocab_size;
        be->ops->matmul(be, s->logits, s->ha, n, &m->text.embed);
        be->ops->top_logits(be, s->top_ids, s->top_values, s->top_lse, s->logits, n, tc->vocab_size, 1);
        be->ops->to_host(be, s->top_host, s->top_ids, (size_t)n * sizeof *s->top_host);
        be->ops->to_host(be, s->lse_host, s->top_lse, (size_t)n * sizeof *s->lse_host);
        for (int r = 0; r < n; r++) {
            if (s->lse_host[r] != s->lse_host[r]) return g4_fail(G4_ERR_FORMAT, "drafter logits hold NaN");
            res[r].token = s->top_host[r];
            if (res[r].logits) be->ops->to_host(be, res[r].logits, s->logits + r * V, V * sizeof(float));
            if (res[r].dense_logits)
                be->ops->to_host(be, res[r].dense_logits, s->logits + r * V, V * sizeof(float));
        }
    }
    if (st == G4_OK) st = be->ops->status(be);
    return st;
}
