/* Loading a model directory: config, tensors, layout detection, the text
 * decoder's weights (towers are loaded by their own files). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "model/audio_tower.h"
#include "model/model.h"
#include "model/unified_embedders.h"
#include "model/vision_tower.h"
#include "model/weight_loader.h"

/* Where the text decoder's tensors live, in the order we probe:
 * HF multimodal, MLX (mlx-vlm, and mlx-lm exports of multimodal repos),
 * HF/mlx-lm text-only. */
static const char *const text_prefixes[] = {"model.language_model.", "language_model.model.", "model.",
                                            "language_model."};

static const char *detect_text_prefix(const g4_st_set *set) {
    char name[256];
    for (size_t i = 0; i < sizeof text_prefixes / sizeof text_prefixes[0]; i++) {
        snprintf(name, sizeof name, "%sembed_tokens.weight", text_prefixes[i]);
        if (g4_st_find(set, name)) return text_prefixes[i];
    }
    return NULL;
}

/* MLX conversions: quantised modules (.scales), split expert tensors
 * (switch_glu) or the mlx-vlm prefix. Never decided from the folder name. */
static g4_layout detect_layout(const g4_st_set *set, const char *prefix) {
    if (!strcmp(prefix, "language_model.model.")) return G4_LAYOUT_MLX;
    for (size_t i = 0; i < g4_st_count(set); i++) {
        const char *n = g4_st_at(set, i)->name;
        size_t len = strlen(n);
        if ((len > 7 && !strcmp(n + len - 7, ".scales")) || strstr(n, "switch_glu.")) return G4_LAYOUT_MLX;
    }
    return G4_LAYOUT_HF;
}

static void layer_name(char *buf, size_t n, const char *prefix, int layer, const char *suffix) {
    snprintf(buf, n, "%slayers.%d.%s", prefix, layer, suffix);
}

/* name = "<prefix>layers.<i>.<suffix>" in a 512-byte buffer; returns name. */
static const char *lname(char *name, const char *prefix, int layer, const char *suffix) {
    layer_name(name, 512, prefix, layer, suffix);
    return name;
}

/* HF stores each MoE layer's experts as one gate_up_proj [E, 2I, d]; MLX
 * splits it into switch_glu.gate_proj and .up_proj. Synthetic models use
 * the layout they were made in. */
static int stacked_gate_up(const g4_model *m, int layer) {
    if (m->synthetic) return m->layout == G4_LAYOUT_HF;
    char gu[512];
    layer_name(gu, sizeof gu, m->text_prefix, layer, "experts.gate_up_proj");
    return g4_st_find(m->tensors, gu) != NULL;
}

