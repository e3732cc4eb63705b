/* A regex subset -> grammar rules.
 *
 * Supported (Python `re` meaning): literals (UTF-8), escapes \. \\ \n \t \r
 * \f \v \xHH \uHHHH and escaped punctuation, classes [...] / [^...] with
 * ranges, . (any character but \n), \d \w \s and \D \W \S (ASCII sets, so
 * that what we produce also matches Python's Unicode-aware classes),
 * groups (...), (?:...), (?P<name>...), alternation |, quantifiers * + ?
 * {n} {n,} {n,m} (a lazy suffix ? is accepted: it does not change the
 * language), anchors ^ and $ at the start / end of a top-level alternative.
 * Refused with an error naming it: backreferences, lookaround, word
 * boundaries, flags, possessive quantifiers, anchors elsewhere. */
#include "constrain/regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    g4_gbuilder *b;
    g4_cc_mode mode;
    int depth;
} rx;

static int rx_fail(rx *r, const char *what) {
    g4_gb_error(r->b, "regex: %s at offset %zu", what, r->pos);
    return -1;
}

static int peek(const rx *r) { return r->pos < r->n ? r->s[r->pos] : -1; }

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void add_shorthand(g4_charclass *cc, int c) {
    switch (c) {
    case 'd': g4_cc_add(cc, '0', '9'); break;
    case 'w':
        g4_cc_add(cc, '0', '9');
        g4_cc_add(cc, 'A', 'Z');
        g4_cc_add(cc, 'a', 'z');
        g4_cc_add(cc, '_', '_');
        break;
    case 's':
        g4_cc_add(cc, ' ', ' ');
        g4_cc_add(cc, '\t', '\r'); /* \t \n \v \f \r */
        break;
    }
}

/* An ASCII-only complement of a shorthand (\D \W \S). */
static void add_neg_shorthand(g4_charclass *cc, int c) {
    g4_charclass t = {0};
    add_shorthand(&t, c);
    g4_cc_negate(&t);
    for (int i = 0; i < t.n; i++)
        if (t.r[i].lo < 0x80) g4_cc_add(cc, t.r[i].lo, t.r[i].hi < 0x7F ? t.r[i].hi : 0x7F);
    g4_cc_free(&t);
}

