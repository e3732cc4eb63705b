/* EXIF orientation, found where PIL's Image.getexif() looks for it, and
 * applied as PIL.ImageOps.exif_transpose applies it. */
#ifndef G4_MEDIA_IMAGE_ORIENTATION_H
#define G4_MEDIA_IMAGE_ORIENTATION_H

#include <stddef.h>
#include <stdint.h>

#include "media/image.h"

/* The Orientation tag (0x0112) of IFD0 in an EXIF block (a TIFF stream,
 * optionally preceded by "Exif\0\0"). 0 when the tag is absent or the
 * block is malformed; otherwise the tag's value. */
int g4_exif_orientation(const uint8_t *exif, size_t size);

/* The first `tiff:Orientation="D"` or `tiff:Orientation>D` in XMP text
 * (PIL's regular expression); 0 when there is none. */
int g4_xmp_orientation(const uint8_t *xmp, size_t size);

/* The EXIF block that a PNG "Raw profile type exif" text holds (ImageMagick
 * writes it: three header lines, then hex). Returns a malloc'd buffer and its
 * size in *out_size, or NULL when the text is not that. */
uint8_t *g4_raw_profile_exif(const char *text, size_t size, size_t *out_size);

/* Transposes img in place for orientation 2..8 (other values leave it alone):
 * 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90 clockwise,
 * 7 transverse, 8 rotate 90 counter-clockwise — PIL's exif_transpose table. */
g4_status g4_image_apply_orientation(g4_image *img, int orientation);

#endif
