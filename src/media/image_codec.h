/* Per-format decoders behind g4_image_decode_memory. Each one produces the
 * RGB that PIL's `.convert("RGB")` gives for that file and reports the
 * orientation PIL's `getexif()` would find (1 when there is none). */
#ifndef G4_MEDIA_IMAGE_CODEC_H
#define G4_MEDIA_IMAGE_CODEC_H

#include "media/image.h"

g4_status g4_png_decode(const uint8_t *data, size_t size, uint64_t max_pixels,
                        g4_image *out, int *orientation);
g4_status g4_jpeg_decode(const uint8_t *data, size_t size, uint64_t max_pixels,
                         g4_image *out, int *orientation);
g4_status g4_webp_decode(const uint8_t *data, size_t size, uint64_t max_pixels,
                         g4_image *out, int *orientation);

/* Refuses a header size that is zero or over the pixel limit, before any
 * pixel buffer exists. `format` names the file kind in the message. */
g4_status g4_image_check_size(const char *format, uint64_t width, uint64_t height,
                              uint64_t max_pixels);

#endif
