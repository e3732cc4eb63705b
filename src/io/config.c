#include "io/config.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

/* ---- small JSON accessors ------------------------------------------------- */
/* Absent or null keys give the default. A present value of the wrong type or
 * out of range (a string, 35.5 or 1e10 where an int belongs) is an error, not
 * a silent default: the reader keeps the first such failure and each parse
 * step returns it before validating further (a later g4_fail would replace
 * the message). */

typedef struct {
    const char *label;   /* the file, for messages */
    const char *section; /* "text_config", "vision_config", ... */
    g4_status status;    /* first bad field, G4_OK if none */
} json_reader;

static void bad_field(json_reader *r, const char *key, const char *want) {
    if (r->status == G4_OK)
        r->status = g4_fail(G4_ERR_FORMAT, "%s: %s.%s must be %s", r->label, r->section, key, want);
}

static const cJSON *field(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static int json_is_int(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    return d >= -2147483648.0 && d <= 2147483647.0 && floor(d) == d;
}

static int get_int(json_reader *r, const cJSON *obj, const char *key, int def) {
    const cJSON *v = field(obj, key);
    if (!v) return def;
    if (!json_is_int(v)) {
        bad_field(r, key, "an integer");
        return def;
    }
    return (int)v->valuedouble;
}

static float get_float(json_reader *r, const cJSON *obj, const char *key, float def) {
    const cJSON *v = field(obj, key);
    if (!v) return def;
    if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= FLT_MAX)) {
        bad_field(r, key, "a finite number");
        return def;
    }
    return (float)v->valuedouble;
}

static int get_bool(json_reader *r, const cJSON *obj, const char *key, int def) {
    const cJSON *v = field(obj, key);
    if (!v) return def;
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)) return v->valuedouble != 0;
    bad_field(r, key, "true or false");
    return def;
}

static const char *get_string(json_reader *r, const cJSON *obj, const char *key) {
    const cJSON *v = field(obj, key);
    if (!v) return NULL;
    if (!cJSON_IsString(v)) {
        bad_field(r, key, "a string");
        return NULL;
    }
    return v->valuestring;
}

/* eos_token_id may be a number or an array of numbers. */
static void get_id_list(json_reader *r, const cJSON *obj, const char *key, int *ids, int *n) {
    const cJSON *v = field(obj, key);
    if (!v) return;
    if (json_is_int(v)) {
        ids[0] = (int)v->valuedouble;
        *n = 1;
        return;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > G4_MAX_EOS_IDS) {
        bad_field(r, key, "a token id or a list of at most 8 token ids");
        return;
    }
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!json_is_int(e)) {
            bad_field(r, key, "a list of integer token ids");
            return;
        }
        ids[k++] = (int)e->valuedouble;
    }
    *n = k;
}

/* ---- text config ---------------------------------------------------------- */

static g4_status parse_rope(json_reader *r, const cJSON *text, const char *kind, float *theta, float *partial,
                            int *proportional) {
    const cJSON *rp = field(text, "rope_parameters");
    const cJSON *rk = field(rp, kind);
    int full = !strcmp(kind, "full_attention");
    *theta = full ? 1e6f : 1e4f;
    *partial = full ? 0.25f : 1.0f;
    *proportional = full;
    if (!rk) return G4_OK;
    r->section = kind;
    *theta = get_float(r, rk, "rope_theta", *theta);
    const char *type = get_string(r, rk, "rope_type");
    float factor = get_float(r, rk, "factor", 1.0f);
    if (type && (!strcmp(type, "default") || !strcmp(type, "proportional"))) {
        *proportional = !strcmp(type, "proportional");
        *partial = get_float(r, rk, "partial_rotary_factor", 1.0f);
    }
    if (r->status != G4_OK) return r->status;
    if (type && strcmp(type, "default") && strcmp(type, "proportional"))
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: rope_type '%s' for %s layers is not supported", r->label, type,
                       kind);
    if (factor != 1.0f)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: RoPE scaling factor != 1 is not supported", r->label);
    /* Also keeps (int)(partial * head_dim / 2) below in range. */
    if (!(*theta > 0) || !(*partial > 0 && *partial <= 1))
        return g4_fail(G4_ERR_FORMAT, "%s: %s RoPE needs rope_theta > 0 and 0 < partial_rotary_factor <= 1",
                       r->label, kind);
    return G4_OK;
}

