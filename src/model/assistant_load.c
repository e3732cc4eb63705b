/* Loading an MTP drafter directory and checking it against its target
 * (SPEC-gemma4-unified-assistant B2, B6). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "io/hub.h"
#include "model/assistant.h"
#include "model/weight_loader.h"

static const char *lname(char *name, int layer, const char *suffix) {
    snprintf(name, 512, "model.layers.%d.%s", layer, suffix);
    return name;
}

/* A drafter layer: the Gemma 4 layer without k_proj, v_proj, k_norm (its
 * keys and values are the target's). */
static void load_layer(g4_weight_loader *L, int i, g4_text_layer *w) {
    const g4_text_config *tc = &L->model->config.text;
    const g4_layer_config *lc = &tc->layers[i];
    const int64_t d = tc->hidden_size, D = lc->head_dim, Hq = tc->n_heads;
    char name[512];
    w->input_norm = g4_loader_vector(L, lname(name, i, "input_layernorm.weight"), d);
    w->post_attn_norm = g4_loader_vector(L, lname(name, i, "post_attention_layernorm.weight"), d);
    w->pre_ffn_norm = g4_loader_vector(L, lname(name, i, "pre_feedforward_layernorm.weight"), d);
    w->post_ffn_norm = g4_loader_vector(L, lname(name, i, "post_feedforward_layernorm.weight"), d);
    w->layer_scalar = g4_loader_scalar(L, lname(name, i, "layer_scalar"));
    g4_loader_matrix(L, lname(name, i, "self_attn.q_proj"), 1, 0, Hq * D, d, &w->q);
    w->q_norm = g4_loader_vector(L, lname(name, i, "self_attn.q_norm.weight"), D);
    g4_loader_matrix(L, lname(name, i, "self_attn.o_proj"), 1, 0, d, Hq * D, &w->o);
    g4_loader_matrix(L, lname(name, i, "mlp.gate_proj"), 1, 0, lc->mlp_width, d, &w->gate);
    g4_loader_matrix(L, lname(name, i, "mlp.up_proj"), 1, 0, lc->mlp_width, d, &w->up);
    g4_loader_matrix(L, lname(name, i, "mlp.down_proj"), 1, 0, d, lc->mlp_width, &w->down);
}

/* masked_embedding.token_ordering: int64 [V], a permutation of the vocabulary. */
static void load_token_ordering(g4_weight_loader *L, g4_assistant *a) {
    const char *name = "masked_embedding.token_ordering";
    const int64_t V = L->model->config.text.vocab_size;
    if (L->synthetic) { /* a fixed shuffle: an odd multiplier permutes 0..V-1 when V is a power of two */
        const int64_t mul = (V & (V - 1)) == 0 ? 40503 : 1;
        a->token_ordering = malloc((size_t)V * sizeof *a->token_ordering);
        if (!a->token_ordering) g4_loader_problem(L, "out of memory for %s", name);
        for (int64_t i = 0; a->token_ordering && i < V; i++) a->token_ordering[i] = (int32_t)((i * mul) % V);
        return;
    }
    const g4_st_tensor *t = g4_loader_find(L, name);
    if (!t) {
        g4_loader_problem(L, "missing tensor %s (expected I64 [%lld])", name, (long long)V);
        return;
    }
    if ((t->dtype != G4_DTYPE_I64 && t->dtype != G4_DTYPE_I32) || t->ndim != 1 || t->shape[0] != V) {
        g4_loader_problem(L, "tensor %s is %s with %d dimensions; expected I64 [%lld]", name, g4_dtype_name(t->dtype),
                          t->ndim, (long long)V);
        return;
    }
    a->token_ordering = malloc((size_t)V * sizeof *a->token_ordering);
    unsigned char *seen = calloc((size_t)V, 1);
    if (!a->token_ordering || !seen) {
        free(seen);
        g4_loader_problem(L, "out of memory loading %s", name);
        return;
    }
    for (int64_t i = 0; i < V; i++) {
        int64_t id;
        if (t->dtype == G4_DTYPE_I64) {
            memcpy(&id, (const char *)t->data + 8 * i, 8);
        } else {
            int32_t v32;
            memcpy(&v32, (const char *)t->data + 4 * i, 4);
            id = v32;
        }
        if (id < 0 || id >= V || seen[id]) {
            g4_loader_problem(L, "%s[%lld] = %lld: not a permutation of the %lld token ids", name, (long long)i,
                              (long long)id, (long long)V);
            break;
        }
        seen[id] = 1;
        a->token_ordering[i] = (int32_t)id;
    }
    free(seen);
}

