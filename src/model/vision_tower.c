#include "model/vision_tower.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/weight_loader.h"

/* A linear layer whose input and output may be clamped to learned bounds
 * (Gemma4ClippableLinear; E2B/E4B towers use the bounds, large ones don't). */
typedef struct {
    g4_matrix w;
    int clipped;
    float in_lo, in_hi, out_lo, out_hi;
} clipped_linear;

typedef struct {
    float *input_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm, *q_norm, *k_norm;
    clipped_linear q, k, v, o, gate, up, down;
} vision_layer;

struct g4_vision_weights {
    g4_matrix input_proj;   /* [Dv, 3*p*p] */
    g4_matrix pos_table;    /* [2 * P, Dv]: rows 0..P-1 by x, P..2P-1 by y */
    int pos_size;
    vision_layer *layers;
    float *std_neg_bias, *std_scale; /* standardize: (x - bias) * scale */
    g4_matrix embed_proj;   /* [d_text, Dv] */
    uint64_t n_params, weight_bytes; /* the tower's own, kept out of the text totals */
};

static void load_clipped(g4_weight_loader *L, const char *prefix, const char *name, int clipped, int64_t rows,
                         int64_t cols, clipped_linear *out) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s.linear", prefix, name);
    g4_loader_matrix(L, buf, 1, 0, rows, cols, &out->w);
    out->clipped = clipped;
    if (!clipped) return;
    const char *bounds[] = {"input_min", "input_max", "output_min", "output_max"};
    float *dst[] = {&out->in_lo, &out->in_hi, &out->out_lo, &out->out_hi};
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "%s%s.%s", prefix, name, bounds[i]);
        *dst[i] = g4_loader_scalar(L, buf);
    }
}

/* HF names the tower "model.vision_tower." and the embedder
 * "model.embed_vision."; MLX conversions drop the "model.". */
static void tower_prefixes(const g4_model *m, const char **tower, const char **embed) {
    if (g4_st_find(m->tensors, "model.vision_tower.patch_embedder.input_proj.weight")) {
        *tower = "model.vision_tower.";
        *embed = "model.embed_vision.";
    } else {
        *tower = "vision_tower.";
        *embed = "embed_vision.";
    }
}

