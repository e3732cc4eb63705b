/* GBNF (llama.cpp's grammar syntax) -> grammar.
 *
 *   root ::= "{" ws pair ("," ws pair)* "}"      # comments run to the line end
 *   pair ::= [a-z]+ ":" ( "yes" | "no" ) ws
 *   ws   ::= [ \t\n]{0,4}
 *
 * Terminals are "literals" and [classes] over Unicode characters (escapes
 * \n \r \t \\ \" \] \[ \- \xHH \uHHHH \UHHHHHHHH), . is any character,
 * <[ID]> one token by id; ( ) groups; postfix * + ? {m} {m,} {m,n} {,n}.
 * A rule's definition may span lines; it ends where the next `name ::=`
 * starts. The start rule is `root`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/charclass.h"
#include "constrain/constrain.h"

typedef struct {
    char *name;
    int rule;
    int defined;
} named;

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    g4_gbuilder *b;
    named *names;
    int n_names, cap_names;
    int depth;
    int line;
} gp;

static int gp_fail(gp *p, const char *what) {
    int line = 1;
    for (size_t i = 0; i < p->pos && i < p->n; i++) line += p->s[i] == '\n';
    g4_gb_error(p->b, "gbnf: %s on line %d", what, line);
    return -1;
}

static int is_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static void skip_space(gp *p) {
    while (p->pos < p->n) {
        int c = p->s[p->pos];
        if (c == '#') {
            while (p->pos < p->n && p->s[p->pos] != '\n') p->pos++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->pos++;
        else break;
    }
}

static int peek(const gp *p) { return p->pos < p->n ? p->s[p->pos] : -1; }

/* At `name ::=`? */
static int at_definition(const gp *p) {
    size_t i = p->pos;
    if (i >= p->n || !is_name_char(p->s[i])) return 0;
    while (i < p->n && is_name_char(p->s[i])) i++;
    while (i < p->n && (p->s[i] == ' ' || p->s[i] == '\t')) i++;
    return i + 3 <= p->n && memcmp(p->s + i, "::=", 3) == 0;
}

