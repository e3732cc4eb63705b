/* Format detection, limits and dispatch to the per-format decoders; then the
 * EXIF orientation, as transformers' load_image applies it. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "media/image.h"
#include "media/image_codec.h"
#include "media/image_orientation.h"

g4_status g4_image_alloc(g4_image *img, int width, int height) {
    img->width = img->height = 0;
    img->rgb = NULL;
    if (width <= 0 || height <= 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image: invalid size %dx%d", width, height);
    img->rgb = malloc((size_t)width * (size_t)height * 3);
    if (!img->rgb) return g4_fail(G4_ERR_OUT_OF_MEMORY, "image: out of memory for %dx%d pixels", width, height);
    img->width = width;
    img->height = height;
    return G4_OK;
}

void g4_image_free(g4_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

g4_image_format g4_image_detect_format(const void *data, size_t size) {
    const uint8_t *p = data;
    if (!p) return G4_IMAGE_FORMAT_UNKNOWN;
    if (size >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) return G4_IMAGE_FORMAT_PNG;
    if (size >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return G4_IMAGE_FORMAT_JPEG;
    if (size >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4)) return G4_IMAGE_FORMAT_WEBP;
    if (size >= 6 && (!memcmp(p, "GIF87a", 6) || !memcmp(p, "GIF89a", 6))) return G4_IMAGE_FORMAT_GIF;
    if (size >= 2 && p[0] == 'B' && p[1] == 'M') return G4_IMAGE_FORMAT_BMP;
    return G4_IMAGE_FORMAT_UNKNOWN;
}

const char *g4_image_format_name(g4_image_format format) {
    switch (format) {
    case G4_IMAGE_FORMAT_PNG: return "PNG";
    case G4_IMAGE_FORMAT_JPEG: return "JPEG";
    case G4_IMAGE_FORMAT_WEBP: return "WebP";
    case G4_IMAGE_FORMAT_GIF: return "GIF";
    case G4_IMAGE_FORMAT_BMP: return "BMP";
    default: return "unknown";
    }
}

g4_status g4_image_check_size(const char *format, uint64_t width, uint64_t height, uint64_t max_pixels) {
    if (width == 0 || height == 0)
        return g4_fail(G4_ERR_FORMAT, "%s image: header declares an empty image (%llux%llu)", format,
                       (unsigned long long)width, (unsigned long long)height);
    if (width > INT32_MAX / 4 || height > INT32_MAX / 4 || width * height > max_pixels)
        return g4_fail(G4_ERR_LIMIT,
                       "%s image: %llux%llu pixels exceeds the limit of %llu pixels (possible decompression bomb)",
                       format, (unsigned long long)width, (unsigned long long)height,
                       (unsigned long long)max_pixels);
    return G4_OK;
}

g4_status g4_image_decode_memory(const void *data, size_t size, const g4_image_decode_options *options,
                                 g4_image *out) {
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!data || size == 0) return g4_fail(G4_ERR_FORMAT, "image: empty input (0 bytes)");
    if (size > G4_IMAGE_MAX_INPUT_BYTES)
        return g4_fail(G4_ERR_LIMIT, "image: %zu bytes of encoded data exceeds the limit of %zu", size,
                       G4_IMAGE_MAX_INPUT_BYTES);
    uint64_t max_pixels = options && options->max_pixels ? options->max_pixels : G4_IMAGE_DEFAULT_MAX_PIXELS;
    int orientation = 1;
    g4_status st;
    g4_image_format format = g4_image_detect_format(data, size);
    switch (format) {
    case G4_IMAGE_FORMAT_PNG: st = g4_png_decode(data, size, max_pixels, out, &orientation); break;
    case G4_IMAGE_FORMAT_JPEG: st = g4_jpeg_decode(data, size, max_pixels, out, &orientation); break;
    case G4_IMAGE_FORMAT_WEBP: st = g4_webp_decode(data, size, max_pixels, out, &orientation); break;
    case G4_IMAGE_FORMAT_GIF:
    case G4_IMAGE_FORMAT_BMP:
        return g4_fail(G4_ERR_UNSUPPORTED, "image: %s is not supported (use PNG, JPEG or WebP)",
                       g4_image_format_name(format));
    default:
        return g4_fail(G4_ERR_FORMAT, "image: unrecognised format (not PNG, JPEG or WebP; first bytes %02x %02x %02x %02x)",
                       ((const uint8_t *)data)[0], size > 1 ? ((const uint8_t *)data)[1] : 0,
                       size > 2 ? ((const uint8_t *)data)[2] : 0, size > 3 ? ((const uint8_t *)data)[3] : 0);
    }
    if (st != G4_OK) {
        g4_image_free(out);
        return st;
    }
    if (!(options && options->keep_orientation)) {
        st = g4_image_apply_orientation(out, orientation);
        if (st != G4_OK) g4_image_free(out);
    }
    return st;
}

g4_status g4_image_decode_file(const char *path, const g4_image_decode_options *options, g4_image *out) {
    out->width = out->height = 0;
    out->rgb = NULL;
    g4_mapped_file f;
    g4_status st = g4_map_file(path, &f);
    if (st != G4_OK) return st;
    st = g4_image_decode_memory(f.data, f.size, options, out);
    g4_unmap_file(&f);
    if (st != G4_OK) return g4_fail_context(st, "%s", path);
    return G4_OK;
}

static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62; /* '-' and '_': the URL-safe alphabet */
    if (c == '/' || c == '_') return 63;
    return -1;
}

g4_status g4_image_decode_data_uri(const char *uri, size_t len, const g4_image_decode_options *options,
                                   g4_image *out) {
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!uri) return g4_fail(G4_ERR_INVALID_ARGUMENT, "image data URI: NULL");
    const char *p = uri, *end = uri + len;
    if (len >= 5 && !memcmp(uri, "data:", 5)) {
        const char *comma = memchr(uri, ',', len);
        if (!comma) return g4_fail(G4_ERR_FORMAT, "image data URI: no ',' before the data");
        /* Only base64 payloads carry binary images. */
        size_t head = (size_t)(comma - uri);
        if (head < 7 || memcmp(comma - 7, ";base64", 7))
            return g4_fail(G4_ERR_UNSUPPORTED, "image data URI: only ';base64' data is supported");
        p = comma + 1;
    }
    uint8_t *bytes = malloc((size_t)(end - p) / 4 * 3 + 3);
    if (!bytes) return g4_fail(G4_ERR_OUT_OF_MEMORY, "image data URI: out of memory");
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0, padding = 0;
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        if (c == '=') {
            padding++;
            continue;
        }
        int v = base64_value(c);
        if (v < 0 || padding) {
            free(bytes);
            return g4_fail(G4_ERR_FORMAT, "image data URI: invalid base64 character '%c' at offset %zu",
                           c >= 32 && c < 127 ? c : '?', (size_t)(p - uri));
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            bytes[n++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6) {
        free(bytes);
        return g4_fail(G4_ERR_FORMAT, "image data URI: truncated base64 data");
    }
    g4_status st = g4_image_decode_memory(bytes, n, options, out);
    free(bytes);
    if (st != G4_OK) return g4_fail_context(st, "image data URI");
    return G4_OK;
}