g4_status g4_vision_tower_load(g4_model *m) {
    const g4_vision_config *vc = &m->config.vision;
    if (!vc->present) return G4_OK;
    if (vc->hidden_size <= 0 || vc->n_heads <= 0 || vc->head_dim <= 0 || vc->head_dim % 4 || vc->n_layers <= 0 ||
        vc->n_kv_heads != vc->n_heads || vc->patch_size <= 0 || vc->pooling_kernel <= 0 ||
        vc->position_embedding_size <= 0)
        return g4_fail(G4_ERR_UNSUPPORTED,
                       "%s: vision_config needs positive sizes, head_dim a multiple of 4 and as many KV heads as "
                       "heads",
                       m->path);
    struct g4_vision_weights *v = calloc(1, sizeof *v);
    if (!v) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    v->layers = calloc((size_t)vc->n_layers, sizeof *v->layers);
    m->vision = v;
    if (!v->layers) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_weight_loader L;
    g4_status st = g4_loader_init(&L, m);
    if (st != G4_OK) return st;
    uint64_t text_params = m->n_params, text_bytes[5];
    memcpy(text_bytes, m->weight_bytes_by_format, sizeof text_bytes);
    const char *tp, *ep;
    tower_prefixes(m, &tp, &ep);
    const int64_t Dv = vc->hidden_size, Iv = vc->intermediate_size, HD = (int64_t)vc->n_heads * vc->head_dim;
    const int64_t patch_values = 3 * (int64_t)vc->patch_size * vc->patch_size;
    char name[512];
    snprintf(name, sizeof name, "%spatch_embedder.input_proj", tp);
    g4_loader_matrix(&L, name, 1, 0, Dv, patch_values, &v->input_proj);
    snprintf(name, sizeof name, "%spatch_embedder.position_embedding_table", tp);
    g4_loader_matrix(&L, name, 0, 2, vc->position_embedding_size, Dv, &v->pos_table);
    v->pos_size = vc->position_embedding_size;
    for (int i = 0; i < vc->n_layers; i++) {
        vision_layer *w = &v->layers[i];
        char lp[256];
        snprintf(lp, sizeof lp, "%sencoder.layers.%d.", tp, i);
        const struct {
            const char *suffix;
            float **dst;
            int64_t n;
        } norms[] = {{"input_layernorm.weight", &w->input_norm, Dv},
                     {"post_attention_layernorm.weight", &w->post_attn_norm, Dv},
                     {"pre_feedforward_layernorm.weight", &w->pre_ffn_norm, Dv},
                     {"post_feedforward_layernorm.weight", &w->post_ffn_norm, Dv},
                     {"self_attn.q_norm.weight", &w->q_norm, vc->head_dim},
                     {"self_attn.k_norm.weight", &w->k_norm, vc->head_dim}};
        for (size_t k = 0; k < sizeof norms / sizeof norms[0]; k++) {
            snprintf(name, sizeof name, "%s%s", lp, norms[k].suffix);
            *norms[k].dst = g4_loader_vector(&L, name, norms[k].n);
        }
        int c = vc->clipped_linears;
        load_clipped(&L, lp, "self_attn.q_proj", c, HD, Dv, &w->q);
        load_clipped(&L, lp, "self_attn.k_proj", c, HD, Dv, &w->k);
        load_clipped(&L, lp, "self_attn.v_proj", c, HD, Dv, &w->v);
        load_clipped(&L, lp, "self_attn.o_proj", c, Dv, HD, &w->o);
        load_clipped(&L, lp, "mlp.gate_proj", c, Iv, Dv, &w->gate);
        load_clipped(&L, lp, "mlp.up_proj", c, Iv, Dv, &w->up);
        load_clipped(&L, lp, "mlp.down_proj", c, Dv, Iv, &w->down);
    }
    if (vc->standardize) {
        snprintf(name, sizeof name, "%sstd_bias", tp);
        const g4_st_tensor *bias = g4_loader_find(&L, name);
        if (bias && bias->ndim == 1 && bias->shape[0] == Dv) {
            float *neg = malloc((size_t)Dv * sizeof *neg);
            if (neg) {
                for (int64_t c = 0; c < Dv; c++) neg[c] = -g4_load_as_f32(bias->data, bias->dtype, (size_t)c);
                v->std_neg_bias = g4_model_upload_floats(m, neg, (size_t)Dv);
                free(neg);
            }
        } else {
            g4_loader_problem(&L, "missing or malformed tensor %s (expected [%lld])", name, (long long)Dv);
        }
        snprintf(name, sizeof name, "%sstd_scale", tp);
        v->std_scale = g4_loader_vector(&L, name, Dv);
    }
    snprintf(name, sizeof name, "%sembedding_projection", ep);
    g4_loader_matrix(&L, name, 1, 0, m->config.text.hidden_size, Dv, &v->embed_proj);
    st = g4_loader_finish(&L, m->path);
    g4_matrix *mats[] = {&v->input_proj, &v->pos_table, &v->embed_proj};
    for (size_t k = 0; st == G4_OK && k < sizeof mats / sizeof mats[0]; k++) st = g4_loader_prepare_matrix(&L, mats[k]);
    for (int i = 0; st == G4_OK && i < vc->n_layers; i++) {
        vision_layer *w = &v->layers[i];
        clipped_linear *lins[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down};
        for (size_t k = 0; st == G4_OK && k < sizeof lins / sizeof lins[0]; k++)
            st = g4_loader_prepare_matrix(&L, &lins[k]->w);
    }
    g4_loader_free(&L);
    v->n_params = m->n_params - text_params;
    for (int f = 0; f < 5; f++) v->weight_bytes += m->weight_bytes_by_format[f] - text_bytes[f];
    m->n_params = text_params;
    memcpy(m->weight_bytes_by_format, text_bytes, sizeof text_bytes);
    return st;
}

