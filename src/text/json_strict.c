#include "text/json_strict.h"

#include <stdint.h>

typedef struct {
    const unsigned char *s;
    size_t n, i;
    size_t values, max_values;
    const char *why;
} scanner;

static int fail(scanner *sc, const char *why) {
    sc->why = why;
    return -1;
}

static void skip_ws(scanner *sc) {
    while (sc->i < sc->n && (sc->s[sc->i] == ' ' || sc->s[sc->i] == '\t' || sc->s[sc->i] == '\n' ||
                             sc->s[sc->i] == '\r'))
        sc->i++;
}

static int is_digit(scanner *sc) { return sc->i < sc->n && sc->s[sc->i] >= '0' && sc->s[sc->i] <= '9'; }

/* number = [ "-" ] ( "0" / 1-9 *DIGIT ) [ "." 1*DIGIT ] [ ("e"/"E") ["+"/"-"] 1*DIGIT ] */
static int scan_number(scanner *sc) {
    if (sc->s[sc->i] == '-') sc->i++;
    if (!is_digit(sc)) return fail(sc, "a number needs a digit");
    if (sc->s[sc->i] == '0') {
        sc->i++;
        if (is_digit(sc)) return fail(sc, "a number may not have a leading zero");
    } else {
        while (is_digit(sc)) sc->i++;
    }
    if (sc->i < sc->n && sc->s[sc->i] == '.') {
        sc->i++;
        if (!is_digit(sc)) return fail(sc, "a number needs a digit after '.'");
        while (is_digit(sc)) sc->i++;
    }
    if (sc->i < sc->n && (sc->s[sc->i] == 'e' || sc->s[sc->i] == 'E')) {
        sc->i++;
        if (sc->i < sc->n && (sc->s[sc->i] == '+' || sc->s[sc->i] == '-')) sc->i++;
        if (!is_digit(sc)) return fail(sc, "a number needs a digit in its exponent");
        while (is_digit(sc)) sc->i++;
    }
    return 0;
}

static int hex4(scanner *sc, uint32_t *out) {
    if (sc->n - sc->i < 4) return fail(sc, "\\u needs four hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = sc->s[sc->i + k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(sc, "\\u needs four hex digits");
        v = v * 16 + (uint32_t)d;
    }
    sc->i += 4;
    *out = v;
    return 0;
}

/* After a backslash. */
static int scan_escape(scanner *sc) {
    if (sc->i >= sc->n) return fail(sc, "unfinished escape");
    unsigned char c = sc->s[sc->i++];
    if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') return 0;
    if (c != 'u') return fail(sc, "invalid escape");
    uint32_t cp;
    if (hex4(sc, &cp)) return -1;
    if (cp == 0) return fail(sc, "an escaped NUL (\\u0000) is not supported: the text after it would be lost");
    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(sc, "an unpaired surrogate escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t lo;
        if (sc->n - sc->i < 2 || sc->s[sc->i] != '\\' || sc->s[sc->i + 1] != 'u')
            return fail(sc, "an unpaired surrogate escape");
        sc->i += 2;
        if (hex4(sc, &lo)) return -1;
        if (lo < 0xDC00 || lo > 0xDFFF) return fail(sc, "an unpaired surrogate escape");
    }
    return 0;
}

static int scan_string(scanner *sc) {
    sc->i++; /* the opening quote */
    while (sc->i < sc->n) {
        unsigned char c = sc->s[sc->i];
        if (c == '"') {
            sc->i++;
            return 0;
        }
        if (c < 0x20) return fail(sc, "a control character inside a string");
        sc->i++;
        if (c == '\\' && scan_escape(sc)) return -1;
    }
    return fail(sc, "unterminated string");
}

static int scan_literal(scanner *sc, const char *word, size_t len) {
    if (sc->n - sc->i < len) return fail(sc, "unexpected text");
    for (size_t k = 0; k < len; k++)
        if (sc->s[sc->i + k] != (unsigned char)word[k]) return fail(sc, "unexpected text");
    sc->i += len;
    return 0;
}

/* A scalar (or the opening of a container: *open gets '[' or '{'). */
static int scan_scalar(scanner *sc, unsigned char *open) {
    *open = 0;
    if (++sc->values > sc->max_values) return fail(sc, "too many values");
    if (sc->i >= sc->n) return fail(sc, "a value is missing");
    unsigned char c = sc->s[sc->i];
    if (c == '{' || c == '[') {
        *open = c;
        sc->i++;
        return 0;
    }
    if (c == '"') return scan_string(sc);
    if (c == 't') return scan_literal(sc, "true", 4);
    if (c == 'f') return scan_literal(sc, "false", 5);
    if (c == 'n') return scan_literal(sc, "null", 4);
    if (c == '-' || (c >= '0' && c <= '9')) return scan_number(sc);
    return fail(sc, "unexpected character");
}

/* Iterative: a stack of the open containers, no recursion on hostile depth. */
static int scan(scanner *sc) {
    unsigned char stack[G4_JSON_MAX_DEPTH];
    int depth = 0;
    unsigned char open;
    skip_ws(sc);
    if (scan_scalar(sc, &open)) return -1;
    for (;;) {
        if (open) {
            if (depth == G4_JSON_MAX_DEPTH) return fail(sc, "nested too deeply");
            stack[depth++] = open;
            skip_ws(sc);
            unsigned char close = open == '{' ? '}' : ']';
            if (sc->i < sc->n && sc->s[sc->i] == close) {
                sc->i++;
                depth--;
            } else if (open == '{') {
                if (sc->i >= sc->n || sc->s[sc->i] != '"') return fail(sc, "an object key must be a string");
                if (scan_string(sc)) return -1;
                skip_ws(sc);
                if (sc->i >= sc->n || sc->s[sc->i] != ':') return fail(sc, "':' expected after an object key");
                sc->i++;
                skip_ws(sc);
                if (scan_scalar(sc, &open)) return -1;
                continue;
            } else {
                if (scan_scalar(sc, &open)) return -1;
                continue;
            }
        }
        /* after a complete value: close containers or go on with the next member */
        for (;;) {
            skip_ws(sc);
            if (depth == 0) {
                if (sc->i != sc->n) return fail(sc, "text after the value");
                return 0;
            }
            unsigned char top = stack[depth - 1];
            unsigned char close = top == '{' ? '}' : ']';
            if (sc->i < sc->n && sc->s[sc->i] == close) {
                sc->i++;
                depth--;
                continue;
            }
            if (sc->i >= sc->n || sc->s[sc->i] != ',') return fail(sc, top == '{' ? "',' or '}' expected" : "',' or ']' expected");
            sc->i++;
            skip_ws(sc);
            if (top == '{') {
                if (sc->i >= sc->n || sc->s[sc->i] != '"') return fail(sc, "an object key must be a string");
                if (scan_string(sc)) return -1;
                skip_ws(sc);
                if (sc->i >= sc->n || sc->s[sc->i] != ':') return fail(sc, "':' expected after an object key");
                sc->i++;
                skip_ws(sc);
            }
            if (scan_scalar(sc, &open)) return -1;
            break;
        }
    }
}

int g4_json_check(const char *s, size_t n, size_t max_values, size_t *pos, const char **why) {
    scanner sc = {(const unsigned char *)s, n, 0, 0, max_values, NULL};
    int rc = scan(&sc);
    if (pos) *pos = sc.i;
    if (why) *why = sc.why;
    return rc;
}
