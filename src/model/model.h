/* A loaded Gemma 4 model: its config, its weights (in their stored formats,
 * made usable by the chosen backend) and the backend that runs it. */
#ifndef G4_MODEL_MODEL_H
#define G4_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "tensor/matrix.h"

/* Weights of one text decoder layer. Vectors are float32 backend arrays
 * (converted once at load; they are tiny). Absent parts are zeroed. */
typedef struct {
    float *input_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm;
    float *q_norm, *k_norm;
    float layer_scalar;
    g4_matrix q, k, v, o;  /* k, v absent on KV-shared layers; v absent when k_eq_v */
    /* q, k, v stacked (rows q then k then v) where the backend chose to
     * place them adjacently at upload (q, k, v are then views of it);
     * absent otherwise */
    g4_matrix qkv;
    g4_matrix gate, up, down;
    /* gate and up stacked (gate rows then up rows) the same way */
    g4_matrix gate_up;
    /* per-layer embeddings (E2B/E4B) */
    g4_matrix ple_gate, ple_proj;
    float *ple_post_norm;
    /* mixture of experts (26B-A4B) */
    g4_matrix router;
    float *router_scale;      /* router.scale * hidden_size^-0.5 */
    float *per_expert_scale;
    g4_expert_matrix expert_gate, expert_up, expert_down;
    float *pre_ffn_norm2, *post_ffn_norm1, *post_ffn_norm2;
} g4_text_layer;

typedef struct {
    g4_matrix embed;          /* [vocab, d]; also the tied LM head */
    float *final_norm;
    float embed_scale;        /* bf16(sqrt(d)) */
    /* per-layer embeddings */
    g4_matrix ple_embed;      /* [ple_vocab, L*P] */
    g4_matrix ple_model_proj; /* [L*P, d] */
    float *ple_proj_norm;     /* [P] */
    float ple_embed_scale;    /* bf16(sqrt(P)) */
    g4_text_layer *layers;
} g4_text_weights;

typedef enum { G4_LAYOUT_HF = 0, G4_LAYOUT_MLX } g4_layout;

typedef struct g4_model {
    char *path;
    g4_config config;
    g4_st_set *tensors;
    g4_layout layout;
    const char *text_prefix;  /* e.g. "model.language_model." */
    g4_backend *backend;
    g4_text_weights text;
    struct g4_audio_weights *audio; /* audio tower + embed_audio (model/audio_tower.h); NULL if none */
    /* bookkeeping for `gemma4 info` */
    uint64_t weight_bytes_by_format[5];
    uint64_t n_params;
    size_t n_unused_tensors;
    unsigned char *tensor_used; /* [tensor count]: consumed by a loader */
    struct g4_vision_weights *vision; /* NULL without a vision tower */
    struct g4_unified_weights *unified; /* gemma4_unified's encoder-free embedders, or NULL */
    void **device_allocs;     /* backend arrays owned by the model */
    size_t n_device_allocs, cap_device_allocs;
    void **host_allocs;       /* synthetic weights owned by the model */
    size_t n_host_allocs, cap_host_allocs;
    int synthetic;
    /* Dry synthetic load (gemma4 synth): tensors are recorded here, nothing
     * is allocated and the weights stay empty. */
    struct g4_synth_record *synth_record;
} g4_model;

typedef struct {
    int threads; /* CPU threads, 0 = all */
} g4_load_options;

/* Loads config.json and the safetensors of a model directory, checks that
 * every tensor the config requires is present with the right shape and dtype
 * (listing every problem in one error), and prepares the weights for `be`.
 * The model does not own the backend. */
g4_status g4_model_load_dir(const char *dir, g4_backend *be, g4_model **out);
void g4_model_release(g4_model *m);

/* A full-size model with random weights for benchmarks: `preset` names a
 * release config compiled into the binary ("e2b", "e4b", "26b-a4b", "31b",
 * "12b"), `format` is "bf16", "mlx4", "mlx8" or "mxfp4" (mlx4 uses the
 * mlx-community recipe where one exists: mixed 4/8-bit). Speed does not
 * depend on the values; the weights are never used for anything else. */
g4_status g4_model_synthesize(const char *preset, const char *format, g4_backend *be, g4_model **out);
/* The same from any config.json text (label names it in messages). With a
 * record: a dry run that lists every tensor the model needs, named as a
 * checkpoint of the format stores them (bf16: Hugging Face names; quantised:
 * MLX names), in `record` and allocates no weights; `be` may then be NULL. */
struct g4_synth_record;
g4_status g4_model_synthesize_json(const char *json, size_t len, const char *label, const char *format,
                                   g4_backend *be, struct g4_synth_record *record, g4_model **out);
/* The compiled-in config a synthetic `preset` in `format` uses. */
g4_status g4_model_preset_config(const char *preset, const char *format, const char **json, size_t *len);
/* Names of the compiled-in presets, space-separated. */
const char *g4_model_preset_names(void);

/* Human-readable summary (architecture, layer plan, parameters, bytes by
 * format) into a malloc'd string. */
char *g4_model_describe(const g4_model *m);



/* Bytes of weights a single decode step reads (the LM head and every
 * projection; MoE: only top_k of the experts; embedding rows counted as one
 * row), and the KV-cache bytes it reads at context length ctx with a cache of
 * `type` (kv_cache.h g4_kv_row_bytes: what the pool stores per row). */
uint64_t g4_model_decode_weight_bytes(const g4_model *m);
uint64_t g4_model_decode_kv_bytes(const g4_model *m, int ctx, g4_kv_type type);
/* FLOPs per prompt token of a prefill (matrices only, MoE: top_k; the LM
 * head, needed for the last row only, excluded). */
double g4_model_flops_per_token(const g4_model *m);
#endif