/* per_layer_config: {"<layer index>": {"head_dim": .., "num_key_value_heads": ..}} */
static g4_status check_per_layer_config(const cJSON *plc, int n_layers, const char *label) {
    if (!cJSON_IsObject(plc)) return g4_fail(G4_ERR_FORMAT, "%s: per_layer_config is not an object", label);
    const cJSON *e;
    cJSON_ArrayForEach(e, plc) {
        /* Keys are looked up as "%d", so only that spelling counts ("+2", "02" would be ignored). */
        char *end, canonical[16];
        long i = strtol(e->string, &end, 10);
        snprintf(canonical, sizeof canonical, "%ld", i);
        if (!e->string[0] || *end || i < 0 || i >= n_layers || strcmp(canonical, e->string))
            return g4_fail(G4_ERR_FORMAT, "%s: per_layer_config key '%s' is not a layer index below %d", label,
                           e->string, n_layers);
        if (!cJSON_IsObject(e))
            return g4_fail(G4_ERR_FORMAT, "%s: per_layer_config[%s] is not an object", label, e->string);
    }
    return G4_OK;
}

/* assistant: the text stack of an MTP drafter (all layers KV-shared with the target). */
static g4_status parse_text(json_reader *r, const cJSON *t, int assistant, g4_text_config *tc) {
    const char *label = r->label;
    r->section = "text_config";
    tc->vocab_size = get_int(r, t, "vocab_size", 262144);
    tc->hidden_size = get_int(r, t, "hidden_size", 2304);
    tc->intermediate_size = get_int(r, t, "intermediate_size", 9216);
    tc->n_layers = get_int(r, t, "num_hidden_layers", 30);
    tc->n_heads = get_int(r, t, "num_attention_heads", 8);
    tc->n_kv_heads = get_int(r, t, "num_key_value_heads", 4);
    tc->head_dim = get_int(r, t, "head_dim", 256);
    tc->rms_eps = get_float(r, t, "rms_norm_eps", 1e-6f);
    tc->sliding_window = get_int(r, t, "sliding_window", 512);
    tc->final_softcap = get_float(r, t, "final_logit_softcapping", 0.0f);
    tc->ple_dim = get_int(r, t, "hidden_size_per_layer_input", 0);
    tc->ple_vocab = get_int(r, t, "vocab_size_per_layer_input", tc->vocab_size);
    tc->n_kv_shared = get_int(r, t, "num_kv_shared_layers", 0);
    tc->moe = get_bool(r, t, "enable_moe_block", 0);
    tc->n_experts = get_int(r, t, "num_experts", 0);
    tc->top_k_experts = get_int(r, t, "top_k_experts", get_int(r, t, "num_experts_per_tok", 0));
    tc->moe_width = get_int(r, t, "moe_intermediate_size", get_int(r, t, "expert_intermediate_size", 0));
    tc->max_position = get_int(r, t, "max_position_embeddings", 131072);
    const char *bidir = get_string(r, t, "use_bidirectional_attention");
    tc->bidirectional_vision = bidir && !strcmp(bidir, "vision");
    tc->bidirectional_all = bidir && !strcmp(bidir, "all");
    int k_eq_v = get_bool(r, t, "attention_k_eq_v", 0);
    int global_head_dim = get_int(r, t, "global_head_dim", 0);
    int global_kv = get_int(r, t, "num_global_key_value_heads", 0);
    int double_wide = get_bool(r, t, "use_double_wide_mlp", 0);
    if (r->status != G4_OK) return r->status;
    if (tc->bidirectional_all)
        return g4_fail(G4_ERR_UNSUPPORTED,
                       "%s: use_bidirectional_attention=\"all\" (encoder-style) is not supported", label);

    const int L = tc->n_layers;
    if (L <= 0 || L > 4096 || tc->hidden_size <= 0 || tc->vocab_size <= 0 || tc->n_heads <= 0 ||
        tc->n_kv_heads <= 0 || tc->head_dim <= 0 || tc->intermediate_size <= 0)
        return g4_fail(G4_ERR_FORMAT,
                       "%s: text config needs positive num_hidden_layers, hidden_size, vocab_size, "
                       "num_attention_heads, num_key_value_heads, head_dim, intermediate_size",
                       label);
    /* Upper bounds keep derived sizes (double-wide MLP, head_dim x heads) in int range. */
    if (tc->hidden_size > 65536 || tc->head_dim > 4096 || tc->n_heads > 1024 || tc->vocab_size > (1 << 24) ||
        tc->intermediate_size > (1 << 20))
        return g4_fail(G4_ERR_FORMAT, "%s: text config sizes are implausibly large", label);
    if (assistant) {
        /* transformers' Gemma4AssistantConfig: 0 means all, and the
         * architecture checks of validate_architecture */
        if (tc->n_kv_shared == 0) tc->n_kv_shared = L;
        if (tc->n_kv_shared != L)
            return g4_fail(G4_ERR_FORMAT, "%s: an assistant's num_kv_shared_layers=%d must equal num_hidden_layers=%d",
                           label, tc->n_kv_shared, L);
        if (tc->ple_dim != 0 || tc->moe || double_wide)
            return g4_fail(G4_ERR_FORMAT,
                           "%s: an assistant has no per-layer inputs, MoE block or double-wide MLP "
                           "(hidden_size_per_layer_input=%d, enable_moe_block=%d, use_double_wide_mlp=%d)",
                           label, tc->ple_dim, tc->moe, double_wide);
    } else if (tc->n_kv_shared < 0 || tc->n_kv_shared >= L) {
        return g4_fail(G4_ERR_FORMAT, "%s: num_kv_shared_layers=%d must be in [0, %d)", label,
                       tc->n_kv_shared, L);
    }
    if (tc->sliding_window <= 0)
        return g4_fail(G4_ERR_FORMAT, "%s: sliding_window must be positive", label);
    if (tc->max_position <= 0)
        return g4_fail(G4_ERR_FORMAT, "%s: max_position_embeddings must be positive", label);
    if (!(tc->rms_eps > 0) || tc->final_softcap < 0)
        return g4_fail(G4_ERR_FORMAT, "%s: rms_norm_eps must be positive and final_logit_softcapping >= 0", label);
    if (tc->ple_dim < 0 || tc->ple_dim > 65536 || (tc->ple_dim > 0 && (tc->ple_vocab <= 0 || tc->ple_vocab > (1 << 24))))
        return g4_fail(G4_ERR_FORMAT,
                       "%s: hidden_size_per_layer_input must be in [0, 65536] and, when used, "
                       "vocab_size_per_layer_input positive",
                       label);
    if (tc->moe && (tc->n_experts <= 0 || tc->n_experts > 4096 || tc->top_k_experts <= 0 ||
                    tc->top_k_experts > tc->n_experts || tc->moe_width <= 0 || tc->moe_width > (1 << 20)))
        return g4_fail(G4_ERR_FORMAT,
                       "%s: enable_moe_block needs num_experts > 0, 0 < top_k_experts <= num_experts and "
                       "moe_intermediate_size > 0",
                       label);

    tc->layers = calloc((size_t)L, sizeof *tc->layers);
    if (!tc->layers) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");

    /* Layer kinds: explicit layer_types, else every 6th layer is full and the
     * last is always full (transformers' __post_init__). */
    const cJSON *types = field(t, "layer_types");
    if (types) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != L)
            return g4_fail(G4_ERR_FORMAT, "%s: layer_types must list %d entries", label, L);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, types) {
            if (!cJSON_IsString(e))
                return g4_fail(G4_ERR_FORMAT, "%s: layer_types[%d] is not a string", label, i);
            if (!strcmp(e->valuestring, "sliding_attention"))
                tc->layers[i].kind = G4_LAYER_SLIDING;
            else if (!strcmp(e->valuestring, "full_attention"))
                tc->layers[i].kind = G4_LAYER_FULL;
            else
                return g4_fail(G4_ERR_UNSUPPORTED, "%s: layer_types[%d] = '%s' is not supported", label, i,
                               e->valuestring);
            i++;
        }
    } else {
        for (int i = 0; i < L; i++) tc->layers[i].kind = ((i + 1) % 6) ? G4_LAYER_SLIDING : G4_LAYER_FULL;
        tc->layers[L - 1].kind = G4_LAYER_FULL;
    }

    float theta_s, theta_f, partial_s, partial_f;
    int prop_s, prop_f;
    g4_status st = parse_rope(r, t, "sliding_attention", &theta_s, &partial_s, &prop_s);
    if (st == G4_OK) st = parse_rope(r, t, "full_attention", &theta_f, &partial_f, &prop_f);
    if (st != G4_OK) return st;

    const cJSON *plc = field(t, "per_layer_config");
    if (plc && (st = check_per_layer_config(plc, L, label)) != G4_OK) return st;
    r->section = "per_layer_config";
    const int first_shared = L - tc->n_kv_shared;
    for (int i = 0; i < L; i++) {
        g4_layer_config *lc = &tc->layers[i];
        int full = lc->kind == G4_LAYER_FULL;
        lc->head_dim = tc->head_dim;
        lc->n_kv_heads = tc->n_kv_heads;
        lc->k_eq_v = k_eq_v && full;
        if (plc) {
            char key[16];
            snprintf(key, sizeof key, "%d", i);
            const cJSON *entry = field(plc, key);
            if (entry) {
                lc->head_dim = get_int(r, entry, "head_dim", lc->head_dim);
                lc->n_kv_heads = get_int(r, entry, "num_key_value_heads", lc->n_kv_heads);
                if (r->status != G4_OK) return r->status;
            }
        } else if (full) {
            if (global_head_dim > 0) lc->head_dim = global_head_dim;
            if (lc->k_eq_v && global_kv > 0) lc->n_kv_heads = global_kv;
        }
        if (lc->head_dim <= 0 || lc->head_dim > 4096 || lc->head_dim % 2 || lc->n_kv_heads <= 0 ||
            tc->n_heads % lc->n_kv_heads)
            return g4_fail(G4_ERR_FORMAT,
                           "%s: layer %d: head_dim %d must be even and positive and num_attention_heads %d a "
                           "multiple of its %d KV heads",
                           label, i, lc->head_dim, tc->n_heads, lc->n_kv_heads);
        float partial = full ? partial_f : partial_s;
        lc->rope_theta = full ? theta_f : theta_s;
        lc->rope_proportional = full ? prop_f : prop_s;
        /* Proportional RoPE: int(partial * head_dim / 2) frequencies, exponent
         * over the full head_dim; default RoPE with a partial factor rotates
         * only the first partial*head_dim channels (none of the released
         * models do this; refused below). */
        lc->rope_pairs = (int)(partial * (float)lc->head_dim / 2.0f);
        if (!lc->rope_proportional && lc->rope_pairs != lc->head_dim / 2)
            return g4_fail(G4_ERR_UNSUPPORTED, "%s: partial rotary factor on default RoPE is not supported",
                           label);
        lc->kv_donor = -1;
        if (!assistant && tc->n_kv_shared > 0 && i >= first_shared) {
            for (int j = first_shared - 1; j >= 0; j--)
                if (tc->layers[j].kind == lc->kind) {
                    lc->kv_donor = j;
                    break;
                }
            if (lc->kv_donor < 0)
                return g4_fail(G4_ERR_FORMAT, "%s: KV-shared layer %d has no earlier %s layer to share with",
                               label, i, full ? "full" : "sliding");
        }
        lc->mlp_width = tc->intermediate_size * ((double_wide && lc->kv_donor >= 0) ? 2 : 1);
    }
    for (int i = 0; i < L; i++) {
        const g4_layer_config *lc = &tc->layers[i];
        if (lc->kv_donor >= 0) {
            const g4_layer_config *d = &tc->layers[lc->kv_donor];
            if (d->head_dim != lc->head_dim || d->n_kv_heads != lc->n_kv_heads)
                return g4_fail(G4_ERR_FORMAT, "%s: layer %d shares KV with layer %d but their geometry differs",
                               label, i, lc->kv_donor);
        }
    }
    return G4_OK;
}

