/* config.json -> plain structs. Accepts `gemma4` (text under text_config,
 * with vision/audio configs), `gemma4_text`, and `gemma4_unified(_text)`;
 * the MTP drafters `gemma4_assistant` and `gemma4_unified_assistant`;
 * both encodings of the global layers (per_layer_config, or
 * global_head_dim + num_global_key_value_heads); MLX `quantization` blocks.
 * The per-layer plan (head size, KV heads, KV donor, MLP width) is derived
 * here once, so the model code reads it instead of re-deriving rules. */
#ifndef G4_IO_CONFIG_H
#define G4_IO_CONFIG_H

#include "base/status.h"

#define G4_MAX_EOS_IDS 8
#define G4_MAX_SUPPRESS_IDS 64
/* The most centroids a drafter's sparse LM head may keep (the backend's top_logits limit). */
#define G4_TOP_CENTROIDS_MAX 1024

typedef enum { G4_LAYER_SLIDING = 0, G4_LAYER_FULL = 1 } g4_layer_kind;

typedef struct {
    g4_layer_kind kind;
    int head_dim;
    int n_kv_heads;
    int k_eq_v;          /* V comes from the raw k_proj output (no v_proj) */
    int kv_donor;        /* -1: own KV cache; else the layer whose cache it reads */
    int mlp_width;       /* dense MLP intermediate size (double on E2B shared layers) */
    float rope_theta;
    int rope_pairs;      /* rotated frequency pairs: head_dim/2, or fewer for proportional RoPE */
    int rope_proportional;
} g4_layer_config;

typedef struct {
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    float rms_eps;
    int sliding_window;
    float final_softcap;      /* 0: none */
    int ple_dim;              /* hidden_size_per_layer_input; 0 without PLE */
    int ple_vocab;            /* vocab_size_per_layer_input */
    int n_kv_shared;          /* num_kv_shared_layers */
    int moe;                  /* enable_moe_block */
    int n_experts, top_k_experts, moe_width;
    int max_position;
    int bidirectional_vision; /* use_bidirectional_attention == "vision" */
    int bidirectional_all;    /* use_bidirectional_attention == "all" */
    g4_layer_config *layers;  /* [n_layers] */
} g4_text_config;

typedef struct {
    int present;
    int hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads, head_dim;
    int patch_size, pooling_kernel, position_embedding_size;
    int default_output_length;
    float rope_theta, rms_eps;
    int standardize, clipped_linears;
} g4_vision_config;

typedef struct {
    int present;
    int hidden_size, n_layers, n_heads;
    int conv_channels[2];
    int conv_kernel;
    int chunk_size, context_left, context_right;
    float logit_cap, invalid_logit, rms_eps, residual_weight, gradient_clipping;
    int output_proj_dims;
    int clipped_linears;
} g4_audio_config;

/* Encoder-free embedders of gemma4_unified (the 12B). */
typedef struct {
    int vision_present, audio_present;
    int patch_size;           /* 48 */
    int mm_embed_dim;
    int position_table_size;
    float layer_norm_eps;
    int audio_frame_samples;  /* 640 */
} g4_unified_config;

typedef enum { G4_QUANT_NONE = 0, G4_QUANT_AFFINE, G4_QUANT_MXFP4 } g4_quant_mode;

typedef struct {
    g4_quant_mode mode;
    int bits, group_size;
} g4_quant_params;

typedef struct {
    char *module; /* e.g. "language_model.model.layers.1.mlp.down_proj" */
    g4_quant_params params;
} g4_quant_override;

typedef struct {
    int present;
    g4_quant_params defaults;
    g4_quant_override *overrides;
    int n_overrides;
} g4_quant_config;

typedef struct {
    int bos_id, pad_id;
    int eos_ids[G4_MAX_EOS_IDS];
    int n_eos;
    int image_id, boi_id, eoi_id, video_id;
    int audio_id, boa_id, eoa_id;
} g4_token_ids;

/* An MTP drafter's own fields (gemma4_assistant, gemma4_unified_assistant;
 * SPEC-gemma4-unified-assistant B2). Its text config describes a stack whose
 * every layer reads the target's K/V: n_kv_shared == n_layers there, and
 * kv_donor stays -1 (the donors are the target's layers, chosen on attach). */
typedef struct {
    int present;
    int backbone_hidden_size;  /* the target's hidden size */
    int ordered_embeddings;    /* centroid LM head (use_ordered_embeddings) */
    int n_centroids, centroid_top_k;
} g4_assistant_config;

typedef struct {
    char model_type[48]; /* top-level model_type */
    int unified;         /* gemma4_unified family */
    int tie_embeddings;
    g4_text_config text;
    g4_vision_config vision;
    g4_audio_config audio;
    g4_unified_config unified_mm;
    g4_token_ids tokens;
    g4_quant_config quant;
    g4_assistant_config assistant;
} g4_config;

/* Parses config.json text. `label` names the source in errors. */
g4_status g4_config_parse(const char *json, size_t len, const char *label, g4_config *out);
/* Reads DIR/config.json (or a file path). */
g4_status g4_config_load(const char *path, g4_config *out);
void g4_config_free(g4_config *c);

/* Quantisation of one module (by its MLX-style path): the override if one
 * names it, else the defaults. */
g4_quant_params g4_config_quant_for(const g4_config *c, const char *module);

/* generation_config.json */
typedef struct {
    int present;
    int do_sample;
    float temperature, top_p, min_p, repetition_penalty;
    int top_k;
    int eos_ids[G4_MAX_EOS_IDS];
    int n_eos;
    int bos_id, pad_id;
    int suppress_ids[G4_MAX_SUPPRESS_IDS]; /* suppress_tokens (e.g. the 12B's <audio|>, <image|>) */
    int n_suppress;
} g4_generation_config;

/* Missing file -> present = 0 and defaults (greedy), G4_OK. */
g4_status g4_generation_config_load(const char *dir, g4_generation_config *out);

#endif
