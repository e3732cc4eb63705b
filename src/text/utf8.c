#include "text/utf8.h"

#include <stdlib.h>
#include <string.h>

size_t g4_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

size_t g4_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int g4_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) { /* eight ASCII bytes at a time */
            uint64_t v;
            memcpy(&v, p + i, 8);
            if (!(v & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = g4_utf8_decode(p + i, n - i, &cp);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* Length of the longest prefix of s that could start a valid sequence (the
 * "maximal subpart" of an ill-formed sequence, at least 1). */
static size_t invalid_prefix_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t want;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) want = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        want = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        want = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 1;
    size_t i = 1;
    if (i < n && i < want && s[i] >= lo && s[i] <= hi) i++;
    else return 1;
    while (i < n && i < want && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

char *g4_utf8_repair(const char *s, size_t n, size_t *out_len) {
    const unsigned char *p = (const unsigned char *)s;
    char *out = malloc(n * 3 + 1); /* each bad byte grows to at most 3 bytes */
    if (!out) return NULL;
    size_t i = 0, o = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            out[o++] = (char)p[i++];
            continue;
        }
        uint32_t cp;
        size_t k = g4_utf8_decode(p + i, n - i, &cp);
        if (k) {
            memcpy(out + o, p + i, k);
            o += k, i += k;
        } else {
            i += invalid_prefix_len(p + i, n - i);
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

int g4_unicode_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}