/* ---- vision / audio ------------------------------------------------------- */

static int all_positive(const int *v, int n) {
    for (int i = 0; i < n; i++)
        if (v[i] <= 0 || v[i] > (1 << 20)) return 0;
    return 1;
}

static g4_status parse_vision(json_reader *r, const cJSON *v, g4_vision_config *vc) {
    vc->present = v != NULL;
    if (!v) return G4_OK;
    if (!cJSON_IsObject(v)) return g4_fail(G4_ERR_FORMAT, "%s: vision_config is not an object", r->label);
    r->section = "vision_config";
    vc->hidden_size = get_int(r, v, "hidden_size", 768);
    vc->intermediate_size = get_int(r, v, "intermediate_size", 3072);
    vc->n_layers = get_int(r, v, "num_hidden_layers", 16);
    vc->n_heads = get_int(r, v, "num_attention_heads", 12);
    vc->n_kv_heads = get_int(r, v, "num_key_value_heads", vc->n_heads);
    vc->head_dim = get_int(r, v, "head_dim", 64);
    vc->patch_size = get_int(r, v, "patch_size", 16);
    vc->pooling_kernel = get_int(r, v, "pooling_kernel_size", 3);
    vc->position_embedding_size = get_int(r, v, "position_embedding_size", 10240);
    vc->default_output_length = get_int(r, v, "default_output_length", 280);
    vc->rms_eps = get_float(r, v, "rms_norm_eps", 1e-6f);
    vc->standardize = get_bool(r, v, "standardize", 0);
    vc->clipped_linears = get_bool(r, v, "use_clipped_linears", 0);
    const cJSON *rp = field(v, "rope_parameters");
    vc->rope_theta = get_float(r, rp, "rope_theta", 100.0f);
    if (r->status != G4_OK) return r->status;
    const int sizes[] = {vc->hidden_size, vc->intermediate_size, vc->n_layers, vc->n_heads, vc->n_kv_heads,
                         vc->head_dim, vc->patch_size, vc->pooling_kernel, vc->position_embedding_size,
                         vc->default_output_length};
    if (!all_positive(sizes, (int)(sizeof sizes / sizeof sizes[0])) || !(vc->rms_eps > 0) ||
        vc->n_heads % vc->n_kv_heads)
        return g4_fail(G4_ERR_FORMAT,
                       "%s: vision_config sizes must be positive (and num_attention_heads a multiple of "
                       "num_key_value_heads)",
                       r->label);
    return G4_OK;
}