/* One escaped character after '\' (not a shorthand): its code point, or -1. */
static long read_escape_char(rx *r) {
    int c = peek(r);
    if (c < 0) return rx_fail(r, "trailing backslash");
    r->pos++;
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return 7;
    case '0': return 0;
    case 'x':
    case 'u': {
        int digits = c == 'x' ? 2 : 4;
        long v = 0;
        for (int i = 0; i < digits; i++) {
            int h = hexval(peek(r));
            if (h < 0) return rx_fail(r, "bad \\x or \\u escape");
            v = v * 16 + h;
            r->pos++;
        }
        return v;
    }
    }
    if (c >= '1' && c <= '9') return rx_fail(r, "backreferences are not supported");
    if (c == 'b' || c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G')
        return rx_fail(r, "anchors and word boundaries (\\b \\B \\A \\Z) are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return rx_fail(r, "unknown escape");
    return c; /* escaped punctuation or a byte >= 0x80 (read as a literal below) */
}

static long read_literal(rx *r) {
    uint32_t cp;
    int k = g4_utf8_get(r->s + r->pos, r->n - r->pos, &cp);
    if (k == 0) return rx_fail(r, "invalid UTF-8");
    r->pos += (size_t)k;
    return cp;
}

/* [...] after the '[' */
static int parse_class(rx *r) {
    g4_charclass cc = {0};
    int negated = 0, shorthand = 0, first = 1;
    if (peek(r) == '^') negated = 1, r->pos++;
    for (;;) {
        int c = peek(r);
        if (c < 0) {
            g4_cc_free(&cc);
            return rx_fail(r, "unterminated character class");
        }
        if (c == ']' && !first) {
            r->pos++;
            break;
        }
        first = 0;
        long lo;
        if (c == '\\') {
            r->pos++;
            int e = peek(r);
            if (e == 'd' || e == 'w' || e == 's') {
                r->pos++;
                add_shorthand(&cc, e);
                shorthand = 1;
                continue;
            }
            if (e == 'D' || e == 'W' || e == 'S') {
                r->pos++;
                add_neg_shorthand(&cc, e + 32);
                shorthand = 1;
                continue;
            }
            if (e == 'b') {
                r->pos++;
                lo = 8;
            } else lo = read_escape_char(r);
        } else lo = read_literal(r);
        if (lo < 0) {
            g4_cc_free(&cc);
            return -1;
        }
        long hi = lo;
        if (peek(r) == '-' && r->pos + 1 < r->n && r->s[r->pos + 1] != ']') {
            r->pos++;
            if (peek(r) == '\\') {
                r->pos++;
                hi = read_escape_char(r);
            } else hi = read_literal(r);
            if (hi < 0) {
                g4_cc_free(&cc);
                return -1;
            }
            if (hi < lo) {
                g4_cc_free(&cc);
                return rx_fail(r, "bad range in character class");
            }
        }
        g4_cc_add(&cc, (uint32_t)lo, (uint32_t)hi);
    }
    if (negated) {
        g4_cc_negate(&cc);
        if (shorthand) { /* keep to ASCII: Python's \d \w \s also match other scripts */
            g4_charclass a = {0};
            for (int i = 0; i < cc.n; i++)
                if (cc.r[i].lo < 0x80) g4_cc_add(&a, cc.r[i].lo, cc.r[i].hi < 0x7F ? cc.r[i].hi : 0x7F);
            g4_cc_free(&cc);
            cc = a;
        }
    }
    g4_cc_normalize(&cc);
    int rule = g4_cc_rule(r->b, &cc, r->mode);
    g4_cc_free(&cc);
    if (rule < 0 && !g4_gb_failed(r->b)) return rx_fail(r, "a character class matches nothing here");
    return rule;
}

static int parse_alt(rx *r);

/* One atom into q (elements); returns 0, or -1. */
static int parse_atom(rx *r, g4_gseq *q) {
    int c = peek(r);
    if (c == '(') {
        r->pos++;
        if (peek(r) == '?') {
            r->pos++;
            int k = peek(r);
            if (k == ':') r->pos++;
            else if (k == 'P' && r->pos + 1 < r->n && r->s[r->pos + 1] == '<') {
                while (r->pos < r->n && r->s[r->pos] != '>') r->pos++;
                if (peek(r) != '>') return rx_fail(r, "unterminated group name");
                r->pos++;
            } else return rx_fail(r, "lookaround, flags and other (?...) groups are not supported");
        }
        if (++r->depth > 64) return rx_fail(r, "groups nested deeper than 64");
        int rule = parse_alt(r);
        r->depth--;
        if (rule < 0) return -1;
        if (peek(r) != ')') return rx_fail(r, "missing ')'");
        r->pos++;
        g4_gseq_rule(q, rule);
        return 0;
    }
    if (c == '[') {
        r->pos++;
        int rule = parse_class(r);
        if (rule < 0) return -1;
        g4_gseq_rule(q, rule);
        return 0;
    }
    if (c == '.') {
        r->pos++;
        g4_charclass cc = {0};
        g4_cc_add(&cc, 0, '\n' - 1);
        g4_cc_add(&cc, '\n' + 1, 0x10FFFF);
        int rule = g4_cc_rule(r->b, &cc, r->mode);
        g4_cc_free(&cc);
        if (rule < 0) return -1;
        g4_gseq_rule(q, rule);
        return 0;
    }
    if (c == '^' || c == '$') return rx_fail(r, "anchors are supported only at the start / end of the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_fail(r, "nothing to repeat");
    long cp;
    if (c == '\\') {
        r->pos++;
        int e = peek(r);
        if (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S') {
            r->pos++;
            g4_charclass cc = {0};
            if (e >= 'a') add_shorthand(&cc, e);
            else add_neg_shorthand(&cc, e + 32);
            g4_cc_normalize(&cc);
            int rule = g4_cc_rule(r->b, &cc, r->mode);
            g4_cc_free(&cc);
            if (rule < 0) return g4_gb_failed(r->b) ? -1 : rx_fail(r, "a character class matches nothing here");
            g4_gseq_rule(q, rule);
            return 0;
        }
        cp = read_escape_char(r);
    } else cp = read_literal(r);
    if (cp < 0) return -1;
    if (r->mode == G4_CC_DSL && (cp == '<' || (cp < 0x20 && cp != '\n' && cp != '\t')))
        return rx_fail(r, "this character cannot appear in a tool-call string");
    g4_cc_literal(q, (uint32_t)cp, r->mode, r->b);
    return 0;
}

static int read_count(rx *r, int *out) {
    int v = 0, any = 0;
    while (peek(r) >= '0' && peek(r) <= '9') {
        v = v * 10 + (peek(r) - '0');
        if (v > G4_GRAMMAR_MAX_REPEAT) return rx_fail(r, "repetition count too large");
        r->pos++;
        any = 1;
    }
    *out = any ? v : -1;
    return 0;
}

/* A sequence up to '|', ')' or the end, as a new rule. */
static int parse_seq(rx *r, int top, int *anchored_end) {
    g4_gseq seq = {0};
    for (;;) {
        int c = peek(r);
        if (c < 0 || c == '|' || c == ')') break;
        if (top && c == '$' && (r->pos + 1 == r->n || r->s[r->pos + 1] == '|')) {
            r->pos++;
            *anchored_end = 1;
            break;
        }
        g4_gseq atom = {0};
        if (parse_atom(r, &atom) < 0) {
            g4_gseq_free(&atom);
            g4_gseq_free(&seq);
            return -1;
        }
        int q = peek(r), min = -1, max = -1;
        if (q == '*') min = 0, max = -1;
        else if (q == '+') min = 1, max = -1;
        else if (q == '?') min = 0, max = 1;
        else if (q == '{') {
            size_t save = r->pos;
            r->pos++;
            int a, z;
            read_count(r, &a);
            if (a >= 0 && peek(r) == '}') min = max = a;
            else if (a >= 0 && peek(r) == ',') {
                r->pos++;
                read_count(r, &z);
                if (peek(r) == '}') min = a, max = z;
            }
            if (min < 0) { /* not a quantifier: '{' is a literal, as in Python */
                r->pos = save;
                q = 0;
            } else if (max >= 0 && max < min) {
                g4_gseq_free(&atom);
                g4_gseq_free(&seq);
                return rx_fail(r, "bad repetition range");
            }
            if (g4_gb_failed(r->b)) {
                g4_gseq_free(&atom);
                g4_gseq_free(&seq);
                return -1;
            }
        } else q = 0;
        if (q) {
            r->pos++;
            if (peek(r) == '?') r->pos++;
            else if (peek(r) == '+') {
                g4_gseq_free(&atom);
                g4_gseq_free(&seq);
                return rx_fail(r, "possessive quantifiers are not supported");
            }
            int x = g4_gb_seq_rule(r->b, "rx", &atom);
            int rep = min == 0 && max == -1 ? g4_gb_star(r->b, x)
                      : min == 1 && max == -1 ? g4_gb_plus(r->b, x)
                      : min == 0 && max == 1  ? g4_gb_opt(r->b, x)
                                              : g4_gb_repeat(r->b, x, min, max);
            if (rep < 0) {
                g4_gseq_free(&seq);
                return -1;
            }
            g4_gseq_rule(&seq, rep);
        } else {
            for (int i = 0; i < atom.n; i++) {
                if (atom.e[i].kind == G4_GE_RULE) g4_gseq_rule(&seq, atom.e[i].arg);
                else if (atom.e[i].kind == G4_GE_TOKEN) g4_gseq_token(&seq, atom.e[i].arg);
                else {
                    g4_gseq one = {0};
                    (void)one;
                    if (seq.n == seq.cap) {
                        int cap = seq.cap ? seq.cap * 2 : 8;
                        g4_gelem *e = realloc(seq.e, (size_t)cap * sizeof *e);
                        if (!e) seq.failed = 1;
                        else seq.e = e, seq.cap = cap;
                    }
                    if (!seq.failed) seq.e[seq.n++] = atom.e[i];
                }
            }
            g4_gseq_free(&atom);
        }
    }
    return g4_gb_seq_rule(r->b, "rxseq", &seq);
}

/* Inside groups: alternatives of sequences. */
static int parse_alt(rx *r) {
    int rule = g4_gb_rule(r->b, "rxalt");
    if (rule < 0) return -1;
    for (;;) {
        int dummy = 0;
        int s = parse_seq(r, 0, &dummy);
        if (s < 0) return -1;
        g4_gseq q = {0};
        g4_gseq_rule(&q, s);
        g4_gb_alt(r->b, rule, &q);
        if (peek(r) != '|') break;
        r->pos++;
    }
    return rule;
}

int g4_regex_rule(g4_gbuilder *b, const char *re, size_t n, g4_cc_mode mode, int search) {
    rx r = {(const unsigned char *)re, n, 0, b, mode, 0};
    int rule = g4_gb_rule(b, "regex");
    if (rule < 0) return -1;
    int any_star = -1;
    if (search) {
        g4_charclass cc = {0};
        g4_cc_add(&cc, 0, 0x10FFFF);
        int any = g4_cc_rule(b, &cc, mode);
        g4_cc_free(&cc);
        any_star = g4_gb_star(b, any);
        if (any_star < 0) return -1;
    }
    for (;;) {
        int start_anchor = 0, end_anchor = 0;
        if (peek(&r) == '^') r.pos++, start_anchor = 1;
        int s = parse_seq(&r, 1, &end_anchor);
        if (s < 0) return -1;
        g4_gseq q = {0};
        if (search && !start_anchor) g4_gseq_rule(&q, any_star);
        g4_gseq_rule(&q, s);
        if (search && !end_anchor) g4_gseq_rule(&q, any_star);
        g4_gb_alt(b, rule, &q);
        if (peek(&r) == '|') {
            r.pos++;
            continue;
        }
        if (peek(&r) == ')') return rx_fail(&r, "unbalanced ')'");
        break;
    }
    return g4_gb_failed(b) ? -1 : rule;
}