static g4_status load_weights(g4_assistant *a) {
    g4_model *m = a->model;
    const g4_config *c = &m->config;
    const g4_text_config *tc = &c->text;
    const int64_t d = tc->hidden_size, dt = a->backbone_hidden;
    g4_weight_loader L;
    g4_status st = g4_loader_init(&L, m);
    if (st != G4_OK) return st;
    g4_loader_matrix(&L, "model.embed_tokens", 1, 0, tc->vocab_size, d, &m->text.embed);
    m->text.final_norm = g4_loader_vector(&L, "model.norm.weight", d);
    g4_loader_matrix(&L, "pre_projection", 1, 0, d, 2 * dt, &a->pre_projection);
    g4_loader_matrix(&L, "post_projection", 1, 0, dt, d, &a->post_projection);
    if (g4_loader_find(&L, "lm_head.weight") && !c->tie_embeddings)
        g4_loader_problem(&L, "untied lm_head.weight (tie_word_embeddings=false) is not supported");
    g4_loader_find(&L, "model.final_norm.weight"); /* a converter leftover no module owns (B6) */
    if (a->ordered) {
        g4_loader_matrix(&L, "masked_embedding.centroids", 1, 0, a->n_centroids, d, &a->centroids);
        load_token_ordering(&L, a);
    }
    m->text.layers = calloc((size_t)tc->n_layers, sizeof *m->text.layers);
    if (!m->text.layers) {
        g4_loader_free(&L);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < tc->n_layers; i++) load_layer(&L, i, &m->text.layers[i]);
    st = g4_loader_finish(&L, m->path);
    g4_matrix *mats[] = {&m->text.embed, &a->pre_projection, &a->post_projection, &a->centroids};
    for (size_t k = 0; st == G4_OK && k < sizeof mats / sizeof mats[0]; k++) st = g4_loader_prepare_matrix(&L, mats[k]);
    for (int i = 0; st == G4_OK && i < tc->n_layers; i++) {
        g4_text_layer *w = &m->text.layers[i];
        g4_matrix *lm[] = {&w->q, &w->o, &w->gate, &w->up, &w->down};
        for (size_t k = 0; st == G4_OK && k < sizeof lm / sizeof lm[0]; k++) st = g4_loader_prepare_matrix(&L, lm[k]);
    }
    g4_loader_free(&L);
    return st;
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* A drafter without weights yet: a->model has its path and backend. */
static g4_assistant *assistant_new(const char *path, g4_backend *be) {
    g4_assistant *a = calloc(1, sizeof *a);
    g4_model *m = calloc(1, sizeof *m);
    char *p = strdup(path);
    if (!a || !m || !p) {
        free(a);
        free(m);
        free(p);
        return NULL;
    }
    a->model = m;
    a->target_layer[0] = a->target_layer[1] = -1;
    m->backend = be;
    m->path = p;
    m->text_prefix = "model.";
    m->layout = G4_LAYOUT_HF;
    return a;
}

/* The drafter fields of a parsed config. */
static g4_status read_assistant_config(g4_assistant *a) {
    const g4_model *m = a->model;
    if (!m->config.assistant.present)
        return g4_fail(G4_ERR_FORMAT,
                       "%s: model_type '%s' is not a drafter (expected gemma4_assistant or gemma4_unified_assistant)",
                       m->path, m->config.model_type);
    const g4_assistant_config *ac = &m->config.assistant;
    a->backbone_hidden = ac->backbone_hidden_size;
    a->ordered = ac->ordered_embeddings;
    a->n_centroids = ac->n_centroids;
    a->centroid_top_k = ac->centroid_top_k;
    if (a->ordered) {
        a->tokens_per_centroid = m->config.text.vocab_size / ac->n_centroids;
        if (a->tokens_per_centroid * ac->n_centroids != m->config.text.vocab_size)
            return g4_fail(G4_ERR_FORMAT, "%s: vocab_size %d is not a multiple of num_centroids %d", m->path,
                           m->config.text.vocab_size, ac->n_centroids);
    }
    return G4_OK;
}

g4_status g4_assistant_load_dir(const char *dir, g4_backend *be, g4_assistant **out) {
    *out = NULL;
    g4_assistant *a = assistant_new(dir, be);
    if (!a) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_model *m = a->model;
    g4_status st = G4_OK;
    if (!g4_is_directory(dir)) st = g4_fail(G4_ERR_NOT_FOUND, "%s: not a model directory", dir);
    if (st == G4_OK) st = g4_config_load(dir, &m->config);
    if (st == G4_OK) st = read_assistant_config(a);
    if (st == G4_OK) st = g4_st_open(dir, &m->tensors);
    /* MLX conversions keep the Hugging Face names (mlx-vlm's drafter mirrors
     * transformers' modules) and store quantised modules as packed codes +
     * .scales (+ .biases), which the loader reads module by module */
    if (st == G4_OK && m->config.quant.present) m->layout = G4_LAYOUT_MLX;
    for (size_t t = 0; st == G4_OK && t < g4_st_count(m->tensors); t++)
        if (has_suffix(g4_st_at(m->tensors, t)->name, ".scales")) m->layout = G4_LAYOUT_MLX;
    if (st == G4_OK) st = load_weights(a);
    if (st == G4_OK)
        for (size_t t = 0; t < g4_st_count(m->tensors); t++) m->n_unused_tensors += !m->tensor_used[t];
    if (st != G4_OK) {
        g4_assistant_release(a);
        return st;
    }
    *out = a;
    return G4_OK;
}

g4_status g4_assistant_synthesize(const char *preset, g4_backend *be, g4_assistant **out) {
    *out = NULL;
    const char *target_json;
    size_t len;
    g4_status st = g4_model_preset_config(preset, "bf16", &target_json, &len);
    if (st != G4_OK) return st;
    char *json = g4_assistant_synth_config(target_json, len);
    char label[128];
    snprintf(label, sizeof label, "synthetic %s drafter", preset);
    g4_assistant *a = json ? assistant_new(label, be) : NULL;
    if (!a) {
        free(json);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    a->model->synthetic = 1;
    st = g4_config_parse(json, strlen(json), label, &a->model->config);
    free(json);
    if (st == G4_OK) st = read_assistant_config(a);
    if (st == G4_OK) st = load_weights(a);
    if (st != G4_OK) {
        g4_assistant_release(a);
        return st;
    }
    *out = a;
    return G4_OK;
}

void g4_assistant_release(g4_assistant *a) {
    if (!a) return;
    free(a->token_ordering);
    g4_model_release(a->model);
    free(a);
}

/* The target layer whose cache a drafter layer of `kind` reads: the last of
 * that kind before the target's first KV-shared layer (B4). */
static int donor_layer(const g4_model *target, g4_layer_kind kind) {
    const g4_text_config *tc = &target->config.text;
    int first_shared = tc->n_layers - tc->n_kv_shared;
    for (int i = first_shared - 1; i >= 0; i--)
        if (tc->layers[i].kind == kind) return i;
    return -1;
}

/* Mismatches found by g4_assistant_attach, one line each. */
typedef struct {
    char text[2048];
    size_t len;
} problem_list;

static void problem(problem_list *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(problem_list *p, const char *fmt, ...) {
    if (p->len + 4 >= sizeof p->text) return;
    memcpy(p->text + p->len, "\n  ", 4);
    p->len += 3;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->text + p->len, sizeof p->text - p->len, fmt, ap);
    va_end(ap);
    if (n > 0) p->len += (size_t)n < sizeof p->text - p->len ? (size_t)n : sizeof p->text - p->len - 1;
}

g4_status g4_assistant_attach(g4_assistant *a, const g4_model *target) {
    const g4_text_config *dc = &a->model->config.text, *tc = &target->config.text;
    problem_list pl = {.len = 0};
    problem_list *P = &pl;
    if (dc->vocab_size != tc->vocab_size)
        problem(P, "vocab_size %d, the target's %d", dc->vocab_size, tc->vocab_size);
    if (a->backbone_hidden != tc->hidden_size)
        problem(P, "backbone_hidden_size %d, the target's hidden_size %d", a->backbone_hidden, tc->hidden_size);
    int donors[2] = {donor_layer(target, G4_LAYER_SLIDING), donor_layer(target, G4_LAYER_FULL)};
    for (int i = 0; i < dc->n_layers; i++) {
        const g4_layer_config *lc = &dc->layers[i];
        const char *kind = lc->kind == G4_LAYER_SLIDING ? "sliding" : "full";
        int t = donors[lc->kind];
        if (t < 0) {
            problem(P, "layer %d (%s) has no %s layer of the target to read", i, kind, kind);
            continue;
        }
        const g4_layer_config *tl = &tc->layers[t];
        if (lc->head_dim != tl->head_dim)
            problem(P, "layer %d (%s): head_dim %d, the target's layer %d has %d", i, kind, lc->head_dim, t,
                    tl->head_dim);
        if (lc->n_kv_heads != tl->n_kv_heads)
            problem(P, "layer %d (%s): %d KV heads, the target's layer %d has %d", i, kind, lc->n_kv_heads, t,
                    tl->n_kv_heads);
        if (dc->n_heads % tl->n_kv_heads)
            problem(P, "layer %d (%s): %d query heads are not a multiple of the target's %d KV heads", i, kind,
                    dc->n_heads, tl->n_kv_heads);
        if (lc->rope_theta != tl->rope_theta || lc->rope_pairs != tl->rope_pairs)
            problem(P, "layer %d (%s): RoPE theta %g over %d pairs, the target's layer %d theta %g over %d pairs", i,
                    kind, lc->rope_theta, lc->rope_pairs, t, tl->rope_theta, tl->rope_pairs);
    }
    if (pl.len)
        return g4_fail(G4_ERR_FORMAT, "drafter %s does not fit the target %s:%s", a->model->path, target->path,
                       pl.text);
    a->target_layer[G4_LAYER_SLIDING] = donors[G4_LAYER_SLIDING];
    a->target_layer[G4_LAYER_FULL] = donors[G4_LAYER_FULL];
    return G4_OK;
}

char *g4_assistant_describe(const g4_assistant *a) {
    const g4_model *m = a->model;
    const g4_text_config *tc = &m->config.text;
    char plan[256] = "";
    size_t k = 0;
    for (int i = 0; i < tc->n_layers && k + 4 < sizeof plan; i++)
        k += (size_t)snprintf(plan + k, sizeof plan - k, "%s%c", i ? " " : "",
                              tc->layers[i].kind == G4_LAYER_SLIDING ? 'S' : 'F');
    int head_s = 0, head_f = 0;
    for (int i = 0; i < tc->n_layers; i++) {
        if (tc->layers[i].kind == G4_LAYER_SLIDING && !head_s) head_s = tc->layers[i].head_dim;
        if (tc->layers[i].kind == G4_LAYER_FULL && !head_f) head_f = tc->layers[i].head_dim;
    }
    char head[160];
    if (a->ordered)
        snprintf(head, sizeof head, "centroid head: %d centroids of %d tokens, top %d (%d candidate logits)",
                 a->n_centroids, a->tokens_per_centroid, a->centroid_top_k, a->centroid_top_k * a->tokens_per_centroid);
    else
        snprintf(head, sizeof head, "dense tied head over %d tokens", tc->vocab_size);
    char weights[160] = "";
    const g4_quant_params *q = &m->config.quant.defaults;
    if (m->layout == G4_LAYOUT_MLX && m->config.quant.present)
        snprintf(weights, sizeof weights, "  weights: MLX layout, %s %d-bit, group %d\n",
                 q->mode == G4_QUANT_MXFP4 ? "mxfp4" : "affine", q->bits, q->group_size);
    else if (m->layout == G4_LAYOUT_MLX)
        snprintf(weights, sizeof weights, "  weights: MLX layout, quantised modules\n");
    size_t cap = 1024;
    char *s = malloc(cap);
    if (!s) return NULL;
    snprintf(s, cap,
             "%s: %s (MTP drafter for speculative decoding)\n"
             "  layers: %d [%s], width %d, %d query heads, head %d (sliding) / %d (full), MLP %d, window %d\n"
             "  reads the target's K/V (no cache of its own); target width %d, vocabulary %d\n"
             "  %s\n"
             "%s"
             "  parameters: %.2f M%s\n",
             m->path, m->config.model_type, tc->n_layers, plan, tc->hidden_size, tc->n_heads,
             head_s, head_f, tc->intermediate_size, tc->sliding_window,
             a->backbone_hidden, tc->vocab_size, head, weights, (double)m->n_params / 1e6,
             m->n_unused_tensors ? " (some stored tensors unused)" : "");
    return s;
}

g4_status g4_assistant_find(const char *model_dir, char **out) {
    *out = NULL;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", model_dir);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
    char sibling[4200];
    snprintf(sibling, sizeof sibling, "%s-assistant", dir);
    if (g4_is_directory(sibling)) {
        *out = strdup(sibling);
        return *out ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    const char *repo = strstr(dir, "models--");
    const char *snap = repo ? strstr(repo, "/snapshots/") : NULL;
    if (snap) {
        char id[512] = "";
        size_t k = 0;
        int org_done = 0;
        for (const char *c = repo + strlen("models--"); c < snap && k + 1 < sizeof id; c++) {
            if (!org_done && c[0] == '-' && c[1] == '-') { /* the first "--" parts ORG from NAME */
                id[k++] = '/';
                org_done = 1;
                c++;
            } else {
                id[k++] = *c;
            }
        }
        id[k] = 0;
        char hub_id[600];
        snprintf(hub_id, sizeof hub_id, "%s-assistant", id);
        if (g4_resolve_model_path(hub_id, out) == G4_OK && g4_is_directory(*out)) return G4_OK;
        free(*out);
        *out = NULL;
        return g4_fail(G4_ERR_NOT_FOUND, "no drafter beside %s (looked for %s and the pulled %s)",
                       model_dir, sibling, hub_id);
    }
    return g4_fail(G4_ERR_NOT_FOUND, "no drafter beside %s (looked for %s)", model_dir, sibling);
}
