/* libFuzzer target: g4_config_parse on arbitrary text (not NUL-terminated).
 * A config that parses must give a layer plan the model code can trust:
 * positive even head sizes, KV heads dividing the query heads, KV donors that
 * are earlier layers of the same kind and geometry, sane RoPE and MLP sizes. */
#include <stddef.h>
#include <stdint.h>

#include "guarded_input.h"
#include "io/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_plan(const g4_config *c) {
    const g4_text_config *t = &c->text;
    if (t->n_layers <= 0 || !t->layers || t->n_heads <= 0 || t->hidden_size <= 0 || t->vocab_size <= 0)
        __builtin_trap();
    if (t->moe && (t->n_experts <= 0 || t->top_k_experts <= 0 || t->top_k_experts > t->n_experts))
        __builtin_trap();
    for (int i = 0; i < t->n_layers; i++) {
        const g4_layer_config *l = &t->layers[i];
        if (l->head_dim <= 0 || l->head_dim % 2 || l->n_kv_heads <= 0 || t->n_heads % l->n_kv_heads)
            __builtin_trap();
        if (l->rope_pairs < 0 || l->rope_pairs > l->head_dim / 2 || !(l->rope_theta > 0)) __builtin_trap();
        if (l->mlp_width <= 0) __builtin_trap();
        if (l->kv_donor >= 0) {
            const g4_layer_config *d = &t->layers[l->kv_donor];
            if (l->kv_donor >= i || d->kind != l->kind || d->head_dim != l->head_dim ||
                d->n_kv_heads != l->n_kv_heads || d->kv_donor != -1)
                __builtin_trap();
        }
    }
    if (c->tokens.n_eos < 0 || c->tokens.n_eos > G4_MAX_EOS_IDS) __builtin_trap();
    for (int i = 0; i < c->quant.n_overrides; i++)
        if (!c->quant.overrides[i].module) __builtin_trap();
    g4_quant_params q = g4_config_quant_for(c, "language_model.model.layers.0.mlp.down_proj");
    if (q.mode != G4_QUANT_NONE && (q.bits <= 0 || q.group_size <= 0)) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_config c;
    data = guarded_copy(data, size);
    if (g4_config_parse((const char *)data, size, "fuzz", &c) == G4_OK) {
        check_plan(&c);
        g4_config_free(&c);
    } else if (c.text.layers || c.quant.overrides) {
        __builtin_trap(); /* a failed parse must leave nothing allocated */
    }
    return 0;
}