static void load_text_layer(g4_weight_loader *L, int i, g4_text_layer *w) {
    const g4_model *m = L->model;
    const g4_text_config *tc = &m->config.text;
    const g4_layer_config *lc = &tc->layers[i];
    const char *p = m->text_prefix;
    const int64_t d = tc->hidden_size, D = lc->head_dim, Hq = tc->n_heads, Hkv = lc->n_kv_heads;
    char name[512];
    w->input_norm = g4_loader_vector(L, lname(name, p, i, "input_layernorm.weight"), d);
    w->post_attn_norm = g4_loader_vector(L, lname(name, p, i, "post_attention_layernorm.weight"), d);
    w->pre_ffn_norm = g4_loader_vector(L, lname(name, p, i, "pre_feedforward_layernorm.weight"), d);
    w->post_ffn_norm = g4_loader_vector(L, lname(name, p, i, "post_feedforward_layernorm.weight"), d);
    w->layer_scalar = g4_loader_scalar(L, lname(name, p, i, "layer_scalar"));
    g4_loader_matrix(L, lname(name, p, i, "self_attn.q_proj"), 1, 0, Hq * D, d, &w->q);
    w->q_norm = g4_loader_vector(L, lname(name, p, i, "self_attn.q_norm.weight"), D);
    g4_loader_matrix(L, lname(name, p, i, "self_attn.o_proj"), 1, 0, d, Hq * D, &w->o);
    if (lc->kv_donor < 0) {
        g4_loader_matrix(L, lname(name, p, i, "self_attn.k_proj"), 1, 0, Hkv * D, d, &w->k);
        w->k_norm = g4_loader_vector(L, lname(name, p, i, "self_attn.k_norm.weight"), D);
        if (!lc->k_eq_v) g4_loader_matrix(L, lname(name, p, i, "self_attn.v_proj"), 1, 0, Hkv * D, d, &w->v);
    } else {
        /* KV-shared layers: transformers ignores stored k/v; so do we. */
        const char *ignored[] = {"self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight",
                                 "self_attn.k_proj.scales", "self_attn.k_proj.biases", "self_attn.v_proj.scales",
                                 "self_attn.v_proj.biases"};
        for (size_t k = 0; k < sizeof ignored / sizeof ignored[0]; k++) g4_loader_find(L, lname(name, p, i, ignored[k]));
    }
    g4_loader_matrix(L, lname(name, p, i, "mlp.gate_proj"), 1, 0, lc->mlp_width, d, &w->gate);
    g4_loader_matrix(L, lname(name, p, i, "mlp.up_proj"), 1, 0, lc->mlp_width, d, &w->up);
    g4_loader_matrix(L, lname(name, p, i, "mlp.down_proj"), 1, 0, d, lc->mlp_width, &w->down);
    if (tc->ple_dim > 0) {
        g4_loader_matrix(L, lname(name, p, i, "per_layer_input_gate"), 1, 0, tc->ple_dim, d, &w->ple_gate);
        g4_loader_matrix(L, lname(name, p, i, "per_layer_projection"), 1, 0, d, tc->ple_dim, &w->ple_proj);
        w->ple_post_norm = g4_loader_vector(L, lname(name, p, i, "post_per_layer_input_norm.weight"), d);
    }
    if (tc->moe) {
        const int64_t E = tc->n_experts, I = tc->moe_width;
        g4_loader_matrix(L, lname(name, p, i, "router.proj"), 1, 0, E, d, &w->router);
        /* fold hidden_size^-0.5 into the learned scale once */
        w->router_scale = g4_loader_vector_scaled(L, lname(name, p, i, "router.scale"), d,
                                                  (float)(1.0 / sqrt((double)d)));
        w->per_expert_scale = g4_loader_vector(L, lname(name, p, i, "router.per_expert_scale"), E);
        w->pre_ffn_norm2 = g4_loader_vector(L, lname(name, p, i, "pre_feedforward_layernorm_2.weight"), d);
        w->post_ffn_norm1 = g4_loader_vector(L, lname(name, p, i, "post_feedforward_layernorm_1.weight"), d);
        w->post_ffn_norm2 = g4_loader_vector(L, lname(name, p, i, "post_feedforward_layernorm_2.weight"), d);
        char gu[512], dn[512];
        layer_name(gu, sizeof gu, p, i, "experts.gate_up_proj");
        layer_name(dn, sizeof dn, p, i, "experts.down_proj");
        int hf_experts = stacked_gate_up(m, i);
        w->expert_gate.n_experts = w->expert_up.n_experts = w->expert_down.n_experts = (int)E;
        w->expert_gate.rows_per_expert = w->expert_up.rows_per_expert = I;
        w->expert_down.rows_per_expert = d;
        w->expert_down.expert_stride = d;
        if (hf_experts) {
            g4_loader_matrix(L, gu, 0, E, 2 * I, d, &w->expert_gate.all);
            w->expert_gate.expert_stride = w->expert_up.expert_stride = 2 * I;
            w->expert_up.row_offset = I; /* gate rows first, then up */
            g4_loader_matrix(L, dn, 0, E, d, I, &w->expert_down.all);
        } else {
            g4_loader_matrix(L, lname(name, p, i, "experts.switch_glu.gate_proj"), 1, E, I, d, &w->expert_gate.all);
            g4_loader_matrix(L, lname(name, p, i, "experts.switch_glu.up_proj"), 1, E, I, d, &w->expert_up.all);
            g4_loader_matrix(L, lname(name, p, i, "experts.switch_glu.down_proj"), 1, E, d, I, &w->expert_down.all);
            w->expert_gate.expert_stride = w->expert_up.expert_stride = I;
        }
    }
}

static g4_status prepare_layer(g4_weight_loader *L, g4_text_layer *w, int hf_experts) {
    /* q, k and v (what the layer has of them) offered to the backend as one
     * group, which it may stack into one matrix (attention_input then runs
     * one matmul for the three) */
    g4_matrix *qkv[] = {&w->q, &w->k, &w->v};
    const int n_qkv = !w->k.data ? 1 : !w->v.data ? 2 : 3;
    g4_status st = G4_OK;
    if (n_qkv > 1)
        g4_loader_prepare_stacked(L, qkv, n_qkv, &w->qkv, &st);
    else
        st = g4_loader_prepare_matrix(L, &w->q);
    if (st != G4_OK) return st;
    /* the MLP's gate and up the same way (matmul_gate_up) */
    g4_matrix *gate_up[] = {&w->gate, &w->up};
    if (w->gate.data && w->up.data && w->gate.rows == w->up.rows)
        g4_loader_prepare_stacked(L, gate_up, 2, &w->gate_up, &st);
    else
        for (int k = 0; k < 2 && st == G4_OK; k++) st = g4_loader_prepare_matrix(L, gate_up[k]);
    if (st != G4_OK) return st;
    g4_matrix *mats[] = {&w->o, &w->down, &w->ple_gate, &w->ple_proj,
                         &w->router, &w->expert_gate.all, &w->expert_down.all};
    for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) {
        st = g4_loader_prepare_matrix(L, mats[k]);
        if (st != G4_OK) return st;
    }
    if (hf_experts)
        w->expert_up.all = w->expert_gate.all; /* one stacked gate_up tensor */
    else
        return g4_loader_prepare_matrix(L, &w->expert_up.all);
    return G4_OK;
}

