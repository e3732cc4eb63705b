/* The Gemma 4 vision encoder (SPEC-gemma4.md §3.2–3.4): patch embedding
 * with a 2-D position table, bidirectional encoder layers with 2-D RoPE,
 * 3x3 position-based average pooling, optional standardisation, and the
 * embedder that projects soft tokens to the text width. */
#ifndef G4_MODEL_VISION_TOWER_H
#define G4_MODEL_VISION_TOWER_H

#include <stdint.h>

#include "model/model.h"

/* Loads the tower's weights when config.vision is present (called by the
 * model loader; problems are reported through the same all-problems list). */
g4_status g4_vision_tower_load(g4_model *m);
void g4_vision_tower_free(g4_model *m);
/* Parameters of the tower and its embedder (0 without one). */
uint64_t g4_vision_tower_params(const g4_model *m);

/* Encodes one image. pixel_values: host [n_rows][3*patch*patch] in [0, 1],
 * positions: host [n_rows][2] (x, y), padding rows (-1, -1). n_rows is the
 * processor's max_patches (9 x max_soft_tokens). On success *soft is backend
 * memory [*n_soft][text hidden] the caller releases with the backend. */
g4_status g4_vision_encode(const g4_model *m, const float *pixel_values, const int32_t *positions, int n_rows,
                           float **soft, int *n_soft);

#endif
