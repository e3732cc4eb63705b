/* What a token costs: bytes read by a decode step and FLOPs of a prefill
 * token, for the limits `gemma4 bench` prints beside measured speed. */
#include "model/model.h"
#include "model/kv_cache.h"

static uint64_t matrix_bytes(const g4_matrix *m) { return m->data ? g4_matrix_bytes(m) : 0; }

static uint64_t expert_bytes(const g4_expert_matrix *e, int k) {
    if (!e->all.data || e->n_experts == 0) return 0;
    g4_matrix one = g4_expert_view(e, 0);
    return (uint64_t)k * g4_matrix_bytes(&one);
}

uint64_t g4_model_decode_weight_bytes(const g4_model *m) {
    const g4_text_config *tc = &m->config.text;
    const g4_text_weights *tw = &m->text;
    uint64_t total = matrix_bytes(&tw->embed);                        /* LM head */
    total += tw->embed.rows ? matrix_bytes(&tw->embed) / tw->embed.rows : 0; /* one embedding row */
    if (tc->ple_dim > 0) {
        total += tw->ple_embed.rows ? matrix_bytes(&tw->ple_embed) / tw->ple_embed.rows : 0;
        total += matrix_bytes(&tw->ple_model_proj);
    }
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_text_layer *w = &tw->layers[i];
        const g4_matrix *mats[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down, &w->ple_gate, &w->ple_proj,
                                   &w->router};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) total += matrix_bytes(mats[k]);
        if (tc->moe) {
            total += expert_bytes(&w->expert_gate, tc->top_k_experts);
            total += expert_bytes(&w->expert_up, tc->top_k_experts);
            total += expert_bytes(&w->expert_down, tc->top_k_experts);
        }
    }
    return total;
}

uint64_t g4_model_decode_kv_bytes(const g4_model *m, int ctx, g4_kv_type type) {
    const g4_text_config *tc = &m->config.text;
    uint64_t total = 0;
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_layer_config *lc = &tc->layers[i];
        int visible = lc->kind == G4_LAYER_SLIDING && ctx > tc->sliding_window ? tc->sliding_window : ctx;
        total += (uint64_t)visible * lc->n_kv_heads * 2 * g4_kv_row_bytes(type, lc->head_dim);
    }
    return total;
}

static double matrix_flops(const g4_matrix *m) { return m->data ? 2.0 * (double)m->rows * (double)m->cols : 0; }

double g4_model_flops_per_token(const g4_model *m) {
    const g4_text_config *tc = &m->config.text;
    const g4_text_weights *tw = &m->text;
    double total = matrix_flops(&tw->ple_model_proj); /* LM head excluded: a prefill needs it for one row */
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_text_layer *w = &tw->layers[i];
        const g4_matrix *mats[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down, &w->ple_gate, &w->ple_proj,
                                   &w->router};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) total += matrix_flops(mats[k]);
        if (tc->moe) {
            double per_expert = 2.0 * 3.0 * (double)tc->moe_width * (double)tc->hidden_size;
            total += per_expert * tc->top_k_experts;
        }
    }
    return total;
}
