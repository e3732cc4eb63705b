/* Antialiased bicubic resize of 8-bit RGB, bit-exact with the two resizers
 * the Gemma 4 image processors use:
 *   G4_IMAGE_BACKEND_PIL          PIL.Image.resize(size, BICUBIC)
 *                                 (Gemma4ImageProcessorPil)
 *   G4_IMAGE_BACKEND_TORCHVISION  torchvision resize(BICUBIC, antialias=True) on
 *                                 a uint8 tensor, i.e. PyTorch's CPU uint8 kernel
 *                                 (Gemma4ImageProcessor, Gemma4UnifiedImageProcessor)
 * Both are separable Keys cubics (a = -0.5) whose support widens by the
 * downscale factor, with double weights rounded to fixed point, horizontal
 * pass first (but see below) and an 8-bit intermediate image. They differ in
 * the cubic's evaluation order and the fixed-point precision (PIL: 22 bits in
 * int32; PyTorch: int16 weights at the largest precision the axis's largest
 * weight allows), so their outputs differ by 1 in a few pixels.
 * Pass order: Pillow 13 runs the vertical pass first when the height shrinks
 * by more than twice as many pixels as the width; Pillow 12 only when the
 * image is over 100 times taller than wide (G4_IMAGE_BACKEND_PIL12; the
 * fixtures' reference machine runs Pillow 12.3). The two differ by a level or
 * two, in a few pixels, for the downscales where only one runs vertical first. */
#ifndef G4_MEDIA_IMAGE_RESIZE_H
#define G4_MEDIA_IMAGE_RESIZE_H

#include "media/image.h"

typedef enum {
    G4_IMAGE_BACKEND_PIL = 0,         /* Pillow 13 and later */
    G4_IMAGE_BACKEND_TORCHVISION = 1, /* torchvision / PyTorch CPU uint8 kernel */
    G4_IMAGE_BACKEND_PIL12 = 2,       /* Pillow 12 (its pass order; otherwise the same) */
} g4_image_backend;

/* out receives a new width x height image (free with g4_image_free). When
 * the size is unchanged the pixels are copied, as both references do. */
g4_status g4_image_resize_bicubic(const g4_image *src, int width, int height, g4_image_backend backend,
                                  g4_image *out);

#endif