static g4_status parse_audio(json_reader *r, const cJSON *a, g4_audio_config *ac) {
    ac->present = a != NULL;
    if (!a) return G4_OK;
    if (!cJSON_IsObject(a)) return g4_fail(G4_ERR_FORMAT, "%s: audio_config is not an object", r->label);
    r->section = "audio_config";
    ac->hidden_size = get_int(r, a, "hidden_size", 1024);
    ac->n_layers = get_int(r, a, "num_hidden_layers", 12);
    ac->n_heads = get_int(r, a, "num_attention_heads", 8);
    ac->conv_channels[0] = 128;
    ac->conv_channels[1] = 32;
    const cJSON *ch = field(a, "subsampling_conv_channels");
    if (ch) {
        if (!cJSON_IsArray(ch) || cJSON_GetArraySize(ch) != 2 || !json_is_int(cJSON_GetArrayItem(ch, 0)) ||
            !json_is_int(cJSON_GetArrayItem(ch, 1)))
            bad_field(r, "subsampling_conv_channels", "a list of two integers");
        else
            for (int i = 0; i < 2; i++) ac->conv_channels[i] = (int)cJSON_GetArrayItem(ch, i)->valuedouble;
    }
    ac->conv_kernel = get_int(r, a, "conv_kernel_size", 5);
    ac->chunk_size = get_int(r, a, "attention_chunk_size", 12);
    ac->context_left = get_int(r, a, "attention_context_left", 13);
    ac->context_right = get_int(r, a, "attention_context_right", 0);
    ac->logit_cap = get_float(r, a, "attention_logit_cap", 50.0f);
    ac->invalid_logit = get_float(r, a, "attention_invalid_logits_value", -1e9f);
    ac->rms_eps = get_float(r, a, "rms_norm_eps", 1e-6f);
    ac->residual_weight = get_float(r, a, "residual_weight", 0.5f);
    ac->gradient_clipping = get_float(r, a, "gradient_clipping", 1e10f);
    ac->output_proj_dims = get_int(r, a, "output_proj_dims", 1536);
    ac->clipped_linears = get_bool(r, a, "use_clipped_linears", 1);
    if (r->status != G4_OK) return r->status;
    const int sizes[] = {ac->hidden_size,  ac->n_layers,   ac->n_heads,         ac->conv_channels[0],
                         ac->conv_channels[1], ac->conv_kernel, ac->chunk_size, ac->output_proj_dims};
    if (!all_positive(sizes, (int)(sizeof sizes / sizeof sizes[0])) || ac->context_left < 0 ||
        ac->context_right < 0 || !(ac->rms_eps > 0) || ac->hidden_size % ac->n_heads)
        return g4_fail(G4_ERR_FORMAT,
                       "%s: audio_config sizes must be positive (and hidden_size a multiple of "
                       "num_attention_heads)",
                       r->label);
    return G4_OK;
}

