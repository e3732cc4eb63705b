/* The Gemma 4 audio encoder of E2B/E4B (transformers' Gemma4AudioModel, a
 * USM-style conformer) and its embedder into the text model (embed_audio).
 *
 * log-mel features [T][128] + frame mask
 *   -> subsampling: 2 x (mask frames, Conv2d 3x3 stride 2 pad 1, LayerNorm
 *      over channels, ReLU), flatten [T/4][freq x channels], input_proj_linear
 *   -> conformer layers: half-step FFN, chunked local attention with
 *      relative positions, light conv (GLU, causal depthwise conv), half-step
 *      FFN, norm
 *   -> output_proj (+bias) -> weightless RMSNorm -> embedding_projection
 * The soft tokens are the rows of the valid subsampled frames, in order.
 * Everything runs in float32 through the backend ops, as transformers runs
 * the audio tower in float32. */
#ifndef G4_MODEL_AUDIO_TOWER_H
#define G4_MODEL_AUDIO_TOWER_H

#include <stdint.h>

#include "model/model.h"
#include "model/text_decoder.h" /* g4_hidden_hook */

/* A Gemma4ClippableLinear: y = clamp(W clamp(x, in_min, in_max), out_min, out_max).
 * Bounds are +-inf when the model has no clip scalars (use_clipped_linears false). */
typedef struct {
    g4_matrix w;
    float in_min, in_max, out_min, out_max;
} g4_clipped_linear;

typedef struct {
    float *pre_norm, *post_norm;    /* [hidden] */
    g4_clipped_linear up, down;     /* ffw_layer_1 [4h, h], ffw_layer_2 [h, 4h] */
} g4_audio_ffn;

typedef struct {
    g4_audio_ffn ffn1, ffn2;
    float *norm_pre_attn, *norm_post_attn, *norm_out;
    g4_clipped_linear q, k, v, post;
    g4_matrix rel_k;                /* relative_k_proj [h, h], plain Linear */
    float *q_scale;                 /* [hidden]: head_dim^-0.5 / ln 2 * softplus(per_dim_scale), per head */
    float *lconv_norm, *conv_norm;  /* lconv1d.pre_layer_norm, lconv1d.conv_norm */
    g4_clipped_linear lin_start, lin_end;
    float *dw_conv;                 /* depthwise_conv1d [hidden][kernel] */
} g4_audio_layer;

typedef struct g4_audio_weights {
    int n_mel;                      /* input features per frame (128) */
    int hidden, n_heads, head_dim, ffn_width, conv_kernel;
    int out_dims;                   /* output_proj_dims */
    float *conv0, *conv1;           /* [c_out][3][3][c_in] float32 (channels last) */
    float *norm0, *norm1;           /* LayerNorm weights [c_out] (no bias) */
    g4_matrix input_proj;           /* [hidden, freq/4 * c1] */
    g4_audio_layer *layers;
    g4_matrix output_proj;          /* [out_dims, hidden] */
    float *output_bias;             /* [out_dims] */
    g4_matrix embed_proj;           /* embed_audio.embedding_projection [d_text, out_dims] */
    float *rel_pos;                 /* [n_rel][hidden] sinusoidal table, rows at positions n_rel-1 .. 0 */
    int n_rel;
    uint64_t n_params, weight_bytes; /* the tower's and embed_audio's own (not in g4_model's totals) */
} g4_audio_weights;

/* Which past frames a frame attends to. transformers (the reference):
 * itself and context_left - 2 past frames (11 for the released config);
 * Google's JAX code and mlx-vlm: itself and context_left - 1 (12). */
typedef enum { G4_AUDIO_WINDOW_HF = 0, G4_AUDIO_WINDOW_JAX } g4_audio_window;

typedef struct {
    g4_audio_window window;
    /* Validation only, never for inference: reproduce transformers 5.17's
     * audio attention under attn_implementation="eager", which inverts the
     * mask (its boolean-mask code is handed a float additive mask; sdpa and
     * later releases are correct). The vendored fixtures' audio references
     * were made that way. */
    int hf517_eager_mask;
    /* Optional: called with backend arrays of intermediate activations
     * ("subsample" [T'][hidden] after input_proj_linear, "layer<i>" after
     * each conformer layer, "output_proj" [T'][out_dims] with the bias), all
     * T' = g4_audio_subsampled_frames(n_frames) rows, padding included. */
    g4_hidden_hook hook;
    void *hook_ctx;
} g4_audio_options;

/* Loads the audio tower and embed_audio (called by g4_model_load_dir when
 * config.json has an audio_config); every missing or malformed tensor is
 * listed in one error. Sets m->audio. */
g4_status g4_audio_tower_load(g4_model *m);
void g4_audio_tower_free(g4_model *m);

/* Encodes one clip: features are host memory [n_frames][128] (log-mel),
 * mask host [n_frames] (nonzero = real frame; NULL = all real). On success
 * *soft_tokens is backend memory [*n_tokens][d_text] that the caller frees
 * with m->backend->ops->release (NULL when no frame is valid). */
g4_status g4_audio_encode(const g4_model *m, const float *features, const uint8_t *mask, int n_frames,
                          float **soft_tokens, int *n_tokens);
g4_status g4_audio_encode_with(const g4_model *m, const float *features, const uint8_t *mask, int n_frames,
                               const g4_audio_options *opt, float **soft_tokens, int *n_tokens);

/* Frames left after the two stride-2 convolutions: (t - 1) / 2 + 1, twice. */
int g4_audio_subsampled_frames(int n_frames);

#endif