static g4_status load_text(g4_model *m) {
    const g4_text_config *tc = &m->config.text;
    g4_text_weights *tw = &m->text;
    g4_weight_loader L;
    g4_status st = g4_loader_init(&L, m);
    if (st != G4_OK) return st;
    const char *p = m->text_prefix;
    const int64_t d = tc->hidden_size;
    char name[512];
    snprintf(name, sizeof name, "%sembed_tokens", p);
    g4_loader_matrix(&L, name, 1, 0, tc->vocab_size, d, &tw->embed);
    snprintf(name, sizeof name, "%snorm.weight", p);
    tw->final_norm = g4_loader_vector(&L, name, d);
    tw->embed_scale = g4_round_bf16(sqrtf((float)d));
    /* A stored lm_head must be the tied copy; an untied head is not supported. */
    if (g4_loader_find(&L, "lm_head.weight") || g4_loader_find(&L, "language_model.lm_head.weight")) {
        if (!m->config.tie_embeddings)
            g4_loader_problem(&L, "untied lm_head.weight (tie_word_embeddings=false) is not supported");
    }
    if (tc->ple_dim > 0) {
        const int64_t LP = (int64_t)tc->n_layers * tc->ple_dim;
        snprintf(name, sizeof name, "%sembed_tokens_per_layer", p);
        g4_loader_matrix(&L, name, 1, 0, tc->ple_vocab, LP, &tw->ple_embed);
        snprintf(name, sizeof name, "%sper_layer_model_projection", p);
        g4_loader_matrix(&L, name, 1, 0, LP, d, &tw->ple_model_proj);
        snprintf(name, sizeof name, "%sper_layer_projection_norm.weight", p);
        tw->ple_proj_norm = g4_loader_vector(&L, name, tc->ple_dim);
        tw->ple_embed_scale = g4_round_bf16(sqrtf((float)tc->ple_dim));
    }
    tw->layers = calloc((size_t)tc->n_layers, sizeof *tw->layers);
    if (!tw->layers) {
        g4_loader_free(&L);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < tc->n_layers; i++) load_text_layer(&L, i, &tw->layers[i]);
    st = g4_loader_finish(&L, m->path);
    if (st == G4_OK) st = g4_loader_prepare_matrix(&L, &tw->embed);
    if (st == G4_OK) st = g4_loader_prepare_matrix(&L, &tw->ple_embed);
    if (st == G4_OK) st = g4_loader_prepare_matrix(&L, &tw->ple_model_proj);
    for (int i = 0; st == G4_OK && i < tc->n_layers; i++) st = prepare_layer(&L, &tw->layers[i], stacked_gate_up(m, i));
    g4_loader_free(&L);
    return st;
}

g4_status g4_model_load_dir(const char *dir, g4_backend *be, g4_model **out) {
    *out = NULL;
    g4_model *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    m->backend = be;
    m->path = strdup(dir);
    g4_status st = m->path ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK && !g4_is_directory(dir)) st = g4_fail(G4_ERR_NOT_FOUND, "%s: not a model directory", dir);
    if (st == G4_OK) st = g4_config_load(dir, &m->config);
    if (st == G4_OK && m->config.assistant.present)
        st = g4_fail(G4_ERR_UNSUPPORTED,
                     "%s: a %s is an MTP drafter, not a model of its own: load it beside its target "
                     "(--draft %s)",
                     dir, m->config.model_type, dir);
    if (st == G4_OK) st = g4_st_open(dir, &m->tensors);
    if (st == G4_OK) {
        m->text_prefix = detect_text_prefix(m->tensors);
        if (!m->text_prefix)
            st = g4_fail(G4_ERR_FORMAT,
                         "%s: no text decoder found (looked for embed_tokens.weight under model.language_model., "
                         "language_model.model., model. and language_model.)",
                         dir);
    }
    if (st == G4_OK) {
        m->layout = detect_layout(m->tensors, m->text_prefix);
        st = load_text(m);
    }
    if (st == G4_OK) st = g4_vision_tower_load(m);
    if (st == G4_OK) st = g4_unified_embedders_load(m);
    if (st == G4_OK && m->config.audio.present) st = g4_audio_tower_load(m);
    if (st == G4_OK)
        for (size_t t = 0; t < g4_st_count(m->tensors); t++) m->n_unused_tensors += !m->tensor_used[t];
    if (st != G4_OK) {
        g4_model_release(m);
        return st;
    }
    *out = m;
    return G4_OK;
}