static g4_status parse_unified(json_reader *r, const cJSON *v, const cJSON *a, g4_unified_config *uc) {
    uc->vision_present = v != NULL;
    uc->audio_present = a != NULL;
    if ((v && !cJSON_IsObject(v)) || (a && !cJSON_IsObject(a)))
        return g4_fail(G4_ERR_FORMAT, "%s: vision_config and audio_config must be objects", r->label);
    r->section = "vision_config";
    int patch = get_int(r, v, "patch_size", 16), pool = get_int(r, v, "pooling_kernel_size", 3);
    uc->mm_embed_dim = get_int(r, v, "mm_embed_dim", 3840);
    uc->position_table_size = get_int(r, v, "mm_posemb_size", 1120);
    uc->layer_norm_eps = 1e-5f;
    r->section = "audio_config";
    uc->audio_frame_samples = get_int(r, a, "audio_embed_dim", 640);
    if (r->status != G4_OK) return r->status;
    const int sizes[] = {patch, pool, uc->mm_embed_dim, uc->position_table_size, uc->audio_frame_samples};
    if (!all_positive(sizes, (int)(sizeof sizes / sizeof sizes[0])) || patch > 4096 || pool > 4096)
        return g4_fail(G4_ERR_FORMAT, "%s: unified vision/audio sizes must be positive", r->label);
    uc->patch_size = patch * pool;
    return G4_OK;
}

/* ---- quantisation --------------------------------------------------------- */

