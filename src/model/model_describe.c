/* A readable summary of a loaded model for `gemma4 info`. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct {
    char *buf;
    size_t len, cap;
} text_buf;

static void append(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(text_buf *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 1024;
        while (cap < t->len + (size_t)n + 1) cap *= 2;
        char *grown = realloc(t->buf, cap);
        if (!grown) return;
        t->buf = grown;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static void human_bytes(uint64_t b, char *out, size_t n) {
    if (b >= (1ull << 30))
        snprintf(out, n, "%.2f GiB", (double)b / (1u << 30));
    else if (b >= (1u << 20))
        snprintf(out, n, "%.2f MiB", (double)b / (1u << 20));
    else
        snprintf(out, n, "%.1f KiB", (double)b / 1024);
}

static const char *format_of(const g4_matrix *m) {
    if (!m->data) return "-";
    if (m->format == G4_WEIGHT_AFFINE) {
        static _Thread_local char buf[32];
        snprintf(buf, sizeof buf, "q%d/g%d", m->bits, m->group_size);
        return buf;
    }
    return g4_weight_format_name(m->format);
}

char *g4_model_describe(const g4_model *m) {
    const g4_config *c = &m->config;
    const g4_text_config *tc = &c->text;
    text_buf t = {0};
    append(&t, "model        %s\n", m->path);
    append(&t, "type         %s (%s layout, text tensors under \"%s\")\n", c->model_type,
           m->layout == G4_LAYOUT_MLX ? "MLX" : "Hugging Face", m->text_prefix);
    append(&t, "text         %d layers, width %d, %d heads, vocab %d, window %d, softcap %g\n", tc->n_layers,
           tc->hidden_size, tc->n_heads, tc->vocab_size, tc->sliding_window, tc->final_softcap);
    if (tc->ple_dim) append(&t, "per-layer    embeddings %d per layer (vocab %d)\n", tc->ple_dim, tc->ple_vocab);
    if (tc->n_kv_shared) append(&t, "kv sharing   last %d layers reuse earlier layers' caches\n", tc->n_kv_shared);
    if (tc->moe)
        append(&t, "experts      %d experts, top %d, width %d, beside a dense MLP\n", tc->n_experts, tc->top_k_experts,
               tc->moe_width);
    append(&t, "bidirectional vision attention: %s\n", tc->bidirectional_vision ? "yes (image tokens, sliding layers)" : "no");
    append(&t, "layer plan   (S = sliding, F = full; head dim x KV heads; MLP width; q/mlp format)\n");
    /* print runs of identical layers compactly */
    for (int i = 0; i < tc->n_layers;) {
        const g4_layer_config *a = &tc->layers[i];
        const g4_text_layer *wa = &m->text.layers[i];
        int j = i + 1;
        while (j < tc->n_layers) {
            const g4_layer_config *b = &tc->layers[j];
            if (b->kind != a->kind || b->head_dim != a->head_dim || b->n_kv_heads != a->n_kv_heads ||
                (b->kv_donor >= 0) != (a->kv_donor >= 0) || b->mlp_width != a->mlp_width || b->k_eq_v != a->k_eq_v)
                break;
            j++;
        }
        char range[32];
        snprintf(range, sizeof range, j - i > 1 ? "%d-%d" : "%d", i, j - 1);
        char fmt_q[32];
        snprintf(fmt_q, sizeof fmt_q, "%s", format_of(&wa->q));
        append(&t, "  %-8s %c  %3d x %-2d  mlp %-6d %s%s%s  rope theta %g on %d pairs  [%s/%s]\n", range,
               a->kind == G4_LAYER_SLIDING ? 'S' : 'F', a->head_dim, a->n_kv_heads, a->mlp_width,
               a->k_eq_v ? "K=V " : "", a->kv_donor >= 0 ? "shares KV" : "", a->kind == G4_LAYER_SLIDING ? "" : "",
               a->rope_theta, a->rope_pairs, fmt_q, format_of(&wa->gate));
        i = j;
    }
    if (c->vision.present)
        append(&t, "vision       %d layers, width %d, %d heads of %d, patch %d, pooling %d%s%s\n", c->vision.n_layers,
               c->vision.hidden_size, c->vision.n_heads, c->vision.head_dim, c->vision.patch_size,
               c->vision.pooling_kernel, c->vision.clipped_linears ? ", clipped linears" : "",
               c->vision.standardize ? ", standardize" : "");
    if (c->audio.present)
        append(&t, "audio        %d conformer layers, width %d, %d heads, output %d\n", c->audio.n_layers,
               c->audio.hidden_size, c->audio.n_heads, c->audio.output_proj_dims);
    if (c->unified)
        append(&t, "encoder-free vision %s (48-px patches, width %d), audio %s (%d-sample frames)\n",
               c->unified_mm.vision_present ? "yes" : "no", c->unified_mm.mm_embed_dim,
               c->unified_mm.audio_present ? "yes" : "no", c->unified_mm.audio_frame_samples);
    if (c->quant.present)
        append(&t, "quantization %s %d-bit, group %d, %d per-module overrides\n",
               c->quant.defaults.mode == G4_QUANT_MXFP4 ? "mxfp4" : "affine", c->quant.defaults.bits,
               c->quant.defaults.group_size, c->quant.n_overrides);
    append(&t, "parameters   %.3f B (text decoder)\n", (double)m->n_params / 1e9);
    uint64_t total = 0;
    for (int f = 0; f < 5; f++) total += m->weight_bytes_by_format[f];
    char hb[32];
    human_bytes(total, hb, sizeof hb);
    append(&t, "weights      %s in matrices:", hb);
    for (int f = 0; f < 5; f++) {
        if (!m->weight_bytes_by_format[f]) continue;
        human_bytes(m->weight_bytes_by_format[f], hb, sizeof hb);
        append(&t, " %s %s;", g4_weight_format_name((g4_weight_format)f), hb);
    }
    append(&t, "\n");
    human_bytes(g4_st_total_bytes(m->tensors), hb, sizeof hb);
    append(&t, "checkpoint   %d file%s, %zu tensors, %s\n", g4_st_file_count(m->tensors),
           g4_st_file_count(m->tensors) == 1 ? "" : "s", g4_st_count(m->tensors), hb);
    if (m->n_unused_tensors)
        append(&t, "not used     %zu tensors (towers not loaded by this command, or ignored extras)\n",
               m->n_unused_tensors);
    append(&t, "problems     none\n");
    return t.buf;
}