static int rule_named(gp *p, const char *name, size_t len, int define) {
    for (int i = 0; i < p->n_names; i++)
        if (strlen(p->names[i].name) == len && memcmp(p->names[i].name, name, len) == 0) {
            if (define && p->names[i].defined) return gp_fail(p, "rule defined twice");
            if (define) p->names[i].defined = 1;
            return p->names[i].rule;
        }
    if (p->n_names == p->cap_names) {
        int cap = p->cap_names ? p->cap_names * 2 : 16;
        named *m = realloc(p->names, (size_t)cap * sizeof *m);
        if (!m) return gp_fail(p, "out of memory");
        p->names = m;
        p->cap_names = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return gp_fail(p, "out of memory");
    memcpy(copy, name, len);
    copy[len] = 0;
    int rule = g4_gb_rule(p->b, copy);
    if (rule < 0) {
        free(copy);
        return -1;
    }
    p->names[p->n_names].name = copy;
    p->names[p->n_names].rule = rule;
    p->names[p->n_names++].defined = define;
    return rule;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (escapes decoded); -1 on error. */
static long read_char(gp *p) {
    if (p->pos >= p->n) return gp_fail(p, "unexpected end");
    if (p->s[p->pos] != '\\') {
        uint32_t cp;
        int k = g4_utf8_get(p->s + p->pos, p->n - p->pos, &cp);
        if (k == 0) return gp_fail(p, "invalid UTF-8");
        p->pos += (size_t)k;
        return cp;
    }
    p->pos++;
    int c = peek(p);
    if (c < 0) return gp_fail(p, "trailing backslash");
    p->pos++;
    int digits = 0;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    case '\\': case '"': case '[': case ']': case '-': case '/': case '^': return c;
    default: return gp_fail(p, "unknown escape");
    }
    long v = 0;
    for (int i = 0; i < digits; i++) {
        int h = hexval(peek(p));
        if (h < 0) return gp_fail(p, "bad hex escape");
        v = v * 16 + h;
        p->pos++;
    }
    if (v > 0x10FFFF) return gp_fail(p, "code point beyond U+10FFFF");
    return v;
}

static int parse_alts(gp *p, int rule);

static int parse_atom(gp *p, g4_gseq *q) {
    int c = peek(p);
    if (c == '"') {
        p->pos++;
        while (peek(p) != '"') {
            if (peek(p) < 0) return gp_fail(p, "unterminated string");
            long cp = read_char(p);
            if (cp < 0) return -1;
            g4_cc_literal(q, (uint32_t)cp, G4_CC_RAW, p->b);
        }
        p->pos++;
        return 0;
    }
    if (c == '[' || c == '.') {
        g4_charclass cc = {0};
        if (c == '.') {
            p->pos++;
            g4_cc_add(&cc, 0, 0x10FFFF);
        } else {
            p->pos++;
            int negated = peek(p) == '^';
            if (negated) p->pos++;
            while (peek(p) != ']') {
                if (peek(p) < 0) {
                    g4_cc_free(&cc);
                    return gp_fail(p, "unterminated character class");
                }
                long lo = read_char(p), hi = lo;
                if (lo >= 0 && peek(p) == '-' && p->pos + 1 < p->n && p->s[p->pos + 1] != ']') {
                    p->pos++;
                    hi = read_char(p);
                }
                if (lo < 0 || hi < 0 || hi < lo) {
                    g4_cc_free(&cc);
                    return lo < 0 || hi < 0 ? -1 : gp_fail(p, "bad range in character class");
                }
                g4_cc_add(&cc, (uint32_t)lo, (uint32_t)hi);
            }
            p->pos++;
            if (negated) g4_cc_negate(&cc);
        }
        g4_cc_normalize(&cc);
        int r = g4_cc_rule(p->b, &cc, G4_CC_RAW);
        g4_cc_free(&cc);
        if (r < 0) return g4_gb_failed(p->b) ? -1 : gp_fail(p, "empty character class");
        g4_gseq_rule(q, r);
        return 0;
    }
    if (c == '(') {
        p->pos++;
        if (++p->depth > 64) return gp_fail(p, "groups nested deeper than 64");
        int r = g4_gb_rule(p->b, "group");
        if (r < 0 || parse_alts(p, r) < 0) return -1;
        p->depth--;
        skip_space(p);
        if (peek(p) != ')') return gp_fail(p, "missing ')'");
        p->pos++;
        g4_gseq_rule(q, r);
        return 0;
    }
    if (c == '<' && p->pos + 1 < p->n && p->s[p->pos + 1] == '[') {
        p->pos += 2;
        long id = 0;
        int any = 0;
        while (peek(p) >= '0' && peek(p) <= '9' && id < 100000000) id = id * 10 + (peek(p) - '0'), p->pos++, any = 1;
        if (!any || peek(p) != ']' || p->pos + 1 >= p->n || p->s[p->pos + 1] != '>')
            return gp_fail(p, "bad token reference (write <[ID]>)");
        p->pos += 2;
        g4_gseq_token(q, (int32_t)id);
        return 0;
    }
    if (is_name_char(c)) {
        size_t start = p->pos;
        while (is_name_char(peek(p))) p->pos++;
        int r = rule_named(p, (const char *)p->s + start, p->pos - start, 0);
        if (r < 0) return -1;
        g4_gseq_rule(q, r);
        return 0;
    }
    return gp_fail(p, "unexpected character");
}

static int read_int(gp *p, int *out) {
    int v = 0, any = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        v = v * 10 + (peek(p) - '0');
        if (v > G4_GRAMMAR_MAX_REPEAT) return gp_fail(p, "repetition count too large");
        p->pos++;
        any = 1;
    }
    *out = any ? v : -1;
    return 0;
}