/* One quantization entry, read as MLX reads it: the top-level block and each
 * per-module entry are separate keyword sets for to_quantized(), so a key an
 * entry leaves out takes MLX's default for that entry's own mode (mode
 * "affine"; affine 4 bits group 64, mxfp4 4 bits group 32), never the
 * top-level value. mlx-vlm writes mxfp4 checkpoints whose router entries are
 * {"group_size": 64, "bits": 8}: affine 8-bit. */
static g4_status parse_quant_params(json_reader *r, const cJSON *q, g4_quant_params *out, const char *where) {
    *out = (g4_quant_params){G4_QUANT_AFFINE, 4, 64};
    const char *label = r->label;
    r->section = "quantization";
    const char *mode = get_string(r, q, "mode");
    if (r->status != G4_OK) return r->status;
    if (mode) {
        if (!strcmp(mode, "affine"))
            out->mode = G4_QUANT_AFFINE;
        else if (!strcmp(mode, "mxfp4"))
            *out = (g4_quant_params){G4_QUANT_MXFP4, 4, 32};
        else
            return g4_fail(G4_ERR_UNSUPPORTED, "%s: quantization mode '%s' (%s) is not supported", label, mode,
                           where);
    }
    out->bits = get_int(r, q, "bits", out->bits);
    out->group_size = get_int(r, q, "group_size", out->group_size);
    if (r->status != G4_OK) return r->status;
    if (out->mode == G4_QUANT_AFFINE && (out->bits < 2 || out->bits > 8))
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: affine quantization with %d bits (%s) is not supported", label,
                       out->bits, where);
    if (out->mode == G4_QUANT_MXFP4 && (out->bits != 4 || out->group_size != 32))
        return g4_fail(G4_ERR_UNSUPPORTED,
                       "%s: mxfp4 with %d bits and group_size %d (%s) is not supported (MLX mxfp4 is 4 bits, "
                       "group 32)",
                       label, out->bits, out->group_size, where);
    if (out->group_size <= 0 || out->group_size > 4096)
        return g4_fail(G4_ERR_FORMAT, "%s: quantization group_size %d (%s) is invalid", label, out->group_size,
                       where);
    return G4_OK;
}

static g4_status parse_quant(json_reader *r, const cJSON *root, g4_quant_config *qc) {
    const char *label = r->label;
    const cJSON *q = field(root, "quantization");
    if (!q) {
        /* MLX writes both keys; other tools' quantization_config (e.g.
         * compressed-tensors) has no "bits"/"group_size" and is not ours. */
        const cJSON *qc2 = field(root, "quantization_config");
        if (qc2 && (field(qc2, "bits") || field(qc2, "group_size"))) q = qc2;
    }
    if (!q) return G4_OK;
    if (!cJSON_IsObject(q)) return g4_fail(G4_ERR_FORMAT, "%s: \"quantization\" is not an object", label);
    qc->present = 1;
    g4_status st = parse_quant_params(r, q, &qc->defaults, "defaults");
    if (st != G4_OK) return st;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, q) {
        if (cJSON_IsObject(e) || cJSON_IsFalse(e)) n++;
    }
    if (n == 0) return G4_OK;
    qc->overrides = calloc((size_t)n, sizeof *qc->overrides);
    if (!qc->overrides) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    cJSON_ArrayForEach(e, q) {
        if (!cJSON_IsObject(e) && !cJSON_IsFalse(e)) continue;
        g4_quant_override *o = &qc->overrides[qc->n_overrides];
        o->module = strdup(e->string);
        if (!o->module) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        qc->n_overrides++;
        if (cJSON_IsFalse(e)) { /* mlx: "module": false means left unquantised */
            o->params.mode = G4_QUANT_NONE;
            continue;
        }
        st = parse_quant_params(r, e, &o->params, e->string);
        if (st != G4_OK) return st;
    }
    return G4_OK;
}

g4_quant_params g4_config_quant_for(const g4_config *c, const char *module) {
    for (int i = 0; i < c->quant.n_overrides; i++)
        if (!strcmp(c->quant.overrides[i].module, module)) return c->quant.overrides[i].params;
    if (!c->quant.present) return (g4_quant_params){G4_QUANT_NONE, 0, 0};
    return c->quant.defaults;
}

/* ---- top level ------------------------------------------------------------ */

