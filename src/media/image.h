/* Images for the vision towers: decoding PNG, JPEG and WebP bytes into 8-bit
 * RGB with the semantics of transformers' `load_image` (PIL opens the file,
 * `ImageOps.exif_transpose` applies the EXIF orientation, `.convert("RGB")`
 * drops alpha and expands grey/palette/CMYK). Every image a chat request
 * names by path, URL or base64 goes through `load_image` (the processors'
 * fetch_images), so this is what the reference feeds its image processor;
 * the processor's own convert_to_rgb then sees RGB and changes nothing.
 * (Only a PIL image with alpha handed straight to the processor differs:
 * transformers >= 5.24 composites it onto white, 5.17 drops alpha.)
 * Where PIL looks for the orientation: JPEG APP1 Exif (else XMP
 * tiff:Orientation), PNG eXIf (else a "Raw profile type exif" text, else
 * XMP), WebP EXIF (else XMP). PIL decodes with the same libraries (libjpeg-
 * turbo with the default accurate IDCT and fancy upsampling, libwebp's
 * animation decoder) and we reproduce its PNG and CMYK conversions, so the
 * pixels are bit-exact (tests/unit/test_image_decode.c). A malformed EXIF
 * block is ignored here, where PIL's exif_transpose would raise. */
#ifndef G4_MEDIA_IMAGE_H
#define G4_MEDIA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* rgb holds height rows of width pixels, 3 bytes each (R, G, B), top row first. */
typedef struct {
    int width, height;
    uint8_t *rgb;
} g4_image;

typedef enum {
    G4_IMAGE_FORMAT_UNKNOWN = 0,
    G4_IMAGE_FORMAT_PNG,
    G4_IMAGE_FORMAT_JPEG,
    G4_IMAGE_FORMAT_WEBP,
    G4_IMAGE_FORMAT_GIF, /* recognised only to name it in the error */
    G4_IMAGE_FORMAT_BMP, /* recognised only to name it in the error */
} g4_image_format;

/* PIL's Image.MAX_IMAGE_PIXELS: larger images make PIL warn of a
 * decompression bomb; we refuse them (from the header, before allocating). */
#define G4_IMAGE_DEFAULT_MAX_PIXELS 89478485ull
/* Bytes of encoded input we accept at all. */
#define G4_IMAGE_MAX_INPUT_BYTES ((size_t)256 << 20)

typedef struct {
    uint64_t max_pixels;    /* width*height limit; 0 = G4_IMAGE_DEFAULT_MAX_PIXELS */
    int keep_orientation;   /* 1: ignore EXIF/XMP orientation (default 0: apply it) */
} g4_image_decode_options;

/* Allocates an uninitialised width x height image (both > 0). */
g4_status g4_image_alloc(g4_image *img, int width, int height);
void g4_image_free(g4_image *img);

/* The format from the first bytes (magic numbers), never from a file name. */
g4_image_format g4_image_detect_format(const void *data, size_t size);
const char *g4_image_format_name(g4_image_format format);

/* Decodes one image. `options` may be NULL (defaults). Refuses empty,
 * truncated or corrupt data, unsupported formats and images over the pixel
 * limit with a message naming the problem. On failure *out is zeroed. */
g4_status g4_image_decode_memory(const void *data, size_t size,
                                 const g4_image_decode_options *options, g4_image *out);
g4_status g4_image_decode_file(const char *path, const g4_image_decode_options *options,
                               g4_image *out);
/* Decodes a `data:image/...;base64,....` URI (or bare base64 text, as
 * transformers' load_image accepts). ASCII whitespace inside is skipped. */
g4_status g4_image_decode_data_uri(const char *uri, size_t len,
                                   const g4_image_decode_options *options, g4_image *out);

#endif
