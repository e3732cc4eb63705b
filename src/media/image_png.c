/* PNG through libspng, converted to RGB as PIL does: PIL opens 16-bit colour
 * channels by their high byte ("RGB;16B"), 16-bit grey as mode I;16 (whose
 * RGB conversion clips to 255), 1/2/4-bit grey scaled to 0..255, palette
 * images through PLTE, and `.convert("RGB")` drops alpha and tRNS. */
#include <spng.h>
#include <stdlib.h>
#include <string.h>

#include "media/image_codec.h"
#include "media/image_orientation.h"

/* Memory for ancillary chunks kept by libspng (text, EXIF...). */
#define PNG_CHUNK_CACHE_LIMIT ((size_t)64 << 20)

static g4_status spng_error(const char *what, int err) {
    return g4_fail(err == SPNG_IO_EOF || err == SPNG_IO_ERROR ? G4_ERR_FORMAT : G4_ERR_FORMAT,
                   "PNG image: %s: %s", what,
                   err == SPNG_IO_EOF ? "file is truncated" : spng_strerror(err));
}

/* Sample x of a row holding `depth`-bit samples (1, 2, 4, 8; 16 reads the
 * high byte and the caller handles the low one). */
static unsigned packed_sample(const uint8_t *row, size_t x, int depth) {
    if (depth == 8) return row[x];
    if (depth == 16) return row[x * 2];
    size_t bit = x * (size_t)depth;
    unsigned byte = row[bit / 8];
    unsigned shift = 8 - (unsigned)depth - (unsigned)(bit % 8);
    return (byte >> shift) & ((1u << depth) - 1);
}

static void convert_row(const struct spng_ihdr *h, const struct spng_plte *plte, const uint8_t *in,
                        uint8_t *out) {
    const size_t w = h->width;
    const int d = h->bit_depth;
    switch (h->color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
        for (size_t x = 0; x < w; x++) {
            unsigned v;
            if (d == 16) v = in[2 * x] ? 255 : in[2 * x + 1]; /* I;16 -> RGB clips */
            else v = packed_sample(in, x, d) * (255u / ((1u << d) - 1));
            out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = (uint8_t)v;
        }
        break;
    case SPNG_COLOR_TYPE_TRUECOLOR: {
        const size_t step = d == 16 ? 6 : 3, lane = d == 16 ? 2 : 1;
        for (size_t x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) out[3 * x + c] = in[x * step + c * lane];
        break;
    }
    case SPNG_COLOR_TYPE_INDEXED:
        for (size_t x = 0; x < w; x++) {
            unsigned i = packed_sample(in, x, d);
            /* Indices past the PLTE entries come out black in PIL. */
            if (i < plte->n_entries) {
                out[3 * x] = plte->entries[i].red;
                out[3 * x + 1] = plte->entries[i].green;
                out[3 * x + 2] = plte->entries[i].blue;
            } else {
                out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = 0;
            }
        }
        break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: {
        const size_t step = d == 16 ? 4 : 2;
        for (size_t x = 0; x < w; x++) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x * step];
        break;
    }
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: {
        const size_t step = d == 16 ? 8 : 4, lane = d == 16 ? 2 : 1;
        for (size_t x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) out[3 * x + c] = in[x * step + c * lane];
        break;
    }
    }
}

static int text_orientation(spng_ctx *ctx, int *from_exif) {
    uint32_t n = 0;
    *from_exif = 0;
    if (spng_get_text(ctx, NULL, &n) || n == 0) return 0;
    struct spng_text *texts = calloc(n, sizeof *texts);
    if (!texts) return 0;
    int exif_orientation = 0, xmp_orientation = 0, have_raw_exif = 0;
    if (!spng_get_text(ctx, texts, &n)) {
        for (uint32_t i = 0; i < n; i++) {
            if (!strcmp(texts[i].keyword, "Raw profile type exif") && !have_raw_exif) {
                size_t len = 0;
                uint8_t *exif = g4_raw_profile_exif(texts[i].text, texts[i].length, &len);
                have_raw_exif = exif != NULL;
                if (exif) exif_orientation = g4_exif_orientation(exif, len);
                free(exif);
            } else if (!strcmp(texts[i].keyword, "XML:com.adobe.xmp") && !xmp_orientation) {
                xmp_orientation = g4_xmp_orientation((const uint8_t *)texts[i].text, texts[i].length);
            }
        }
    }
    free(texts);
    *from_exif = have_raw_exif && exif_orientation;
    return exif_orientation ? exif_orientation : xmp_orientation;
}

/* PIL's order: the eXIf chunk, else a "Raw profile type exif" text; the
 * XMP tiff:Orientation only when that EXIF has no Orientation tag. */
static int png_orientation(spng_ctx *ctx) {
    struct spng_exif exif;
    int from_exif;
    if (!spng_get_exif(ctx, &exif)) {
        int o = g4_exif_orientation((const uint8_t *)exif.data, exif.length);
        if (o) return o;
        int t = text_orientation(ctx, &from_exif);
        return from_exif ? 0 : t; /* a raw-profile EXIF is not read when eXIf exists */
    }
    return text_orientation(ctx, &from_exif);
}

g4_status g4_png_decode(const uint8_t *data, size_t size, uint64_t max_pixels, g4_image *out, int *orientation) {
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return g4_fail(G4_ERR_OUT_OF_MEMORY, "PNG image: out of memory");
    g4_status st = G4_OK;
    uint8_t *raw = NULL;
    struct spng_ihdr ihdr;
    struct spng_plte plte = {0};
    int err;
    spng_set_crc_action(ctx, SPNG_CRC_ERROR, SPNG_CRC_ERROR);
    spng_set_chunk_limits(ctx, PNG_CHUNK_CACHE_LIMIT, PNG_CHUNK_CACHE_LIMIT);
    if ((err = spng_set_png_buffer(ctx, data, size)) || (err = spng_get_ihdr(ctx, &ihdr))) {
        st = spng_error("reading the header", err);
        goto done;
    }
    if ((st = g4_image_check_size("PNG", ihdr.width, ihdr.height, max_pixels)) != G4_OK) goto done;
    if (ihdr.color_type == SPNG_COLOR_TYPE_INDEXED && (err = spng_get_plte(ctx, &plte))) {
        st = spng_error("palette image without a usable PLTE chunk", err);
        goto done;
    }
    size_t len;
    if ((err = spng_decoded_image_size(ctx, SPNG_FMT_RAW, &len))) {
        st = spng_error("sizing the image", err);
        goto done;
    }
    raw = malloc(len);
    if (!raw) {
        st = g4_fail(G4_ERR_OUT_OF_MEMORY, "PNG image: out of memory for %u x %u", ihdr.width, ihdr.height);
        goto done;
    }
    if ((err = spng_decode_image(ctx, raw, len, SPNG_FMT_RAW, 0))) {
        st = spng_error("decoding the pixels", err);
        goto done;
    }
    if ((st = g4_image_alloc(out, (int)ihdr.width, (int)ihdr.height)) != G4_OK) goto done;
    const size_t stride = len / ihdr.height;
    for (uint32_t y = 0; y < ihdr.height; y++)
        convert_row(&ihdr, &plte, raw + y * stride, out->rgb + (size_t)y * ihdr.width * 3);
    *orientation = png_orientation(ctx);
done:
    free(raw);
    spng_ctx_free(ctx);
    return st;
}