static g4_status parse_tokens(json_reader *r, const cJSON *root, const cJSON *text, g4_token_ids *tk) {
    r->section = "config";
    tk->bos_id = get_int(r, text, "bos_token_id", get_int(r, root, "bos_token_id", 2));
    tk->pad_id = get_int(r, text, "pad_token_id", get_int(r, root, "pad_token_id", 0));
    tk->eos_ids[0] = 1;
    tk->n_eos = 1;
    get_id_list(r, text, "eos_token_id", tk->eos_ids, &tk->n_eos);
    get_id_list(r, root, "eos_token_id", tk->eos_ids, &tk->n_eos); /* top level wins (IT: [1, 106]) */
    tk->image_id = get_int(r, root, "image_token_id", -1);
    tk->boi_id = get_int(r, root, "boi_token_id", -1);
    tk->eoi_id = get_int(r, root, "eoi_token_id", -1);
    tk->video_id = get_int(r, root, "video_token_id", -1);
    tk->audio_id = get_int(r, root, "audio_token_id", -1);
    tk->boa_id = get_int(r, root, "boa_token_id", -1);
    tk->eoa_id = get_int(r, root, "eoa_token_id", get_int(r, root, "eoa_token_index", -1));
    return r->status;
}

/* The drafter's top-level fields (defaults as transformers' config classes). */
static g4_status parse_assistant(json_reader *r, const cJSON *root, int default_backbone, g4_assistant_config *ac) {
    r->section = "config";
    ac->present = 1;
    ac->backbone_hidden_size = get_int(r, root, "backbone_hidden_size", default_backbone);
    ac->ordered_embeddings = get_bool(r, root, "use_ordered_embeddings", 0);
    ac->n_centroids = get_int(r, root, "num_centroids", 2048);
    ac->centroid_top_k = get_int(r, root, "centroid_intermediate_top_k", 32);
    if (r->status != G4_OK) return r->status;
    if (ac->backbone_hidden_size <= 0 || ac->backbone_hidden_size > 65536)
        return g4_fail(G4_ERR_FORMAT, "%s: backbone_hidden_size=%d must be in [1, 65536]", r->label,
                       ac->backbone_hidden_size);
    if (ac->ordered_embeddings &&
        (ac->n_centroids <= 0 || ac->centroid_top_k <= 0 || ac->centroid_top_k > ac->n_centroids ||
         ac->centroid_top_k > G4_TOP_CENTROIDS_MAX))
        return g4_fail(G4_ERR_FORMAT,
                       "%s: use_ordered_embeddings needs num_centroids > 0 and 0 < centroid_intermediate_top_k <= "
                       "min(num_centroids, %d) (have %d, %d)",
                       r->label, G4_TOP_CENTROIDS_MAX, ac->n_centroids, ac->centroid_top_k);
    return G4_OK;
}

g4_status g4_config_parse(const char *json, size_t len, const char *label, g4_config *out) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return g4_fail(G4_ERR_FORMAT, "%s: not valid JSON", label);
    json_reader r = {label, "config", G4_OK};
    g4_status st = G4_OK;
    if (!cJSON_IsObject(root)) {
        st = g4_fail(G4_ERR_FORMAT, "%s: not a JSON object", label);
        goto done;
    }
    const char *type = get_string(&r, root, "model_type");
    if (r.status != G4_OK || !type) {
        st = r.status != G4_OK ? r.status : g4_fail(G4_ERR_FORMAT, "%s: missing model_type", label);
        goto done;
    }
    snprintf(out->model_type, sizeof out->model_type, "%s", type);
    const cJSON *text;
    if (!strcmp(type, "gemma4") || !strcmp(type, "gemma4_unified")) {
        text = field(root, "text_config");
        if (!text || !cJSON_IsObject(text)) {
            st = g4_fail(G4_ERR_FORMAT, "%s: model_type %s needs a text_config object", label, type);
            goto done;
        }
    } else if (!strcmp(type, "gemma4_text") || !strcmp(type, "gemma4_unified_text")) {
        text = root;
    } else if (!strcmp(type, "gemma4_assistant") || !strcmp(type, "gemma4_unified_assistant")) {
        text = field(root, "text_config");
        if (!text || !cJSON_IsObject(text)) {
            st = g4_fail(G4_ERR_FORMAT, "%s: model_type %s needs a text_config object", label, type);
            goto done;
        }
        st = parse_assistant(&r, root, !strcmp(type, "gemma4_assistant") ? 1536 : 3840, &out->assistant);
        if (st != G4_OK) goto done;
    } else {
        st = g4_fail(G4_ERR_UNSUPPORTED,
                     "%s: model_type '%s' is not a Gemma 4 model (expected gemma4, gemma4_text, "
                     "gemma4_unified, gemma4_unified_text, gemma4_assistant or gemma4_unified_assistant)",
                     label, type);
        goto done;
    }
    out->unified = !strncmp(type, "gemma4_unified", 14) && !out->assistant.present;
    st = parse_text(&r, text, out->assistant.present, &out->text);
    if (st != G4_OK) goto done;
    if (out->assistant.present) {
        /* no towers of its own: the target embeds images and audio */
    } else if (out->unified) {
        /* The 12B has no PLE and no MoE even if BC keys say otherwise. */
        out->text.ple_dim = 0;
        out->text.moe = 0;
        st = parse_unified(&r, field(root, "vision_config"), field(root, "audio_config"), &out->unified_mm);
    } else {
        st = parse_vision(&r, field(root, "vision_config"), &out->vision);
        if (st == G4_OK) st = parse_audio(&r, field(root, "audio_config"), &out->audio);
    }
    if (st != G4_OK) goto done;
    r.section = "config";
    out->tie_embeddings = get_bool(&r, root, "tie_word_embeddings", get_bool(&r, text, "tie_word_embeddings", 1));
    st = parse_tokens(&r, root, text, &out->tokens);
    if (st == G4_OK) st = parse_quant(&r, root, &out->quant);