static int parse_seq(gp *p, g4_gseq *seq) {
    for (;;) {
        skip_space(p);
        int c = peek(p);
        if (c < 0 || c == '|' || c == ')' || at_definition(p)) return 0;
        g4_gseq atom = {0};
        if (parse_atom(p, &atom) < 0) {
            g4_gseq_free(&atom);
            return -1;
        }
        c = peek(p);
        int min = -1, max = -1;
        if (c == '*') min = 0, max = -1, p->pos++;
        else if (c == '+') min = 1, max = -1, p->pos++;
        else if (c == '?') min = 0, max = 1, p->pos++;
        else if (c == '{') {
            p->pos++;
            int a, z = -1;
            if (read_int(p, &a) < 0) return -1;
            if (peek(p) == ',') {
                p->pos++;
                if (read_int(p, &z) < 0) return -1;
            } else z = a;
            if (peek(p) != '}' || (a < 0 && z < 0)) {
                g4_gseq_free(&atom);
                return gp_fail(p, "bad repetition");
            }
            p->pos++;
            min = a < 0 ? 0 : a, max = z;
            if (max >= 0 && max < min) {
                g4_gseq_free(&atom);
                return gp_fail(p, "bad repetition range");
            }
        }
        if (min < 0) {
            for (int i = 0; i < atom.n && !seq->failed; i++) {
                if (seq->n == seq->cap) {
                    int cap = seq->cap ? seq->cap * 2 : 8;
                    g4_gelem *e = realloc(seq->e, (size_t)cap * sizeof *e);
                    if (!e) {
                        seq->failed = 1;
                        break;
                    }
                    seq->e = e;
                    seq->cap = cap;
                }
                seq->e[seq->n++] = atom.e[i];
            }
            g4_gseq_free(&atom);
            continue;
        }
        int x = g4_gb_seq_rule(p->b, "item", &atom);
        int rep = min == 0 && max == -1 ? g4_gb_star(p->b, x)
                  : min == 1 && max == -1 ? g4_gb_plus(p->b, x)
                  : min == 0 && max == 1  ? g4_gb_opt(p->b, x)
                                          : g4_gb_repeat(p->b, x, min, max);
        if (rep < 0) return -1;
        g4_gseq_rule(seq, rep);
    }
}

static int parse_alts(gp *p, int rule) {
    for (;;) {
        g4_gseq seq = {0};
        if (parse_seq(p, &seq) < 0) {
            g4_gseq_free(&seq);
            return -1;
        }
        g4_gb_alt(p->b, rule, &seq);
        if (g4_gb_failed(p->b)) return -1;
        skip_space(p);
        if (peek(p) != '|') return 0;
        p->pos++;
    }
}

int g4_gbnf_rule(g4_gbuilder *b, const char *text, size_t len) {
    gp p = {(const unsigned char *)text, len, 0, b, NULL, 0, 0, 0, 0};
    int root = -1, st = 0;
    for (;;) {
        skip_space(&p);
        if (p.pos >= p.n) break;
        if (!at_definition(&p)) {
            st = gp_fail(&p, "expected `name ::=`");
            break;
        }
        size_t start = p.pos;
        while (is_name_char(peek(&p))) p.pos++;
        int rule = rule_named(&p, text + start, p.pos - start, 1);
        if (rule < 0) {
            st = -1;
            break;
        }
        skip_space(&p);
        p.pos += 3; /* ::= */
        if (parse_alts(&p, rule) < 0) {
            st = -1;
            break;
        }
    }
    for (int i = 0; i < p.n_names && st == 0; i++) {
        if (!p.names[i].defined) {
            g4_gb_error(b, "gbnf: undefined rule '%s'", p.names[i].name);
            st = -1;
        }
        if (strcmp(p.names[i].name, "root") == 0) root = p.names[i].rule;
    }
    if (st == 0 && root < 0) {
        g4_gb_error(b, "gbnf: no `root` rule");
        st = -1;
    }
    for (int i = 0; i < p.n_names; i++) free(p.names[i].name);
    free(p.names);
    return st < 0 ? -1 : root;
}
