/* A synthetic drafter's config.json for a synthetic full-size target, so
 * that speculative decoding can be benchmarked on every size without the
 * real assistants (random weights: acceptance is then forced, see
 * g4_speculative_force_acceptance).
 *
 * The shape follows SPEC-gemma4-unified-assistant B2 where it is known: four
 * layers [S, S, S, F], d_a = 1024, intermediate 8192, the target's head
 * sizes, KV head counts, K=V rule, RoPE and sliding window (the drafter
 * attends onto the target's K/V, so those must match), a tied head, and for
 * the E2B/E4B targets (per-layer inputs) the centroid head of 2048 clusters,
 * top 32. The query head count (16) is a guess where the spec has none. */
#include "model/assistant.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* The fields of the target's text config that the drafter shares. */
static const char *const shared_fields[] = {
    "head_dim", "global_head_dim", "num_key_value_heads", "num_global_key_value_heads", "attention_k_eq_v",
    "rope_parameters", "sliding_window", "vocab_size", "rms_norm_eps", "max_position_embeddings",
    "bos_token_id", "eos_token_id", "pad_token_id", "hidden_activation",
};

static void copy_field(cJSON *dst, const cJSON *src, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, name);
    if (v) cJSON_AddItemToObject(dst, name, cJSON_Duplicate(v, 1));
}

char *g4_assistant_synth_config(const char *target_json, size_t len) {
    cJSON *root = cJSON_ParseWithLength(target_json, len);
    if (!root) return NULL;
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(tt)) tt = root;
    const cJSON *d_t = cJSON_GetObjectItemCaseSensitive(tt, "hidden_size");
    const cJSON *ple = cJSON_GetObjectItemCaseSensitive(tt, "hidden_size_per_layer_input");
    const int ordered = cJSON_IsNumber(ple) && ple->valueint > 0; /* E2B, E4B */
    cJSON *out = cJSON_CreateObject(), *text = cJSON_CreateObject(), *types = cJSON_CreateArray();
    char *json = NULL;
    if (out && text && types && cJSON_IsNumber(d_t)) {
        for (size_t i = 0; i < sizeof shared_fields / sizeof shared_fields[0]; i++)
            copy_field(text, tt, shared_fields[i]);
        cJSON_AddStringToObject(text, "model_type", "gemma4_text");
        cJSON_AddNumberToObject(text, "hidden_size", 1024);
        cJSON_AddNumberToObject(text, "intermediate_size", 8192);
        cJSON_AddNumberToObject(text, "num_hidden_layers", 4);
        cJSON_AddNumberToObject(text, "num_attention_heads", 16);
        cJSON_AddNumberToObject(text, "num_kv_shared_layers", 4);
        cJSON_AddNumberToObject(text, "hidden_size_per_layer_input", 0);
        cJSON_AddBoolToObject(text, "enable_moe_block", 0);
        cJSON_AddBoolToObject(text, "use_double_wide_mlp", 0);
        cJSON_AddNullToObject(text, "final_logit_softcapping");
        cJSON_AddBoolToObject(text, "tie_word_embeddings", 1);
        for (int i = 0; i < 4; i++)
            cJSON_AddItemToArray(types, cJSON_CreateString(i < 3 ? "sliding_attention" : "full_attention"));
        cJSON_AddItemToObject(text, "layer_types", types);
        types = NULL;
        cJSON_AddStringToObject(out, "model_type", "gemma4_assistant");
        cJSON_AddNumberToObject(out, "backbone_hidden_size", d_t->valuedouble);
        cJSON_AddBoolToObject(out, "use_ordered_embeddings", ordered);
        cJSON_AddNumberToObject(out, "num_centroids", 2048);
        cJSON_AddNumberToObject(out, "centroid_intermediate_top_k", 32);
        cJSON_AddBoolToObject(out, "tie_word_embeddings", 1);
        cJSON_AddItemToObject(out, "text_config", text);
        text = NULL;
        json = cJSON_PrintUnformatted(out);
    }
    cJSON_Delete(types);
    cJSON_Delete(text);
    cJSON_Delete(out);
    cJSON_Delete(root);
    return json;
}
