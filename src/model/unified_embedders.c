#include "model/unified_embedders.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/weight_loader.h"

struct g4_unified_weights {
    int has_vision, has_audio;
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b, *pos_norm_w, *pos_norm_b, *dense_b;
    g4_matrix dense;       /* [D, 6912] */
    g4_matrix pos_table;   /* [P * 2, D]: row 2x is axis x, row 2y+1 axis y */
    int pos_size;
    g4_matrix vision_proj; /* [d_text, D] */
    g4_matrix audio_proj;  /* [d_text, 640] */
};

/* The first prefix under which `suffix` names a tensor, or NULL. */
static const char *find_prefix(const g4_model *m, const char *const *prefixes, size_t n, const char *suffix) {
    char name[512];
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s%s", prefixes[i], suffix);
        if (g4_st_find(m->tensors, name)) return prefixes[i];
    }
    return NULL;
}

g4_status g4_unified_embedders_load(g4_model *m) {
    const g4_unified_config *uc = &m->config.unified_mm;
    if (!m->config.unified || (!uc->vision_present && !uc->audio_present)) return G4_OK;
    struct g4_unified_weights *u = calloc(1, sizeof *u);
    if (!u) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    m->unified = u;
    g4_weight_loader L;
    g4_status st = g4_loader_init(&L, m);
    if (st != G4_OK) return st;
    uint64_t text_params = m->n_params, text_bytes[5];
    memcpy(text_bytes, m->weight_bytes_by_format, sizeof text_bytes);
    const int64_t d = m->config.text.hidden_size, D = uc->mm_embed_dim, patch = 3 * (int64_t)uc->patch_size * uc->patch_size;
    char name[512];
    if (uc->vision_present) {
        static const char *const vision_prefixes[] = {"model.vision_embedder.", "model.embed_vision.",
                                                      "vision_embedder.", "embed_vision."};
        static const char *const proj_prefixes[] = {"model.embed_vision.multimodal_embedder.", "model.embed_vision.",
                                                    "embed_vision.multimodal_embedder.", "embed_vision."};
        const char *vp = find_prefix(m, vision_prefixes, 4, "patch_dense.weight");
        const char *pp = find_prefix(m, proj_prefixes, 4, "embedding_projection.weight");
        if (!pp) pp = find_prefix(m, proj_prefixes, 4, "embedding_projection.scales");
        if (!vp) vp = vision_prefixes[0]; /* report the missing tensors under the hub names */
        if (!pp) pp = proj_prefixes[1];
        const struct {
            const char *suffix;
            float **dst;
            int64_t n;
        } vectors[] = {{"patch_ln1.weight", &u->ln1_w, patch}, {"patch_ln1.bias", &u->ln1_b, patch},
                       {"patch_dense.bias", &u->dense_b, D},   {"patch_ln2.weight", &u->ln2_w, D},
                       {"patch_ln2.bias", &u->ln2_b, D},       {"pos_norm.weight", &u->pos_norm_w, D},
                       {"pos_norm.bias", &u->pos_norm_b, D}};
        for (size_t k = 0; k < sizeof vectors / sizeof vectors[0]; k++) {
            snprintf(name, sizeof name, "%s%s", vp, vectors[k].suffix);
            *vectors[k].dst = g4_loader_vector(&L, name, vectors[k].n);
        }
        snprintf(name, sizeof name, "%spatch_dense", vp);
        g4_loader_matrix(&L, name, 1, 0, D, patch, &u->dense);
        snprintf(name, sizeof name, "%spos_embedding", vp);
        g4_loader_matrix(&L, name, 0, uc->position_table_size, 2, D, &u->pos_table);
        u->pos_size = uc->position_table_size;
        snprintf(name, sizeof name, "%sembedding_projection", pp);
        g4_loader_matrix(&L, name, 1, 0, d, D, &u->vision_proj);
        u->has_vision = 1;
    }
    if (uc->audio_present) {
        static const char *const audio_prefixes[] = {"model.embed_audio.", "embed_audio."};
        const char *ap = find_prefix(m, audio_prefixes, 2, "embedding_projection.weight");
        snprintf(name, sizeof name, "%sembedding_projection", ap ? ap : audio_prefixes[0]);
        g4_loader_matrix(&L, name, 1, 0, d, uc->audio_frame_samples, &u->audio_proj);
        u->has_audio = 1;
    }
    st = g4_loader_finish(&L, m->path);
    g4_matrix *mats[] = {&u->dense, &u->pos_table, &u->vision_proj, &u->audio_proj};
    for (size_t k = 0; st == G4_OK && k < sizeof mats / sizeof mats[0]; k++) st = g4_loader_prepare_matrix(&L, mats[k]);
    g4_loader_free(&L);
    /* keep the embedders out of the text decoder's totals */
    m->n_params = text_params;
    memcpy(m->weight_bytes_by_format, text_bytes, sizeof text_bytes);
    return st;
}