uint64_t g4_vision_tower_params(const g4_model *m) { return m->vision ? m->vision->n_params : 0; }

void g4_vision_tower_free(g4_model *m) {
    if (!m->vision) return;
    free(m->vision->layers);
    free(m->vision);
    m->vision = NULL;
}

/* Working buffers of one encode call. */
typedef struct {
    float *h, *a, *xc, *q, *k, *v, *attn, *gate, *up, *t1;
    int32_t *pos_xy, *ids, *slots, *pos, *seq, *ranges, *table;
    void *kv;
} vision_scratch;

static void clipped_apply(g4_backend *be, const clipped_linear *l, float *out, const float *x, float *xc, int n) {
    const float *in = x;
    if (l->clipped) {
        be->ops->clamp(be, xc, x, l->in_lo, l->in_hi, (size_t)n * l->w.cols);
        in = xc;
    }
    be->ops->matmul_precise(be, out, in, n, &l->w);
    if (l->clipped) be->ops->clamp(be, out, out, l->out_lo, l->out_hi, (size_t)n * l->w.rows);
}

static void encoder_layer(const g4_model *m, const vision_layer *w, vision_scratch *s, int n,
                          const g4_attn_batch *ab) {
    g4_backend *be = m->backend;
    const g4_vision_config *vc = &m->config.vision;
    const int Dv = vc->hidden_size, H = vc->n_heads, Dh = vc->head_dim, Iv = vc->intermediate_size;
    const float eps = vc->rms_eps;
    be->ops->rmsnorm(be, s->a, s->h, w->input_norm, n, Dv, eps);
    clipped_apply(be, &w->q, s->q, s->a, s->xc, n);
    clipped_apply(be, &w->k, s->k, s->a, s->xc, n);
    clipped_apply(be, &w->v, s->v, s->a, s->xc, n);
    be->ops->rmsnorm(be, s->q, s->q, w->q_norm, n * H, Dh, eps);
    be->ops->rope_2d(be, s->q, n, H, Dh, s->pos_xy, vc->rope_theta);
    be->ops->rmsnorm(be, s->k, s->k, w->k_norm, n * H, Dh, eps);
    be->ops->rope_2d(be, s->k, n, H, Dh, s->pos_xy, vc->rope_theta);
    be->ops->rmsnorm(be, s->v, s->v, NULL, n * H, Dh, eps);
    be->ops->kv_store(be, s->kv, s->k, s->v, ab, 0);
    be->ops->attention(be, s->attn, s->q, s->kv, ab, 0, H, 1.0f);
    clipped_apply(be, &w->o, s->t1, s->attn, s->xc, n);
    be->ops->rmsnorm(be, s->t1, s->t1, w->post_attn_norm, n, Dv, eps);
    be->ops->add(be, s->h, s->h, s->t1, (size_t)n * Dv);
    be->ops->rmsnorm(be, s->a, s->h, w->pre_ffn_norm, n, Dv, eps);
    clipped_apply(be, &w->gate, s->gate, s->a, s->xc, n);
    clipped_apply(be, &w->up, s->up, s->a, s->xc, n);
    be->ops->gelu_mul(be, s->gate, s->gate, s->up, (size_t)n * Iv);
    clipped_apply(be, &w->down, s->t1, s->gate, s->xc, n);
    be->ops->rmsnorm(be, s->t1, s->t1, w->post_ffn_norm, n, Dv, eps);
    be->ops->add(be, s->h, s->h, s->t1, (size_t)n * Dv);
}

