#include "base/base64.h"

#include <stdlib.h>

static int sextet(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

g4_status g4_base64_decode(const char *text, size_t len, size_t max_out, const char *what, unsigned char **out,
                           size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    size_t bound = len / 4 * 3 + 3;
    if (max_out && len / 4 * 3 > max_out + 3)
        return g4_fail(G4_ERR_LIMIT, "%s: decoded data would exceed %zu bytes", what, max_out);
    unsigned char *buf = malloc(bound ? bound : 1);
    if (!buf) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", what, bound);
    size_t n = 0, pad = 0;
    unsigned acc = 0;
    int bits = 0, count = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (is_space(c)) continue;
        if (c == '=') {
            pad++;
            continue;
        }
        int v = sextet(c);
        if (v < 0 || pad) {
            free(buf);
            if (v < 0)
                return c >= 0x20 && c < 0x7f
                           ? g4_fail(G4_ERR_FORMAT, "%s: invalid base64 character '%c' at offset %zu", what, c, i)
                           : g4_fail(G4_ERR_FORMAT, "%s: invalid base64 byte 0x%02x at offset %zu", what, c, i);
            return g4_fail(G4_ERR_FORMAT, "%s: base64 data continues after '=' padding (offset %zu)", what, i);
        }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        count++;
        if (bits >= 8) {
            bits -= 8;
            buf[n++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (count % 4 == 1 || pad > 2 || (pad && (count + pad) % 4 != 0)) {
        free(buf);
        return g4_fail(G4_ERR_FORMAT, "%s: truncated base64 data (%d characters)", what, count);
    }
    if (max_out && n > max_out) {
        free(buf);
        return g4_fail(G4_ERR_LIMIT, "%s: decoded data exceeds %zu bytes", what, max_out);
    }
    *out = buf;
    *out_len = n;
    return G4_OK;
}