void g4_unified_embedders_free(g4_model *m) {
    free(m->unified);
    m->unified = NULL;
}

g4_status g4_unified_vision_encode(const g4_model *m, const float *pixel_values, const int32_t *positions, int n_rows,
                                   g4_hidden_hook hook, void *hook_ctx, float **soft, int *n_soft) {
    *soft = NULL;
    *n_soft = 0;
    const struct g4_unified_weights *u = m->unified;
    if (!u || !u->has_vision) return g4_fail(G4_ERR_UNSUPPORTED, "%s has no vision embedder", m->path);
    g4_backend *be = m->backend;
    const g4_unified_config *uc = &m->config.unified_mm;
    const int D = uc->mm_embed_dim, patch = 3 * uc->patch_size * uc->patch_size, d = m->config.text.hidden_size;
    const float ln_eps = uc->layer_norm_eps;
    int n = 0;
    while (n < n_rows && positions[2 * n] >= 0 && positions[2 * n + 1] >= 0) n++;
    if (n == 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "image has no patches");
    int32_t *ids = malloc((size_t)n * 2 * sizeof *ids);
    if (!ids) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (int r = 0; r < n; r++) {
        int x = positions[2 * r], y = positions[2 * r + 1];
        if (x >= u->pos_size || y >= u->pos_size) {
            free(ids);
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "patch position (%d, %d) exceeds the %d-entry position table", x,
                           y, u->pos_size);
        }
        ids[r] = 2 * x;         /* table[x][0] */
        ids[n + r] = 2 * y + 1; /* table[y][1] */
    }
    float *px = be->ops->alloc(be, (size_t)n * patch * sizeof(float));
    float *h = be->ops->alloc(be, (size_t)n * D * sizeof(float));
    float *pos = be->ops->alloc(be, (size_t)n * D * sizeof(float));
    float *out = be->ops->alloc(be, (size_t)n * d * sizeof(float));
    int32_t *dev_ids = be->ops->alloc(be, (size_t)n * 2 * sizeof(int32_t));
    g4_status st = (px && h && pos && out && dev_ids) ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK) {
        be->ops->to_device(be, px, pixel_values, (size_t)n * patch * sizeof(float));
        be->ops->to_device(be, dev_ids, ids, (size_t)n * 2 * sizeof(int32_t));
        be->ops->layer_norm(be, px, px, u->ln1_w, u->ln1_b, n, patch, ln_eps);
        be->ops->matmul(be, h, px, n, &u->dense);
        be->ops->add_rows(be, h, h, u->dense_b, n, D);
        if (hook) hook(hook_ctx, "patch_dense", h, n, D);
        be->ops->layer_norm(be, h, h, u->ln2_w, u->ln2_b, n, D, ln_eps);
        if (hook) hook(hook_ctx, "patch_ln2", h, n, D);
        be->ops->embed(be, pos, &u->pos_table, dev_ids, n, 1.0f);
        be->ops->add(be, h, h, pos, (size_t)n * D);
        be->ops->embed(be, pos, &u->pos_table, dev_ids + n, n, 1.0f);
        be->ops->add(be, h, h, pos, (size_t)n * D);
        be->ops->layer_norm(be, h, h, u->pos_norm_w, u->pos_norm_b, n, D, ln_eps);
        if (hook) hook(hook_ctx, "pos_norm", h, n, D);
        be->ops->rmsnorm(be, h, h, NULL, n, D, 1e-6f);
        be->ops->matmul(be, out, h, n, &u->vision_proj);
    }
    free(ids);
    if (px) be->ops->release(be, px);
    if (h) be->ops->release(be, h);
    if (pos) be->ops->release(be, pos);
    if (dev_ids) be->ops->release(be, dev_ids);
    if (st != G4_OK) {
        if (out) be->ops->release(be, out);
        return st;
    }
    *soft = out;
    *n_soft = n;
    return G4_OK;
}

g4_status g4_unified_audio_encode(const g4_model *m, const float *frames, int n, float **soft) {
    *soft = NULL;
    const struct g4_unified_weights *u = m->unified;
    if (!u || !u->has_audio) return g4_fail(G4_ERR_UNSUPPORTED, "%s has no audio embedder", m->path);
    if (n <= 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "audio clip without frames");
    g4_backend *be = m->backend;
    const int F = m->config.unified_mm.audio_frame_samples, d = m->config.text.hidden_size;
    float *x = be->ops->alloc(be, (size_t)n * F * sizeof(float));
    float *out = be->ops->alloc(be, (size_t)n * d * sizeof(float));
    if (!x || !out) {
        if (x) be->ops->release(be, x);
        if (out) be->ops->release(be, out);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    be->ops->to_device(be, x, frames, (size_t)n * F * sizeof(float));
    be->ops->rmsnorm(be, x, x, NULL, n, F, 1e-6f);
    be->ops->matmul(be, out, x, n, &u->audio_proj);
    be->ops->release(be, x);
    *soft = out;
    return G4_OK;
}