g4_status g4_vision_encode(const g4_model *m, const float *pixel_values, const int32_t *positions, int n_rows,
                           float **soft, int *n_soft) {
    *soft = NULL;
    *n_soft = 0;
    const struct g4_vision_weights *v = m->vision;
    const g4_vision_config *vc = &m->config.vision;
    if (!v) return g4_fail(G4_ERR_UNSUPPORTED, "%s has no vision tower", m->path);
    g4_backend *be = m->backend;
    const int k = vc->pooling_kernel, kk = k * k;
    const int Dv = vc->hidden_size, H = vc->n_heads, Dh = vc->head_dim, Iv = vc->intermediate_size;
    const int d_text = m->config.text.hidden_size;
    const int patch_values = 3 * vc->patch_size * vc->patch_size;
    if (n_rows <= 0 || n_rows % kk)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d patch rows is not a positive multiple of %d", n_rows, kk);
    /* Valid patches come first (the processor pads at the end); padding rows
     * affect nothing, so only the valid ones are computed. */
    int n = 0, max_x = 0;
    while (n < n_rows && positions[2 * n] >= 0 && positions[2 * n + 1] >= 0) n++;
    for (int r = n; r < n_rows; r++)
        if (positions[2 * r] != -1 || positions[2 * r + 1] != -1)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "patch row %d has a position after the padding began", r);
    if (n == 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "image has no patches");
    for (int r = 0; r < n; r++) {
        if (positions[2 * r] >= v->pos_size || positions[2 * r + 1] >= v->pos_size)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "patch position (%d, %d) exceeds the %d-entry position table",
                           positions[2 * r], positions[2 * r + 1], v->pos_size);
        if (positions[2 * r] + 1 > max_x) max_x = positions[2 * r] + 1;
    }
    const int n_out = n_rows / kk, slots_per_row = max_x / k;
    /* pooled slot of each patch, and which slots hold any patch (kept in slot order) */
    int32_t *slot = malloc((size_t)n * sizeof *slot), *ids = malloc((size_t)n * 2 * sizeof *ids);
    int32_t *compact = malloc((size_t)n_out * sizeof *compact), *pos = malloc((size_t)n * sizeof *pos);
    int32_t *ranges = malloc((size_t)n * 4 * sizeof *ranges);
    if (!slot || !ids || !compact || !pos || !ranges) {
        free(slot), free(ids), free(compact), free(pos), free(ranges);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int s = 0; s < n_out; s++) compact[s] = -1;
    g4_status st = G4_OK;
    for (int r = 0; r < n; r++) {
        int s = positions[2 * r] / k + slots_per_row * (positions[2 * r + 1] / k);
        if (s >= n_out) {
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "patch (%d, %d) pools outside the %d output tokens",
                         positions[2 * r], positions[2 * r + 1], n_out);
            break;
        }
        slot[r] = s;
        compact[s] = 0;
        ids[r] = positions[2 * r];
        ids[n + r] = v->pos_size + positions[2 * r + 1];
        pos[r] = r;
        ranges[4 * r + 0] = ranges[4 * r + 2] = 0;
        ranges[4 * r + 1] = ranges[4 * r + 3] = n - 1;
    }
    int kept = 0;
    for (int s = 0; s < n_out; s++)
        if (compact[s] == 0) compact[s] = kept++;
    for (int r = 0; st == G4_OK && r < n; r++) slot[r] = compact[slot[r]];

    vision_scratch s = {0};
    size_t wide = (size_t)(Iv > Dv ? Iv : Dv) > (size_t)H * Dh ? (size_t)(Iv > Dv ? Iv : Dv) : (size_t)H * Dh;
    float **fbufs[] = {&s.h, &s.a, &s.xc, &s.q, &s.k, &s.v, &s.attn, &s.gate, &s.up, &s.t1};
    size_t fsizes[] = {(size_t)n * (Dv > patch_values ? Dv : patch_values), (size_t)n * Dv, (size_t)n * wide,
                       (size_t)n * H * Dh, (size_t)n * H * Dh, (size_t)n * H * Dh, (size_t)n * H * Dh,
                       (size_t)n * Iv, (size_t)n * Iv, (size_t)n * (Dv > d_text ? Dv : d_text)};
    for (size_t i = 0; st == G4_OK && i < sizeof fbufs / sizeof fbufs[0]; i++) {
        *fbufs[i] = be->ops->alloc(be, fsizes[i] * sizeof(float));
        if (!*fbufs[i]) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the vision tower (%d patches)", n);
    }
    int32_t **ibufs[] = {&s.pos_xy, &s.ids, &s.slots, &s.pos, &s.seq, &s.ranges, &s.table};
    size_t isizes[] = {(size_t)n * 2, (size_t)n * 2, (size_t)n, (size_t)n, (size_t)n, (size_t)n * 4, 1};
    for (size_t i = 0; st == G4_OK && i < sizeof ibufs / sizeof ibufs[0]; i++) {
        *ibufs[i] = be->ops->alloc(be, isizes[i] * sizeof(int32_t));
        if (!*ibufs[i]) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the vision tower");
    }
    if (st == G4_OK) {
        s.kv = be->ops->kv_alloc(be, 1, n, H, Dh, G4_KV_F32);
        if (!s.kv) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the vision tower's attention");
    }
    float *out = NULL;
    if (st == G4_OK) {
        int32_t zero = 0;
        be->ops->to_device(be, s.pos_xy, positions, (size_t)n * 2 * sizeof(int32_t));
        be->ops->to_device(be, s.ids, ids, (size_t)n * 2 * sizeof(int32_t));
        be->ops->to_device(be, s.slots, slot, (size_t)n * sizeof(int32_t));
        be->ops->to_device(be, s.pos, pos, (size_t)n * sizeof(int32_t));
        be->ops->to_device(be, s.ranges, ranges, (size_t)n * 4 * sizeof(int32_t));
        be->ops->to_device(be, s.table, &zero, sizeof zero);
        for (int r = 0; r < n; r++) pos[r] = 0;
        be->ops->to_device(be, s.seq, pos, (size_t)n * sizeof(int32_t));
        g4_attn_batch ab = {.n_tokens = n, .pos = s.pos, .seq = s.seq, .kv_range = s.ranges,
                            .full_tables = s.table, .full_table_stride = 1, .sliding_tables = s.table,
                            .ring_blocks = 1, .block_size = n};
        /* patch embedding: input_proj(2 (p - 1/2)) + table[x] + table[P + y] */
        be->ops->to_device(be, s.h, pixel_values, (size_t)n * patch_values * sizeof(float));
        be->ops->affine(be, s.h, s.h, 2.0f, -1.0f, (size_t)n * patch_values);
        be->ops->matmul_precise(be, s.a, s.h, n, &v->input_proj);
        be->ops->embed(be, s.q, &v->pos_table, s.ids, n, 1.0f);
        be->ops->embed(be, s.k, &v->pos_table, s.ids + n, n, 1.0f);
        be->ops->add(be, s.h, s.a, s.q, (size_t)n * Dv);
        be->ops->add(be, s.h, s.h, s.k, (size_t)n * Dv);
        for (int i = 0; i < vc->n_layers; i++) encoder_layer(m, &v->layers[i], &s, n, &ab);
        /* pooling (sum / k^2) and the sqrt(width) scale in one pass */
        be->ops->pool_rows(be, s.a, s.h, s.slots, n, kept, Dv, (float)(sqrt((double)Dv) / kk));
        if (vc->standardize) {
            be->ops->add_rows(be, s.a, s.a, v->std_neg_bias, kept, Dv);
            be->ops->mul_rows(be, s.a, s.a, v->std_scale, kept, Dv);
        }
        be->ops->rmsnorm(be, s.a, s.a, NULL, kept, Dv, vc->rms_eps);
        out = be->ops->alloc(be, (size_t)kept * d_text * sizeof(float));
        if (!out)
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        else
            be->ops->matmul_precise(be, out, s.a, kept, &v->embed_proj);
    }
    if (s.kv) be->ops->kv_free(be, s.kv);
    for (size_t i = 0; i < sizeof fbufs / sizeof fbufs[0]; i++)
        if (*fbufs[i]) be->ops->release(be, *fbufs[i]);
    for (size_t i = 0; i < sizeof ibufs / sizeof ibufs[0]; i++)
        if (*ibufs[i]) be->ops->release(be, *ibufs[i]);
    free(slot), free(ids), free(compact), free(pos), free(ranges);
    if (st != G4_OK) return st;
    *soft = out;
    *n_soft = kept;
    return G4_OK;
}
