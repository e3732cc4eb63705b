/* The encoder-free embedders of Gemma 4 12B (gemma4_unified; SPEC
 * gemma4-unified-assistant §A4.2, §A5.2): no vision or audio tower, one soft
 * token per 48x48-pixel patch or per 640-sample (40 ms) audio frame.
 *
 *   vision: LN(6912) -> Dense(+bias) -> LN -> + position table[x, y] -> LN
 *           -> RMSNorm without scale -> projection to the text width
 *   audio:  RMSNorm without scale -> projection
 * LayerNorms are torch.nn.LayerNorm (eps 1e-5, weight and bias). */
#ifndef G4_MODEL_UNIFIED_EMBEDDERS_H
#define G4_MODEL_UNIFIED_EMBEDDERS_H

#include <stdint.h>

#include "model/model.h"
#include "model/text_decoder.h"

/* Loads whichever embedders config.json declares (called by the loader for
 * gemma4_unified models). Accepts the hub names (model.vision_embedder.*,
 * model.embed_vision.embedding_projection) and transformers' module names
 * (model.embed_vision.*, ...multimodal_embedder.embedding_projection), and
 * MLX conversions without the "model." prefix. */
g4_status g4_unified_embedders_load(g4_model *m);
void g4_unified_embedders_free(g4_model *m);

/* pixel_values: host [n_rows][6912] in [0, 1] (48x48x3 HWC per row), positions
 * host [n_rows][2] (x, y) with padding rows (-1, -1) after the image's rows.
 * *soft: backend memory [*n_soft][text hidden] (caller releases). `hook`
 * (optional) sees "patch_dense", "patch_ln2" and "pos_norm". */
g4_status g4_unified_vision_encode(const g4_model *m, const float *pixel_values, const int32_t *positions, int n_rows,
                                   g4_hidden_hook hook, void *hook_ctx, float **soft, int *n_soft);

/* frames: host [n][640] raw 16 kHz samples. *soft: backend [n][text hidden]. */
g4_status g4_unified_audio_encode(const g4_model *m, const float *frames, int n, float **soft);

#endif
