/* Image -> vision tower input, as transformers' Gemma 4 image processors
 * compute it (SPEC-gemma4.md §3.1; SPEC-gemma4-unified-assistant.md §A4.1):
 * aspect-preserving resize to multiples of patch*pool pixels within the
 * budget, rescale to [0, 1], cut into patches in row-major order (each patch
 * flattened [dy][dx][c]), position ids (x, y), zero padding rows at (-1, -1). */
#ifndef G4_MEDIA_IMAGE_PATCHES_H
#define G4_MEDIA_IMAGE_PATCHES_H

#include <stdint.h>

#include "media/image.h"
#include "media/image_resize.h"

#define G4_IMAGE_PATCH_SIZE 16     /* Gemma 4 vision tower patch */
#define G4_IMAGE_POOLING 3         /* 3x3 patches pool into one soft token */
#define G4_IMAGE_UNIFIED_PATCH 48  /* the 12B embedder's patch = 16 * 3 */
#define G4_IMAGE_DEFAULT_SOFT_TOKENS 280

/* 1 when max_soft_tokens is one the processors accept: 70, 140, 280, 560, 1120. */
int g4_image_soft_tokens_supported(int max_soft_tokens);

/* transformers' get_aspect_ratio_preserving_size with
 * max_patches = max_soft_tokens * pool^2: the largest multiples of patch*pool
 * with at most max_patches patches, keeping the aspect ratio; a side that
 * would round to 0 becomes patch*pool and the other side
 * floor(long/short) * patch*pool, capped at (max_patches / pool^2) * patch*pool.
 * Fails (as the reference raises) when both sides round to 0 or the result
 * exceeds the budget. */
g4_status g4_image_target_size(int height, int width, int patch, int pool, int max_soft_tokens,
                               int *target_height, int *target_width);

/* Soft tokens an height x width image becomes: (th/48) * (tw/48). Fails for
 * an unsupported budget or an invalid size. */
g4_status g4_image_soft_token_count(int height, int width, int max_soft_tokens, int *count);

/* Cuts img (both sides multiples of patch) into patches, rescaled by 1/255
 * with the rounding of `backend`'s processor (PIL, PIL12: float32(v * (1/255.0));
 * torchvision: float32(v) * float32(1/255)). Writes max_rows rows of
 * patch*patch*3 floats and (x, y) pairs; rows past the image are zero with
 * position (-1, -1). Fails when the image has more than max_rows patches. */
g4_status g4_image_to_patches(const g4_image *img, int patch, int max_rows, g4_image_backend backend,
                              float *pixel_values, int32_t *positions, int *n_valid);

typedef struct {
    float *pixel_values;  /* [rows][row_len] */
    int32_t *positions;   /* [rows][2]: (x, y) of each patch, (-1, -1) on padding rows */
    int rows;             /* Gemma 4: 9 * max_soft_tokens; unified: max_soft_tokens */
    int row_len;          /* patch * patch * 3: 768, or 6912 for the unified embedder */
    int n_valid;          /* rows holding image patches */
    int n_soft_tokens;    /* (th/48) * (tw/48): the image's placeholder tokens */
    int width, height;    /* the resized image */
} g4_image_patches;

/* Gemma 4 vision tower input (Gemma4ImageProcessor / Gemma4ImageProcessorPil):
 * 16-px patches, padded to 9 * max_soft_tokens rows. */
g4_status g4_image_preprocess_gemma4(const g4_image *img, int max_soft_tokens, g4_image_backend backend,
                                     g4_image_patches *out);
/* Gemma 4 12B unified embedder input (Gemma4UnifiedImageProcessor, which only
 * exists with the torchvision backend): same resize, 48-px patches, padded to
 * max_soft_tokens rows. */
g4_status g4_image_preprocess_unified(const g4_image *img, int max_soft_tokens, g4_image_backend backend,
                                      g4_image_patches *out);
void g4_image_patches_free(g4_image_patches *p);

#endif
