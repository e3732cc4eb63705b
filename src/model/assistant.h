/* The Gemma 4 MTP assistants (gemma4_assistant, gemma4_unified_assistant):
 * small drafters for speculative decoding (SPEC-gemma4-unified-assistant
 * Part B). A drafter is a 4-layer Gemma 4 text stack without K/V of its
 * own: every layer attends with its queries onto the target's K/V (the
 * target's last sliding and last full layer before its KV-shared layers).
 * Its input is [target embedding of a token | target hidden state] through
 * pre_projection; its outputs are logits over the target's vocabulary (tied
 * head, no softcap; optionally the sparse centroid head) and
 * post_projection(h), the hidden state of its next step. */
#ifndef G4_MODEL_ASSISTANT_H
#define G4_MODEL_ASSISTANT_H

#include <stdint.h>

#include "model/kv_cache.h"
#include "model/model.h"

typedef struct {
    /* the drafter's own stack: config (config.assistant present), embedding
     * (its tied LM head), final norm and per-layer weights (no k/v) */
    g4_model *model;
    int backbone_hidden;      /* d_t: the target's hidden size */
    g4_matrix pre_projection; /* [d_a, 2 d_t] */
    g4_matrix post_projection;/* [d_t, d_a] */
    /* centroid head (use_ordered_embeddings) */
    int ordered;
    int n_centroids, centroid_top_k, tokens_per_centroid;
    g4_matrix centroids;      /* [n_centroids, d_a] */
    int32_t *token_ordering;  /* host [vocab]: cluster c holds ids [c*K, (c+1)*K) of it */
    /* set by g4_assistant_attach: the target layer whose cache each kind of
     * drafter layer reads ([G4_LAYER_SLIDING], [G4_LAYER_FULL]) */
    int target_layer[2];
} g4_assistant;

/* Loads a drafter directory on `be` (Hugging Face layout, or an MLX
 * conversion: the same names, modules quantised 4/8-bit affine or mxfp4 as
 * config.json's quantization block says): config.json and
 * every tensor checked, all problems listed in one error. */
g4_status g4_assistant_load_dir(const char *dir, g4_backend *be, g4_assistant **out);
void g4_assistant_release(g4_assistant *a);

/* The drafter beside a target (a --draft auto), as Google names them (every
 * gemma-4-X-it has a gemma-4-X-it-assistant): the folder `<model>-assistant`
 * next to model_dir, or for a model in the hub cache
 * (.../models--ORG--NAME/snapshots/REV) the pulled ORG/NAME-assistant.
 * *out: a malloc'd folder path; G4_ERR_NOT_FOUND naming where it looked. */
g4_status g4_assistant_find(const char *model_dir, char **out);

/* A drafter with random weights for the synthetic target `preset` (see
 * assistant_synth.c for its shape); attach it to that target as usual. */
g4_status g4_assistant_synthesize(const char *preset, g4_backend *be, g4_assistant **out);
/* Its config.json (malloc'd; NULL when target_json is not a config). */
char *g4_assistant_synth_config(const char *target_json, size_t len);

/* Checks that the drafter fits `target` (vocabulary, backbone width, head
 * sizes, KV heads and RoPE per layer kind) and picks the target layers it
 * reads; the error names every mismatch. */
g4_status g4_assistant_attach(g4_assistant *a, const g4_model *target);

/* Human-readable summary into a malloc'd string. */
char *g4_assistant_describe(const g4_assistant *a);

/* Which target K/V one drafter step sees: the target's pool and its
 * sequence's block tables (host), and per layer kind the visible key
 * positions [lo, hi] (inclusive; lo > hi: none). */
typedef struct {
    const g4_kv_pool *kv;
    const int32_t *full_table;
    int full_table_stride;
    const int32_t *ring;
    int lo[2], hi[2];
} g4_drafter_kv;

/* The keys the spec's clean algorithm shows a drafter step at position p
 * after `ctx` = p target positions: full layers 0..p-1, sliding layers the
 * last W+1 of them (W the drafter's sliding_window). */
void g4_drafter_kv_window(const g4_assistant *a, int ctx, g4_drafter_kv *kv);

typedef struct g4_drafter_scratch g4_drafter_scratch;

/* A scratch for forwards of up to max_rows rows (one row per sequence that
 * drafts; g4_drafter_scratch_create: one row). */
g4_status g4_drafter_scratch_create(const g4_assistant *a, g4_drafter_scratch **out);
g4_status g4_drafter_scratch_create_rows(const g4_assistant *a, int max_rows, g4_drafter_scratch **out);
int g4_drafter_scratch_rows(const g4_drafter_scratch *s);
void g4_drafter_scratch_free(g4_drafter_scratch *s);

/* The next step's input: raw [2 d_t] host floats (tests), or the target's
 * scaled embedding of `token` beside a hidden state: host [d_t] floats, or
 * NULL for the projected state the previous step left. */
void g4_drafter_set_input(g4_drafter_scratch *s, const float *inputs);
void g4_drafter_set_input_row(g4_drafter_scratch *s, int row, const float *inputs);
g4_status g4_drafter_set_token(g4_drafter_scratch *s, const g4_model *target, int32_t token, const float *hidden);
/* Rows 0..n of the next forward: tokens[r]'s scaled target embedding beside
 * hidden[r] (host [d_t]), or where hidden or hidden[r] is NULL the projected
 * state the previous forward left at its row from[r] (from NULL: row r), so
 * a round can drop rows that stopped drafting. */
g4_status g4_drafter_set_tokens(g4_drafter_scratch *s, const g4_model *target, int n, const int32_t *tokens,
                                const float *const *hidden, const int *from);

typedef struct {
    int32_t token;     /* argmax of the logits (ties: lowest id) */
    float *logits;     /* optional host [vocab]: the logits (centroid head:
                          the candidates' exact logits, every other token
                          min(candidates) - 1, as transformers fills them) */
    float *projected;  /* optional host [d_t] */
    float *dense_logits; /* optional host [vocab]: h_a . E_a for every token
                            (the centroid head's reference; costs the full head) */
    int32_t *candidates; /* optional host [top_k * K] (centroid head only) */
} g4_drafter_result;

/* One drafter call at RoPE position `pos` on the input set before. */
g4_status g4_drafter_forward(const g4_assistant *a, g4_drafter_scratch *s, int pos, const g4_drafter_kv *kv,
                             g4_drafter_result *res);
/* One drafter call of n rows (each its own sequence): row r at position
 * pos[r] onto the target K/V kv[r] (one pool for all), results into res[r].
 * On the CPU's exact path row r computes bit for bit as it would alone (its
 * batch-invariant kernels). */
g4_status g4_drafter_forward_rows(const g4_assistant *a, g4_drafter_scratch *s, int n, const int *pos,
                                  const g4_drafter_kv *kv, g4_drafter_result *res);

#endif
