#include "text/json_scan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/utf8.h"

void g4_json_scan_init(g4_json_scan *s, const char *data, size_t len, const char *label) {
    s->begin = s->p = data;
    s->end = data + len;
    s->label = label ? label : "json";
}

g4_status g4_json_error(g4_json_scan *s, const char *what) {
    if (s->p >= s->end) return g4_fail(G4_ERR_FORMAT, "%s: %s (the JSON ends early: truncated file?)", s->label, what);
    return g4_fail(G4_ERR_FORMAT, "%s: byte %zu: %s", s->label, (size_t)(s->p - s->begin), what);
}

int g4_json_peek(g4_json_scan *s) {
    while (s->p < s->end) {
        char c = *s->p;
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return (unsigned char)c;
        s->p++;
    }
    return -1;
}

g4_status g4_json_expect(g4_json_scan *s, char c) {
    if (g4_json_peek(s) != (unsigned char)c) {
        char what[32];
        snprintf(what, sizeof what, "expected '%c'", c);
        return g4_json_error(s, what);
    }
    s->p++;
    return G4_OK;
}

static int hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        x = x * 16 + (uint32_t)d;
    }
    *v = x;
    return 1;
}

g4_status g4_json_string(g4_json_scan *s, g4_strbuf *scratch, const char **out, size_t *len) {
    if (g4_json_peek(s) != '"') return g4_json_error(s, "expected a string");
    const char *start = ++s->p, *p = start;
    while (p < s->end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
    if (p < s->end && *p == '"') { /* no escapes: point into the text */
        *out = start;
        *len = (size_t)(p - start);
        s->p = p + 1;
        return G4_OK;
    }
    g4_strbuf_clear(scratch);
    if (!g4_strbuf_append(scratch, start, (size_t)(p - start))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "json string");
    while (p < s->end && *p != '"') {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20) {
            s->p = p;
            return g4_json_error(s, "control character inside a string");
        }
        if (c != '\\') {
            const char *q = p;
            while (q < s->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
            if (!g4_strbuf_append(scratch, p, (size_t)(q - p))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "json string");
            p = q;
            continue;
        }
        if (p + 1 >= s->end) break;
        char e = p[1], ch;
        p += 2;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (s->end - p < 4 || !hex4(p, &cp)) {
                s->p = p;
                return g4_json_error(s, "bad \\u escape");
            }
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                s->p = p;
                return g4_json_error(s, "lone low surrogate in \\u escape");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (s->end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    s->p = p;
                    return g4_json_error(s, "lone high surrogate in \\u escape");
                }
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            char u[4];
            size_t k = g4_utf8_encode(cp, u);
            if (!g4_strbuf_append(scratch, u, k)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "json string");
            continue;
        }
        default:
            s->p = p - 1;
            return g4_json_error(s, "bad escape in a string");
        }
        if (!g4_strbuf_push(scratch, ch)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "json string");
    }
    if (p >= s->end) {
        s->p = s->end;
        return g4_json_error(s, "unterminated string");
    }
    s->p = p + 1;
    *out = scratch->data ? scratch->data : "";
    *len = scratch->len;
    return G4_OK;
}

g4_status g4_json_int(g4_json_scan *s, int64_t *v) {
    int c = g4_json_peek(s);
    const char *p = s->p;
    int neg = 0;
    if (c == '-') neg = 1, p++;
    if (p >= s->end || *p < '0' || *p > '9') return g4_json_error(s, "expected an integer");
    int64_t x = 0;
    while (p < s->end && *p >= '0' && *p <= '9') {
        if (x > (INT64_MAX - 9) / 10) return g4_json_error(s, "integer too large");
        x = x * 10 + (*p++ - '0');
    }
    if (p < s->end && (*p == '.' || *p == 'e' || *p == 'E')) return g4_json_error(s, "expected an integer, found a fraction");
    s->p = p;
    *v = neg ? -x : x;
    return G4_OK;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Length of the literal or number at p (JSON grammar), 0 if there is none. */
static size_t scalar_len(const char *p, const char *end) {
    static const char *const literals[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(literals[i]);
        if ((size_t)(end - p) >= n && !memcmp(p, literals[i], n)) return n;
    }
    const char *q = p;
    if (q < end && *q == '-') q++;
    if (q >= end || !is_digit(*q)) return 0;
    if (*q == '0') q++;
    else
        while (q < end && is_digit(*q)) q++;
    if (q < end && *q == '.') {
        if (++q >= end || !is_digit(*q)) return 0;
        while (q < end && is_digit(*q)) q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        if (++q < end && (*q == '+' || *q == '-')) q++;
        if (q >= end || !is_digit(*q)) return 0;
        while (q < end && is_digit(*q)) q++;
    }
    return (size_t)(q - p);
}

g4_status g4_json_skip(g4_json_scan *s, const char **start, size_t *len) {
    int c = g4_json_peek(s);
    if (c < 0) return g4_json_error(s, "expected a value");
    const char *p = s->p;
    *start = p;
    int depth = 0;
    do {
        if (p >= s->end) {
            s->p = p;
            return g4_json_error(s, "unterminated value");
        }
        char ch = *p;
        if (ch == '"') {
            /* the closing quote is the first one preceded by an even number of backslashes */
            for (p++;; p++) {
                p = p < s->end ? memchr(p, '"', (size_t)(s->end - p)) : NULL;
                if (!p) {
                    s->p = s->end;
                    return g4_json_error(s, "unterminated string");
                }
                const char *b = p;
                while (b[-1] == '\\') b--;
                if (((p - b) & 1) == 0) break;
            }
            p++;
        } else if (ch == '{' || ch == '[') {
            depth++, p++;
        } else if (ch == '}' || ch == ']') {
            if (depth == 0) {
                s->p = p;
                return g4_json_error(s, "unexpected closing bracket");
            }
            depth--, p++;
        } else if (depth == 0) { /* a bare scalar: number or literal, checked */
            size_t n = scalar_len(p, s->end);
            if (!n) {
                s->p = p;
                return g4_json_error(s, "expected a value");
            }
            p += n;
        } else {
            p++;
        }
    } while (depth > 0);
    s->p = p;
    *len = (size_t)(p - *start);
    return G4_OK;
}

g4_status g4_json_next_member(g4_json_scan *s, int *first, int *done, g4_strbuf *scratch,
                              const char **key, size_t *key_len) {
    int c = g4_json_peek(s);
    if (c == '}') {
        s->p++;
        *done = 1;
        return G4_OK;
    }
    if (!*first) {
        if (c != ',') return g4_json_error(s, "expected ',' or '}' in an object");
        s->p++;
    }
    *first = 0;
    *done = 0;
    g4_status st = g4_json_string(s, scratch, key, key_len);
    if (st) return st;
    return g4_json_expect(s, ':');
}

g4_status g4_json_next_element(g4_json_scan *s, int *first, int *done) {
    int c = g4_json_peek(s);
    if (c == ']') {
        s->p++;
        *done = 1;
        return G4_OK;
    }
    if (!*first) {
        if (c != ',') return g4_json_error(s, "expected ',' or ']' in an array");
        s->p++;
        if (g4_json_peek(s) == ']') return g4_json_error(s, "trailing ',' in an array");
    }
    *first = 0;
    *done = 0;
    return G4_OK;
}
