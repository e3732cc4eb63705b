#include "media/image_orientation.h"

#include <stdlib.h>
#include <string.h>

static unsigned read16(const uint8_t *p, int big_endian) {
    return big_endian ? (unsigned)(p[0] << 8 | p[1]) : (unsigned)(p[1] << 8 | p[0]);
}

static uint32_t read32(const uint8_t *p, int big_endian) {
    return big_endian ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
                      : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

int g4_exif_orientation(const uint8_t *exif, size_t size) {
    if (!exif) return 0;
    if (size >= 6 && !memcmp(exif, "Exif\0\0", 6)) {
        exif += 6;
        size -= 6;
    }
    if (size < 8) return 0;
    int big;
    if (!memcmp(exif, "II*\0", 4)) big = 0;
    else if (!memcmp(exif, "MM\0*", 4)) big = 1;
    else return 0;
    uint32_t ifd = read32(exif + 4, big);
    if (ifd > size || size - ifd < 2) return 0;
    unsigned count = read16(exif + ifd, big);
    const uint8_t *entry = exif + ifd + 2;
    for (unsigned i = 0; i < count; i++, entry += 12) {
        if ((size_t)(entry - exif) + 12 > size) return 0;
        if (read16(entry, big) != 0x0112) continue;
        unsigned type = read16(entry + 2, big);
        uint32_t n = read32(entry + 4, big);
        if (n != 1) return 0; /* PIL would hold a tuple, which maps to no transpose */
        /* A single integer value sits in the first bytes of the value field. */
        switch (type) {
        case 1: case 6: return (int)(type == 6 ? (int8_t)entry[8] : entry[8]);        /* BYTE, SBYTE */
        case 3: return (int)read16(entry + 8, big);                                   /* SHORT */
        case 8: return (int)(int16_t)read16(entry + 8, big);                          /* SSHORT */
        case 4: case 9: {                                                             /* LONG, SLONG */
            uint32_t v = read32(entry + 8, big);
            return v <= 8 ? (int)v : 0;
        }
        default: return 0;
        }
    }
    return 0;
}

int g4_xmp_orientation(const uint8_t *xmp, size_t size) {
    static const char key[] = "tiff:Orientation";
    const size_t k = sizeof key - 1;
    if (!xmp) return 0;
    for (size_t i = 0; i + k + 1 < size; i++) {
        if (memcmp(xmp + i, key, k)) continue;
        const uint8_t *p = xmp + i + k;
        size_t left = size - i - k;
        if (left >= 3 && p[0] == '=' && p[1] == '"' && p[2] >= '0' && p[2] <= '9') return p[2] - '0';
        if (left >= 2 && p[0] == '>' && p[1] >= '0' && p[1] <= '9') return p[1] - '0';
    }
    return 0;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

uint8_t *g4_raw_profile_exif(const char *text, size_t size, size_t *out_size) {
    /* "\nexif\n      NNN\nHEX..." : PIL drops the first three lines. */
    size_t pos = 0;
    for (int lines = 0; lines < 3; lines++) {
        const char *nl = memchr(text + pos, '\n', size - pos);
        if (!nl) return NULL;
        pos = (size_t)(nl - text) + 1;
    }
    uint8_t *out = malloc((size - pos) / 2 + 1);
    if (!out) return NULL;
    size_t n = 0;
    int high = -1;
    for (; pos < size; pos++) {
        char c = text[pos];
        if (c == '\n' || c == ' ' || c == '\t' || c == '\r') continue;
        int v = hex_value(c);
        if (v < 0) {
            free(out);
            return NULL;
        }
        if (high < 0) {
            high = v;
        } else {
            out[n++] = (uint8_t)(high << 4 | v);
            high = -1;
        }
    }
    if (high >= 0 || n == 0) {
        free(out);
        return NULL;
    }
    *out_size = n;
    return out;
}

g4_status g4_image_apply_orientation(g4_image *img, int orientation) {
    if (orientation < 2 || orientation > 8) return G4_OK;
    const int w = img->width, h = img->height;
    const int swap = orientation >= 5; /* 5..8 exchange width and height */
    const int ow = swap ? h : w, oh = swap ? w : h;
    uint8_t *dst = malloc((size_t)w * h * 3);
    if (!dst) return g4_fail(G4_ERR_OUT_OF_MEMORY, "image orientation: out of memory for %dx%d", w, h);
    for (int y = 0; y < oh; y++) {
        for (int x = 0; x < ow; x++) {
            int sx, sy; /* source pixel of output (x, y) */
            switch (orientation) {
            case 2: sx = w - 1 - x; sy = y; break;             /* FLIP_LEFT_RIGHT */
            case 3: sx = w - 1 - x; sy = h - 1 - y; break;     /* ROTATE_180 */
            case 4: sx = x; sy = h - 1 - y; break;             /* FLIP_TOP_BOTTOM */
            case 5: sx = y; sy = x; break;                     /* TRANSPOSE */
            case 6: sx = y; sy = h - 1 - x; break;             /* ROTATE_270 (clockwise 90) */
            case 7: sx = w - 1 - y; sy = h - 1 - x; break;     /* TRANSVERSE */
            default: sx = w - 1 - y; sy = x; break;            /* 8: ROTATE_90 (counter-clockwise) */
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, img->rgb + ((size_t)sy * w + sx) * 3, 3);
        }
    }
    free(img->rgb);
    img->rgb = dst;
    img->width = ow;
    img->height = oh;
    return G4_OK;
}