done:
    cJSON_Delete(root);
    if (st != G4_OK) g4_config_free(out);
    return st;
}

g4_status g4_config_load(const char *path, g4_config *out) {
    memset(out, 0, sizeof *out);
    char *file = g4_is_directory(path) ? g4_path_join(path, "config.json") : strdup(path);
    if (!file) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    char *text;
    size_t len;
    g4_status st = g4_read_file(file, 16u << 20, &text, &len);
    if (st == G4_OK) {
        st = g4_config_parse(text, len, file, out);
        free(text);
    }
    free(file);
    return st;
}

void g4_config_free(g4_config *c) {
    free(c->text.layers);
    for (int i = 0; i < c->quant.n_overrides; i++) free(c->quant.overrides[i].module);
    free(c->quant.overrides);
    memset(c, 0, sizeof *c);
}

static g4_status parse_generation(json_reader *r, const cJSON *root, g4_generation_config *out) {
    r->section = "generation_config";
    out->do_sample = get_bool(r, root, "do_sample", 0);
    out->temperature = get_float(r, root, "temperature", 1.0f);
    out->top_k = get_int(r, root, "top_k", 0);
    out->top_p = get_float(r, root, "top_p", 1.0f);
    out->min_p = get_float(r, root, "min_p", 0.0f);
    out->repetition_penalty = get_float(r, root, "repetition_penalty", 1.0f);
    out->bos_id = get_int(r, root, "bos_token_id", 2);
    out->pad_id = get_int(r, root, "pad_token_id", 0);
    get_id_list(r, root, "eos_token_id", out->eos_ids, &out->n_eos);
    const cJSON *suppress = field(root, "suppress_tokens");
    if (suppress) {
        const cJSON *e;
        if (!cJSON_IsArray(suppress) || cJSON_GetArraySize(suppress) > G4_MAX_SUPPRESS_IDS)
            return g4_fail(G4_ERR_FORMAT, "%s: suppress_tokens must be a list of at most %d token ids", r->label,
                           G4_MAX_SUPPRESS_IDS);
        cJSON_ArrayForEach(e, suppress) {
            if (!json_is_int(e) || e->valuedouble < 0)
                return g4_fail(G4_ERR_FORMAT, "%s: suppress_tokens must hold non-negative integer token ids", r->label);
            out->suppress_ids[out->n_suppress++] = (int)e->valuedouble;
        }
    }
    if (r->status != G4_OK) return r->status;
    if (out->temperature < 0 || out->top_k < 0 || !(out->top_p > 0 && out->top_p <= 1) || out->min_p < 0 ||
        out->min_p > 1 || !(out->repetition_penalty > 0))
        return g4_fail(G4_ERR_FORMAT,
                       "%s: sampling settings out of range (temperature >= 0, top_k >= 0, 0 < top_p <= 1, "
                       "0 <= min_p <= 1, repetition_penalty > 0)",
                       r->label);
    return G4_OK;
}

g4_status g4_generation_config_load(const char *dir, g4_generation_config *out) {
    memset(out, 0, sizeof *out);
    out->temperature = 1.0f;
    out->top_p = 1.0f;
    out->repetition_penalty = 1.0f;
    out->bos_id = 2;
    char *file = g4_path_join(dir, "generation_config.json");
    if (!file) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (!g4_file_exists(file)) {
        free(file);
        return G4_OK;
    }
    char *text;
    size_t len;
    g4_status st = g4_read_file(file, 1u << 20, &text, &len);
    if (st != G4_OK) {
        free(file);
        return st;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        st = g4_fail(G4_ERR_FORMAT, "%s: not a valid JSON object", file);
    } else {
        json_reader r = {file, "generation_config", G4_OK};
        out->present = 1;
        st = parse_generation(&r, root, out);
    }
    cJSON_Delete(root);
    free(file);
    return st;
}