void g4_model_release(g4_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_device_allocs; i++) m->backend->ops->release(m->backend, m->device_allocs[i]);
    free(m->device_allocs);
    for (size_t i = 0; i < m->n_host_allocs; i++) free(m->host_allocs[i]);
    free(m->host_allocs);
    free(m->tensor_used);
    g4_vision_tower_free(m);
    g4_unified_embedders_free(m);
    free(m->text.layers);
    g4_audio_tower_free(m);
    g4_st_close(m->tensors);
    g4_config_free(&m->config);
    free(m->path);
    free(m);
}

/* ---- synthetic models ------------------------------------------------------ */

#include "model/presets.h"
#include "model/synth_weights.h"

static const g4_preset *find_preset(const char *name) {
    for (const g4_preset *p = g4_presets; p->name; p++)
        if (!strcmp(p->name, name)) return p;
    return NULL;
}

const char *g4_model_preset_names(void) { return "e2b e4b 26b-a4b 31b 12b"; }

/* bits 4/8 for mlx4/mlx8, -1 for mxfp4, 0 for bf16; -2 when unknown. */
static int format_bits(const char *format) {
    if (!strcmp(format, "bf16")) return 0;
    if (!strcmp(format, "mlx4")) return 4;
    if (!strcmp(format, "mlx8")) return 8;
    if (!strcmp(format, "mxfp4")) return -1;
    return -2;
}

g4_status g4_model_preset_config(const char *preset, const char *format, const char **json, size_t *len) {
    if (format_bits(format) == -2)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "unknown format '%s' (bf16, mlx4, mlx8 or mxfp4)", format);
    char variant[64];
    snprintf(variant, sizeof variant, "%s-mlx4", preset);
    const g4_preset *p = (format_bits(format) == 4 && find_preset(variant)) ? find_preset(variant) : find_preset(preset);
    if (!p) return g4_fail(G4_ERR_NOT_FOUND, "no preset '%s' (have: %s)", preset, g4_model_preset_names());
    *json = p->json;
    *len = p->len;
    return G4_OK;
}

g4_status g4_model_synthesize_json(const char *json, size_t len, const char *label, const char *format,
                                   g4_backend *be, struct g4_synth_record *record, g4_model **out) {
    *out = NULL;
    const int bits = format_bits(format);
    if (bits == -2) return g4_fail(G4_ERR_INVALID_ARGUMENT, "unknown format '%s' (bf16, mlx4, mlx8 or mxfp4)", format);
    g4_model *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    m->backend = be;
    m->synthetic = 1;
    m->synth_record = record;
    char path[160];
    snprintf(path, sizeof path, "synthetic %s (%s)", label, format);
    m->path = strdup(path);
    /* quantised models as mlx-community converts them, bf16 ones as Hugging
     * Face releases them */
    m->text_prefix = bits ? "language_model.model." : "model.language_model.";
    m->layout = bits ? G4_LAYOUT_MLX : G4_LAYOUT_HF;
    g4_status st = m->path ? g4_config_parse(json, len, label, &m->config) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_quant_config *q = &m->config.quant;
    if (st == G4_OK && bits == 0 && q->present)
        st = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: config.json has a quantization block; bf16 needs one without", label);
    if (st == G4_OK && bits && !q->present) {
        /* no mlx-community recipe: quantise every module alike */
        q->present = 1;
        q->defaults = bits < 0 ? (g4_quant_params){G4_QUANT_MXFP4, 4, 32} : (g4_quant_params){G4_QUANT_AFFINE, bits, 64};
    }
    if (st == G4_OK) st = load_text(m);
    if (st == G4_OK && record && record->out_of_memory) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != G4_OK) {
        g4_model_release(m);
        return st;
    }
    *out = m;
    return G4_OK;
}

g4_status g4_model_synthesize(const char *preset, const char *format, g4_backend *be, g4_model **out) {
    *out = NULL;
    const char *json;
    size_t len;
    g4_status st = g4_model_preset_config(preset, format, &json, &len);
    if (st != G4_OK) return st;
    return g4_model_synthesize_json(json, len, preset, format, be, NULL, out);
}
