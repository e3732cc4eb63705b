#include "constrain/charclass.h"

#include <stdlib.h>
#include <string.h>

void g4_cc_add(g4_charclass *cc, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (cc->n == cc->cap) {
        int cap = cc->cap ? cc->cap * 2 : 8;
        g4_cp_range *r = realloc(cc->r, (size_t)cap * sizeof *r);
        if (!r) {
            cc->failed = 1;
            return;
        }
        cc->r = r;
        cc->cap = cap;
    }
    cc->r[cc->n].lo = lo;
    cc->r[cc->n].hi = hi;
    cc->n++;
}

static int cmp_range(const void *a, const void *b) {
    const g4_cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

void g4_cc_normalize(g4_charclass *cc) {
    if (cc->n == 0) return;
    qsort(cc->r, (size_t)cc->n, sizeof *cc->r, cmp_range);
    int n = 0;
    for (int i = 0; i < cc->n; i++) {
        if (n && cc->r[i].lo <= cc->r[n - 1].hi + 1) {
            if (cc->r[i].hi > cc->r[n - 1].hi) cc->r[n - 1].hi = cc->r[i].hi;
        } else cc->r[n++] = cc->r[i];
    }
    cc->n = n;
}

void g4_cc_negate(g4_charclass *cc) {
    g4_cc_normalize(cc);
    g4_charclass out = {0};
    uint32_t next = 0;
    for (int i = 0; i < cc->n; i++) {
        if (cc->r[i].lo > next) g4_cc_add(&out, next, cc->r[i].lo - 1);
        next = cc->r[i].hi + 1;
    }
    if (next <= 0x10FFFF) g4_cc_add(&out, next, 0x10FFFF);
    out.failed |= cc->failed;
    free(cc->r);
    *cc = out;
}

void g4_cc_free(g4_charclass *cc) {
    free(cc->r);
    memset(cc, 0, sizeof *cc);
}

int g4_utf8_put(uint32_t cp, unsigned char *o) {
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return o[0] = (unsigned char)(0xC0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 63)), 2;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    if (cp > 0x10FFFF) return 0;
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63));
    o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

int g4_utf8_get(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned c = s[0];
    int len;
    uint32_t v, min;
    if (c < 0x80) return *cp = c, 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, v = c & 31, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, v = c & 15, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, v = c & 7, min = 0x10000;
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 63);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

/* [lo, hi] with the same UTF-8 length -> alternatives of byte-class
 * sequences: split until every byte position is an independent range. */
static void utf8_split(g4_gbuilder *b, int rule, uint32_t lo, uint32_t hi) {
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            utf8_split(b, rule, lo, bounds[i]);
            utf8_split(b, rule, bounds[i] + 1, hi);
            return;
        }
    if (lo <= 0xDFFF && hi >= 0xD800) { /* surrogates have no encoding */
        if (lo < 0xD800) utf8_split(b, rule, lo, 0xD7FF);
        if (hi > 0xDFFF) utf8_split(b, rule, 0xE000, hi);
        return;
    }
    unsigned char a[4], z[4];
    int n = g4_utf8_put(lo, a);
    g4_utf8_put(hi, z);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(b, rule, lo, lo | m);
                utf8_split(b, rule, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(b, rule, lo, (hi & ~m) - 1);
                utf8_split(b, rule, hi & ~m, hi);
                return;
            }
        }
    }
    g4_gseq q = {0};
    for (int i = 0; i < n; i++) {
        g4_byteset s = {{0}};
        g4_byteset_add_range(&s, a[i], z[i]);
        g4_gseq_class(&q, &s, b);
    }
    g4_gb_alt(b, rule, &q);
}

static void json_escape(g4_gseq *q, uint32_t c, g4_gbuilder *b) {
    static const char hex[] = "0123456789abcdef";
    char buf[8];
    switch (c) {
    case '"': g4_gseq_str(q, "\\\"", b); return;
    case '\\': g4_gseq_str(q, "\\\\", b); return;
    case '\b': g4_gseq_str(q, "\\b", b); return;
    case '\f': g4_gseq_str(q, "\\f", b); return;
    case '\n': g4_gseq_str(q, "\\n", b); return;
    case '\r': g4_gseq_str(q, "\\r", b); return;
    case '\t': g4_gseq_str(q, "\\t", b); return;
    default:
        memcpy(buf, "\\u00", 4);
        buf[4] = hex[(c >> 4) & 15];
        buf[5] = hex[c & 15];
        g4_gseq_lit(q, buf, 6, b);
    }
}

static int json_needs_escape(uint32_t c) { return c < 0x20 || c == '"' || c == '\\'; }
static int dsl_refuses(uint32_t c) { return (c < 0x20 && c != '\n' && c != '\t') || c == '<'; }

void g4_cc_literal(g4_gseq *q, uint32_t cp, g4_cc_mode mode, g4_gbuilder *b) {
    if (mode == G4_CC_JSON && json_needs_escape(cp)) {
        json_escape(q, cp, b);
        return;
    }
    unsigned char u[4];
    int n = g4_utf8_put(cp, u);
    if (n == 0) {
        g4_gb_error(b, "U+%04X cannot be written in UTF-8", (unsigned)cp);
        return;
    }
    g4_gseq_lit(q, (const char *)u, (size_t)n, b);
}

int g4_cc_rule(g4_gbuilder *b, const g4_charclass *cc, g4_cc_mode mode) {
    if (cc->failed) {
        g4_gb_error(b, "out of memory");
        return -1;
    }
    int rule = g4_gb_rule(b, "char");
    if (rule < 0) return -1;
    g4_byteset ascii = {{0}};
    int have_ascii = 0;
    for (int i = 0; i < cc->n; i++) {
        uint32_t lo = cc->r[i].lo, hi = cc->r[i].hi;
        for (uint32_t c = lo; c <= hi && c < 0x80; c++) {
            if (mode == G4_CC_JSON && json_needs_escape(c)) {
                g4_gseq q = {0};
                json_escape(&q, c, b);
                g4_gb_alt(b, rule, &q);
            } else if (mode == G4_CC_DSL && dsl_refuses(c)) {
                continue;
            } else {
                g4_byteset_add(&ascii, (int)c);
                have_ascii = 1;
            }
        }
        if (hi >= 0x80) utf8_split(b, rule, lo < 0x80 ? 0x80 : lo, hi);
    }
    if (have_ascii) {
        g4_gseq q = {0};
        g4_gseq_class(&q, &ascii, b);
        g4_gb_alt(b, rule, &q);
    }
    if (!g4_gb_failed(b) && g4_gb_n_alts(b, rule) == 0) return -1;
    return g4_gb_failed(b) ? -1 : rule;
}
